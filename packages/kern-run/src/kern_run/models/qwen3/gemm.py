"""The projection ops of the prefill program and of the cuBLASLt decode (`--decode gemm`): which op an (n, k)
projection calls, declared on first use. Row-major C[m, n] = A[m, k] @ W[n, k]^T through
`extern:cublaslt_bf16_tn`, or kern_gemv_rows at M = 1 (`--m1-gemv`); with `--batch-invariant` every decode
projection on one pinned algorithm for every decode bucket (its invariant decode pin, split-K allowed, when the
pins file has one; else its prefill pin)."""

from __future__ import annotations

from typing import Any

from ...errors import ManifestBuildError
from .builder import Builder, call, int_arg, ptr
from .gemv import rows_launch
from .options import Plan
from .pins import INVARIANT_DECODE_M_MAX
from .skinny import SKINNY_M_MAX, SKINNY_THREADS, skinny_geometry

_GEMM_ARGS = ("a", "w", "c")
# the fixed state of the skinny GEMM's tickets (two u32 a tile, zero at load and after every launch), shared by its
# ops: they run one after another
SKINNY_TICKETS = "skinny_tickets"


def _cublaslt(**extra: Any) -> dict[str, Any]:
    """One cuBLASLt launch of the (a, w, c, m, n, k) interface; `extra`: `when`, `algo`."""
    return {"extern": "cublaslt_bf16_tn",
            "args": [{"arg": "a"}, {"arg": "w"}, {"arg": "c"}, {"arg": "m", "type": "i64"},
                     {"arg": "n", "type": "i64"}, {"arg": "k", "type": "i64"}], **extra}


def _interface() -> list[dict[str, str]]:
    return [*(ptr(a) for a in _GEMM_ARGS), int_arg("m"), int_arg("n"), int_arg("k")]


class Projections:
    """Names (and declares in the Builder) the op of each projection shape; the pins come from the plan."""

    def __init__(self, b: Builder, plan: Plan) -> None:
        self.b, self.opts = b, plan.opts
        self.pins = {(n, k): dict(algo) for n, k, algo in plan.opts.algos}
        self.decode_pins = {(n, k): dict(algo) for n, k, algo in plan.opts.decode_algos}
        # invariant decode pins (split-K allowed), proven up to M = 64: used only when no decode bucket exceeds that
        fits = plan.opts.seqs_max <= INVARIANT_DECODE_M_MAX
        self.invariant_decode_pins = {(n, k): dict(algo) for n, k, algo in plan.opts.invariant_decode_algos
                                      if fits}
        # `--batch-invariant`: "<n>x<k>" of the decode projections pinned from decode_pins (not proven across M),
        # from invariant_decode_pins, and from the prefill pins (meta.caller.decode_batch_invariant_*)
        self.unproven: list[str] = []
        self.on_invariant_decode: list[str] = []
        self.on_prefill: list[str] = []
        self.on_skinny: list[str] = []  # "<n>x<k>[_swiglu]" of the decode shapes on kern_gemm_skinny

    def decode_skinny(self, decode: bool) -> bool:
        """Whether the decode's layer projections run kern_gemm_skinny (`--invariant-proj skinny`; the lm_head stays
        on its pin)."""
        return decode and self.opts.batch_invariant and self.opts.invariant_proj == "skinny"

    def call(self, n: int, k: int, decode: bool, *, a: str, w: str, c: str, swiglu: bool = False) -> dict[str, Any]:
        """The program call of a layer's (n, k) projection c = a @ w^T over `tokens` rows; `swiglu` (skinny
        decode only, see decode_skinny): w is gate_up [2 inter, k] and c = act = silu(gate) * up."""
        if self.decode_skinny(decode):
            return call(self._skinny(n, k, swiglu), a=a, w=w, c=c, tickets=SKINNY_TICKETS, m="tokens", n=n, k=k)
        assert not swiglu, "only the skinny decode fuses the SiLU-mul"  # a bug in the caller
        return call(self.op(n, k, decode), a=a, w=w, c=c, m="tokens", n=n, k=k)

    def _skinny(self, n: int, k: int, swiglu: bool) -> str:
        """`gemm_sk_<n>x<k>[_swiglu]`: kern_gemm_skinny_n128 on the Stream-K grid of the target's SMs at tokens 1 ..
        min(64, chunk_max) (every decode bucket: seqs_max <= 64, checked by validate), its partials in op scratch
        `ws`, its tickets in SKINNY_TICKETS. Above that (where the decode never runs, but every token count needs
        a launch) cuBLASLt on the prefill pin when the shape has one, else the heuristic; with swiglu into scratch
        `gate_up`, then kern_silu_mul into c."""
        name = f"gemm_sk_{n}x{k}" + ("_swiglu" if swiglu else "")
        if name in self.b.ops:
            return name
        geo = skinny_geometry(n, k, self.opts.sms, swiglu)
        launch = self.b.launch(geo.entry, [geo.blocks, 1, 1], [SKINNY_THREADS, 1, 1],
                               [{"arg": "a"}, {"arg": "w"}, {"arg": "c"}, {"scratch": "ws"}, {"arg": "tickets"},
                                {"arg": "m", "type": "i32"}, {"arg": "n", "type": "i32"}, {"arg": "k", "type": "i32"},
                                {"i32": int(swiglu)}],
                               shared_mem=geo.shared_mem, pdl=self.opts.pdl)
        launches = [launch]
        scratch = {"ws": str(geo.ws_bytes)}
        top = min(SKINNY_M_MAX, self.opts.chunk_max)
        if self.opts.chunk_max > top:
            launch["when"] = {"tokens": [1, top]}
            rest = {"tokens": [top + 1, self.opts.chunk_max]}
            algo = {"algo": self.pins[(n, k)]} if (n, k) in self.pins else {}
            blas = _cublaslt(when=rest, **algo)
            if swiglu:
                blas["args"][2] = {"scratch": "gate_up"}
                scratch["gate_up"] = f"tokens * {2 * n}"
                launches += [blas, {**self.b.launch("kern_silu_mul", ["tokens", -(-(n // 2) // 1024), 1],
                                                    [256, 1, 1], [{"scratch": "gate_up"}, {"arg": "c"},
                                                                  {"expr": "tokens", "type": "i32"},
                                                                  {"i32": n // 2}],
                                                    pdl=self.opts.pdl_small_launches), "when": rest}]
            else:
                launches.append(blas)
        self.b.op(name, [ptr("a"), ptr("w"), ptr("c"), ptr("tickets"), int_arg("m"), int_arg("n"), int_arg("k")],
                  launches, scratch=scratch)
        self.on_skinny.append(name.removeprefix("gemm_sk_"))
        state = self.b.states.get(SKINNY_TICKETS, {"kind": "fixed", "bytes": 0})
        self.b.states[SKINNY_TICKETS] = {"kind": "fixed", "bytes": max(state["bytes"], 4 * geo.tickets)}
        return name

    def op(self, n: int, k: int, decode: bool = False) -> str:
        """The op of an (n, k) projection. Prefill: `gemm_<n>x<k>` with the pinned batch-invariant algorithm for
        every M (tools/pick_algos.py; what lets a cached prefix resume at any token). Decode (M = 1, nothing
        cached from it): `gemm_m1_<n>x<k>` with the fastest M = 1 algorithm (split-K allowed) when the pins
        file has one - a prefill pin (no split-K) is 1.9x slower there (measured: 4B `--decode gemm` 6.98 vs
        3.66 ms/token). Otherwise `gemm`: cuBLASLt's heuristic per M."""
        if decode and self.opts.m1_gemv:
            return self._gemv_m1(n, k)
        if decode and self.opts.batch_invariant:
            return self._invariant(n, k)
        table, prefix = (self.decode_pins, "gemm_m1") if decode else (self.pins, "gemm")
        name = f"{prefix}_{n}x{k}" if (n, k) in table else "gemm"
        if name not in self.b.ops:
            self.b.op(name, _interface(), self._launches(table, n, k, decode))
        return name

    def _launches(self, table: dict[tuple[int, int], dict[str, int]], n: int, k: int,
                  decode: bool) -> list[dict[str, Any]]:
        if (n, k) not in table:
            return [_cublaslt()]
        if not decode:
            return [_cublaslt(algo=table[(n, k)])]
        # the decode program runs at tokens = 1 only; the rest of the tokens range stays on the heuristic, so the
        # M = 1 pin (split-K: workspace grows with M) is checked at load where it is used
        launches = [_cublaslt(when={"tokens": [1, 1]}, algo=table[(n, k)])]
        if self.opts.chunk_max > 1:
            launches.append(_cublaslt(when={"tokens": [2, self.opts.chunk_max]}))
        return launches

    def _gemv_m1(self, n: int, k: int) -> str:
        """`--m1-gemv`: the decode projection (n, k) as `gemv_m1_<n>x<k>`, kern_gemv_rows at tokens = 1 (c = W a,
        docs/kernels-gemv.md "Rows entries") and cuBLASLt's heuristic for the rest of the tokens range (never
        used by the decode program, which runs at tokens = 1)."""
        name = f"gemv_m1_{n}x{k}"
        if name not in self.b.ops:
            gemv = rows_launch(self.b, "kern_gemv_rows", -(-n // 4), k,
                               [{"arg": "w"}, {"arg": "a"}, {"arg": "c"}, {"i32": n}, {"i32": k}], self.opts)
            launches = [{**gemv, "when": {"tokens": [1, 1]}}]
            if self.opts.chunk_max > 1:
                launches.append(_cublaslt(when={"tokens": [2, self.opts.chunk_max]}))
            self.b.op(name, _interface(), launches)
        return name

    def _invariant(self, n: int, k: int) -> str:
        """`--batch-invariant`: the decode projection (n, k) on one pinned algorithm at every M. A shape with an
        invariant decode pin (`invariant_decode_pins`: split-K allowed, proven by tools/pick_algos.py
        --invariant-decode to give every row the same bits at M = 1 .. 64) runs it at every decode bucket
        (`_invariant_decode`; listed in `on_invariant_decode`). Else a shape the pins file pins for prefill
        (`pins`: no split-K, proven by tools/pick_algos.py to give every row the same bits at M = 1 .. m_max;
        listed in `on_prefill`) calls that prefill op `gemm_<n>x<k>` itself, so a decode row is computed exactly
        as a prefill row. Else (the lm_head, until pick_algos --lm-head has pinned it) `gemm_<n>x<k>` with its
        `decode_pins` pin when that pin has no split-K and no reduction scheme: the class of configuration
        pick_algos found row-invariant in every case it tried, but not proven for this shape (listed in
        `unproven`, and meta.caller.decode_batch_invariant_unproven). Raises ManifestBuildError for a shape
        with neither."""
        if (n, k) in self.invariant_decode_pins:
            return self._invariant_decode(n, k)
        if (n, k) in self.pins:
            if f"{n}x{k}" not in self.on_prefill:
                self.on_prefill.append(f"{n}x{k}")
            return self.op(n, k)
        pin = self.decode_pins.get((n, k))
        if pin is None or pin.get("split_k", 1) > 1 or pin.get("reduction", 0):
            why = ("no --algos given" if not (self.pins or self.decode_pins) else
                   "the pins file pins it neither for prefill nor, without split-K, for decode")
            raise ManifestBuildError(f"batch_invariant (--batch-invariant): the decode projection {n}x{k} has no "
                                     f"batch-invariant cuBLASLt pin ({why}); pass --algos with one, e.g. from "
                                     "tools/pick_algos.py --lm-head")
        name = f"gemm_{n}x{k}"
        if name not in self.b.ops:
            self.b.op(name, _interface(), [_cublaslt(algo=pin)])
            self.unproven.append(f"{n}x{k}")
        return name

    def _invariant_decode(self, n: int, k: int) -> str:
        """`gemm_inv_<n>x<k>`: the invariant decode pin at tokens 1 .. min(64, chunk_max) (every decode bucket: the
        decode runs at tokens = seqs <= seqs_max <= 64); above, where the decode never runs, the prefill pin when
        the shape has one (else the heuristic), so the load-time check of the split-K pin (its workspace grows with
        M) stays inside the M it was proven and sized for."""
        name = f"gemm_inv_{n}x{k}"
        if name not in self.b.ops:
            top = min(INVARIANT_DECODE_M_MAX, self.opts.chunk_max)
            pin = self.invariant_decode_pins[(n, k)]
            if self.opts.chunk_max == top:
                launches = [_cublaslt(algo=pin)]
            else:
                rest = {"algo": self.pins[(n, k)]} if (n, k) in self.pins else {}
                launches = [_cublaslt(when={"tokens": [1, top]}, algo=pin),
                            _cublaslt(when={"tokens": [top + 1, self.opts.chunk_max]}, **rest)]
            self.b.op(name, _interface(), launches)
            self.on_invariant_decode.append(f"{n}x{k}")
        return name
