"""A fake runtime for the batched engine (serve/runtime_engine.py): the caller contract's buffers at var max,
`write_input` with the real prefix-of-rows semantics (later rows keep their bytes), and a "model" whose token
depends on everything the engine must get right per row.

The manifest: the qwen3 builder's at seqs max 64 (`--gemv v2`, the GPU sampler: `batched_manifest`). The runtime
executes kern_pool plans on its KV store, so it is also `PoolMemory`'s executor.

A decode step at bucket B checks every row b < B: a padding row must be all scratch (block-table row of
zeros, so its slot p % page_tokens lies in page 0, seq_len p + 1: position 0 as the host writes it, or further on
as the device advanced it); a live row's slot must follow from its block-table row and its seq_len from its
position. Like the manifest's decode_advance, it then writes the next step's token, position, seq_len and slot of
every row of the bucket itself (so an engine that skips writing them when they are right is checked too) and the
token ring entry ring[b, (p + 1) % ring_len]. With `steps`, the runtime is also `DeviceSteps`: `record_event` and
`host_array` (the ring, a live view); `log` lists issues, events recorded, waited and released, and readbacks in
order (the fake runs each program when it is issued, so the order of the log is what an engine enqueued and read). Row b's token is a hash of the ids its block table reads back at positions
0..position, mixed with its sampling params row (temperature, seed, position) and, when it penalizes, with
its history row; so a wrong page, stale params or a stale history changes the output. The step then appends
the token to every row's history (padding rows too), as kern_sample_history_append does, and packs
(token, logprob) into next_token.
"""

from __future__ import annotations

import copy
import hashlib
import struct
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from kern_manifest import parse_manifest, var_max

import kern_pool
from kern_run.generate import slot_mapping
from kern_run.preflight import ManifestFacts

VOCAB = 997
TOP_N = 20


def manifest_dict(hist_cap: int = 64, seqs_max: int = 64, sampling: bool = True, top_program: bool = True,
                  kernels: Any = None) -> dict[str, Any]:
    """The tiny shape's manifest (JSON object) from the qwen3 builder at seqs max `seqs_max` (`--gemv v2`); with
    `sampling`, the GPU sampler (`--sampler gpu --hist-cap hist_cap`), else the argmax decode (`--sampler
    argmax`)."""
    import tempfile
    from pathlib import Path

    from kern_run.models import qwen3
    from tests.run.kern_run_testutil import stub_kernels
    from tools import make_checkpoint

    if kernels is None:
        kernels = stub_kernels(Path(tempfile.mkdtemp(prefix="kern-stub-")))
    cfg_json = make_checkpoint.config_json(make_checkpoint.SHAPES["tiny"])
    cfg_json["tie_word_embeddings"] = True  # as tests/run's tiny checkpoint
    cfg = qwen3.Qwen3Config.from_json(cfg_json)
    options = qwen3.BuildOptions("tiny-b64", 64, 1024, seqs_max=seqs_max, gemv="v2" if seqs_max > 1 else "v1",
                                 sampler="gpu" if sampling else "argmax", hist_cap=hist_cap)
    m = copy.deepcopy(qwen3.build_manifest(cfg, qwen3.read_kernel_abi(kernels), options))
    assert ("sampling" in m["meta"]["caller"]) == sampling
    if sampling and not top_program:
        m["meta"]["caller"]["sampling"].pop("top_logprobs")
    return m


def batched_manifest(hist_cap: int = 64, seqs_max: int = 64, sampling: bool = True) -> Any:
    """`manifest_dict` parsed (a kern_manifest.Manifest)."""
    return parse_manifest(manifest_dict(hist_cap, seqs_max, sampling))


def facts_of(manifest: Any) -> ManifestFacts:
    at_max = var_max(manifest.vars)
    pages_per_seq = manifest.buffers["block_table"].shape_at(at_max)[-1]
    advance = manifest.meta["caller"].get("decode_advance") if manifest.meta else None
    return ManifestFacts(manifest, manifest.vars["tokens"].max, 16, pages_per_seq, True, advance)


def _mix(*values: int) -> int:
    h = hashlib.blake2b(struct.pack(f"<{len(values)}q", *values), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 62) - 1)


def history_state(ids: Sequence[int], cap: int) -> tuple[tuple[int, int], ...]:
    """The first `cap` distinct ids of `ids` (first-occurrence order) with their counts over all of `ids`: what
    a row's history holds after the engine seeded it and the device appended the rest."""
    counts: dict[int, int] = {}
    for t in ids:
        if t in counts:
            counts[t] += 1
        elif len(counts) < cap:
            counts[t] = 1
    return tuple(counts.items())


def model_token(ids: Sequence[int], params: Sequence[float | int], history: tuple[tuple[int, int], ...] | None
                ) -> tuple[int, float]:
    """(token, logprob) after the sequence `ids` under the params row `params` (temperature, top_k, top_p, min_p,
    repetition, presence, frequency, _, seed_lo, seed_hi, _, _) and `history` (used when a penalty is on)."""
    h = 0
    for t in ids:
        h = _mix(h, t)
    temperature, top_k, top_p, min_p, rep, pres, freq = params[:7]
    seed = int(params[8]) | (int(params[9]) << 32)
    if temperature != 0:
        h = _mix(h, seed & ((1 << 62) - 1), len(ids), int(temperature * 1000), top_k, int(top_p * 1000))
    if rep != 1 or pres != 0 or freq != 0:
        assert history is not None
        h = _mix(h, *[v for pair in sorted(history) for v in pair])
    return h % VOCAB, -((h >> 20) % 5000) / 1000.0


def unpack_params(row: np.ndarray) -> tuple:
    return struct.unpack("<fifffffiIIII", np.ascontiguousarray(row).tobytes())


@dataclass
class Write:
    name: str
    rows: int


class FakeEvent:
    """A recorded event of FakeBatchRuntime: `wait` / `release` go to its log."""

    def __init__(self, rt: "FakeBatchRuntime", number: int) -> None:
        self.rt, self.number = rt, number

    def wait(self) -> None:
        self.rt.log.append(("wait", self.number))

    def release(self) -> None:
        self.rt.log.append(("release", self.number))


class FakeBatchRuntime:
    """The runtime side of `RuntimeEngine` (docs in the module). `num_pages` pages of `page_tokens`; page 0 is the
    scratch page."""

    def __init__(self, manifest: Any, page_tokens: int = 16, num_pages: int = 256, steps: bool = False) -> None:
        from kern_run.sampling_io import read_sampling_io

        self.manifest = manifest
        self.io = read_sampling_io(manifest)
        self.page_tokens = page_tokens
        self.num_pages = num_pages
        at_max = var_max(manifest.vars)
        self.buffers: dict[str, np.ndarray] = {}
        dtypes = {"i32": np.int32, "u32": np.uint32, "i64": np.int64, "f32": np.float32, "u8": np.uint8}
        for name, buf in manifest.buffers.items():
            if buf.kind in ("input", "output") and buf.dtype in dtypes:
                self.buffers[name] = np.zeros(buf.shape_at(at_max), dtype=dtypes[buf.dtype])
        self.buffers["block_table"][:] = 7  # garbage until written (a missed write shows)
        if self.io is not None:
            greedy = struct.pack("<fifffffiIIII", 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0)
            self.buffers[self.io.params][:] = np.frombuffer(greedy, dtype=np.uint32)  # the load program's init
            self.buffers[self.io.hist_tokens][:] = -1
        self.kv: dict[int, tuple[int, int]] = {}  # slot -> (position, token)
        self.kern_pool = kern_pool.Pool(kern_pool.Layout.simple(page_tokens, num_pages - 1))  # page 0: scratch
        self.weight_load_stats = (1000, 0.001)
        self.closed = False
        self.writes: list[Write] = []
        self.issues: list[tuple[str, dict[str, int], bool]] = []
        self.readbacks: list[tuple[str, int | None]] = []
        self.last_tokens: np.ndarray = np.zeros(0, dtype=np.int32)
        self.seen: list[dict[str, np.ndarray]] = []  # each decode step's per-row inputs, as the step read them
        self.steps = steps
        self.log: list[tuple[Any, ...]] = []  # ("issue", program, seqs) / ("event" | "wait" | "release", n) / ("read", name)
        self._events = 0

    # ---------------------------------------------------------------- the runtime API the engine uses

    def write_input(self, name: str, array: np.ndarray) -> None:
        buf = self.buffers[name]
        assert self.manifest.buffers[name].kind == "input", name
        assert array.dtype == buf.dtype, (name, array.dtype, buf.dtype)
        assert array.shape[1:] == buf.shape[1:] and array.shape[0] <= buf.shape[0], (name, array.shape, buf.shape)
        buf[:array.shape[0]] = array  # a prefix of rows; later rows keep their bytes
        self.writes.append(Write(name, int(array.shape[0])))

    def issue(self, program: str, vars: dict[str, int], eager: bool = False) -> None:
        self.issues.append((program, dict(vars), eager))
        self.log.append(("issue", program, vars.get("seqs")))
        if program == "prefill":
            self._prefill(vars["tokens"])
        elif program == "decode":
            assert vars["tokens"] == vars["seqs"], vars
            self._decode(vars["seqs"])
        else:
            assert self.io is not None and program == self.io.top_program, program
            self._top(vars["seqs"])

    def record_event(self) -> FakeEvent:
        assert self.steps, "a runtime without DeviceSteps"
        self._events += 1
        self.log.append(("event", self._events))
        return FakeEvent(self, self._events)

    def host_array(self, name: str) -> np.ndarray:
        assert self.steps and self.manifest.buffers[name].placement == "host", name
        return self.buffers[name]  # a live view, as the runtime's

    def read_output(self, name: str, rows: int | None = None) -> np.ndarray:
        self.readbacks.append((name, rows))
        self.log.append(("read", name))
        buf = self.buffers[name]
        return buf[:rows].copy() if rows is not None else buf.copy()

    def read_buffer(self, name: str, rows: int | None = None) -> np.ndarray:
        return self.read_output(name, rows)

    # ---------------------------------------------------------------- the pool API (RuntimeMemory) and the rest

    def lease(self, num_tokens: int, *, wait: bool = True):  # type: ignore[no-untyped-def]
        lease = self.kern_pool.lease(num_tokens)
        self.run(lease.plan)
        return lease

    def lease_from(self, checkpoint, num_tokens: int, *, prefix_tokens=None, hold=None,  # type: ignore[no-untyped-def]
                   wait=True):
        lease = self.kern_pool.lease_from(checkpoint, num_tokens, prefix_tokens=prefix_tokens, hold=hold)
        self.run(lease.plan)
        return lease

    def checkpoint(self, lease, num_tokens: int):  # type: ignore[no-untyped-def]
        cp = self.kern_pool.checkpoint(lease, num_tokens)
        self.run(cp.plan)
        return cp

    def describe(self) -> dict:
        return {}

    def into_resident(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True

    # ---------------------------------------------------------------- the plan executor (PoolMemory)

    def run(self, copies: kern_pool.Copies) -> None:
        P = self.page_tokens
        for page_id in copies.zero_pages:
            for k in range(P):
                self.kv.pop(page_id * P + k, None)
        for c in copies.page_copies:
            for k in range(P):
                src = self.kv.get(c.src_page_id * P + k)
                if src is None:
                    self.kv.pop(c.dst_page_id * P + k, None)
                else:
                    self.kv[c.dst_page_id * P + k] = src

    def host_copies(self, copies: kern_pool.HostCopies) -> None:
        raise AssertionError("no host tier in these tests")

    # ---------------------------------------------------------------- the "model"

    def _prefill(self, n: int) -> None:
        b = self.buffers
        table = b["block_table"][0]
        pos, ids, slots = b["positions"][:n], b["token_ids"][:n], b["slot_mapping"][:n]
        assert list(slots) == list(slot_mapping(table, self.page_tokens, int(pos[0]), int(pos[-1]) + 1))
        assert int(b["seq_lens"][0]) == int(pos[-1]) + 1 and list(b["cu_seqlens_q"][:2]) == [0, n]
        for p, t, s in zip(pos, ids, slots):
            self.kv[int(s)] = (int(p), int(t))

    def _read(self, table: np.ndarray, position: int) -> int:
        P = self.page_tokens
        at, tok = self.kv.get(int(table[position // P]) * P + position % P, (-1, -1))
        return tok if at == position else -1

    def _decode(self, rows: int) -> None:
        b = self.buffers
        P = self.page_tokens
        self.seen.append({k: b[k][:rows].copy() for k in ("token_ids", "positions", "slot_mapping", "seq_lens",
                                                           "block_table")})
        out = np.zeros(rows, dtype=np.int32)
        lps = np.zeros(rows, dtype=np.float32)
        for r in range(rows):
            table, p, t = b["block_table"][r], int(b["positions"][r]), int(b["token_ids"][r])
            slot, seq_len = int(b["slot_mapping"][r]), int(b["seq_lens"][r])
            if not table.any():  # a padding row: scratch page and slot only
                assert slot == p % P and seq_len == p + 1, (r, p, t, slot, seq_len)
            else:
                assert slot == int(table[p // P]) * P + p % P and seq_len == p + 1, (r, slot, p, seq_len)
                assert 0 not in table[:p // P + 1], (r, "a live row reads the scratch page")
            self.kv[slot] = (p, t)
            ids = [self._read(table, q) for q in range(p + 1)]
            history = None
            if self.io is not None:
                params = unpack_params(b[self.io.params][r])
                toks, counts = b[self.io.hist_tokens][r], b[self.io.hist_counts][r]
                history = tuple((int(x), int(c)) for x, c in zip(toks, counts) if c > 0)
            else:
                params = (0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0)
            out[r], lps[r] = model_token(ids, params, history)
        if self.io is None:
            b["next_token"][:rows] = out
        else:
            b[self.io.next_token][:rows] = (out.astype(np.uint32).astype(np.uint64)
                                            | (lps.view(np.uint32).astype(np.uint64) << np.uint64(32))).view(np.int64)
            for r in range(rows):  # kern_sample_history_append, padding rows included
                toks, counts = b[self.io.hist_tokens][r], b[self.io.hist_counts][r]
                hit = np.flatnonzero((counts > 0) & (toks == out[r]))
                if hit.size:
                    counts[hit[0]] += 1
                else:
                    free = np.flatnonzero(counts <= 0)
                    if free.size:
                        toks[free[0]], counts[free[0]] = out[r], 1
        self.last_tokens = out
        advance = self.manifest.meta["caller"].get("decode_advance")
        if advance is not None:  # kern_decode_advance(_packed)
            ring = b[advance["ring"]]
            entries = b[self.io.next_token if self.io is not None else "next_token"]
            for r in range(rows):
                p = int(b["positions"][r]) + 1
                table = b["block_table"][r]
                ring[r, p % ring.shape[-1]] = entries[r]
                b["token_ids"][r], b["positions"][r], b["seq_lens"][r] = out[r], p, p + 1
                b["slot_mapping"][r] = int(table[p // P]) * P + p % P if p // P < table.size else -1

    def _top(self, rows: int) -> None:
        assert self.io is not None
        b = self.buffers
        for r in range(rows):
            t = int(self.last_tokens[r])
            b[self.io.top_ids][r] = [(t + k) % VOCAB for k in range(self.io.top_n)]
            b[self.io.top_logprobs][r] = [-0.5 * k - 0.125 for k in range(self.io.top_n)]
        b[self.io.top_logprobs][:rows, -1] = -np.inf  # outside the kept set


class FakeGen:
    """What RuntimeEngine reads off a Generator."""

    def __init__(self, rt: FakeBatchRuntime, facts: ManifestFacts, max_positions: int = 1024) -> None:
        self.rt = rt
        self.facts = facts
        self.page_tokens = rt.page_tokens
        self.max_positions = max_positions
        self.steps = rt if rt.steps else None  # the Generator's DeviceSteps (the pipelined decode)


def expected(prompt: Sequence[int], steps: int, params: tuple, cap: int | None) -> list[tuple[int, float]]:
    """(token, logprob) of each of `steps` decode steps of `prompt` run alone: the same model over the true ids."""
    ids = list(prompt)
    out = []
    for _ in range(steps):
        history = history_state(ids, cap) if cap is not None else None
        token, lp = model_token(ids, params, history)
        out.append((token, lp))
        ids.append(token)
    return out
