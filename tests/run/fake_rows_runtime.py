"""A fake runtime for the batched decode caller (kern_run.batch): the pool API over a kern_pool Pool, a per-row
"model" that reads its KV through each row's own block-table row, the GPU sampler's per-row inputs, the device
advance (tools/reference_step.py's rule, per row) and a host-mapped token ring of packed entries.

Every decode row is computed from that row's inputs alone (token, position, slot, seq_len, block-table row,
sampling params, history), so a caller that writes them right gets the same tokens for a prompt alone and in any
batch; and every input is checked as the kernels' contract states it (a padding row touches page 0 only, a live
row's slot is slot(position) through its own row, seq_len = position + 1, no page 0 in a live row's pages).
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from kern_run.preflight import ManifestFacts, read_manifest

VOCAB = 250  # ids 3..252; EOS tests pick one of them
HIST_CAP = 16


def batched_manifest(path: Path, kernels: Path, seqs_max: int = 64, sampler: bool = True, chunk_max: int = 64,
                     hist_cap: int = HIST_CAP) -> Path:
    """The tiny shape at `seqs_max` decode rows (gemv v2: the small-M projections at 2..64 rows) with the GPU
    sampler (its buffers, the top_logprobs program and meta.caller.sampling, as the builder makes them), or with
    `sampler` False the argmax decode (no meta.caller.sampling)."""
    from kern_run.models import qwen3
    from tools import make_checkpoint

    cfg = qwen3.Qwen3Config.from_json(make_checkpoint.config_json(make_checkpoint.SHAPES["tiny"]))
    opts = qwen3.BuildOptions("tiny", chunk_max, 1024, seqs_max=seqs_max, gemv="v2",
                              sampler="gpu" if sampler else "argmax", hist_cap=hist_cap)
    path.write_text(qwen3.dumps(qwen3.build_manifest(cfg, qwen3.read_kernel_abi(kernels), opts)))
    return path


def batched_facts(path: Path, kernels: Path, **kw) -> ManifestFacts:  # type: ignore[no-untyped-def]
    return read_manifest(batched_manifest(path, kernels, **kw))


def _mix(*xs: int) -> int:
    h = 0x9E3779B9
    for x in xs:
        h = (h * 1_000_003 + int(x) + 7) % (1 << 61)
    return h


def pack(token: int, logprob: float) -> int:
    """A packed entry: token id in bits 0..31, the f32 logprob's bits in 32..63 (as an i64)."""
    bits = struct.unpack("<I", struct.pack("<f", logprob))[0]
    return struct.unpack("<q", struct.pack("<Q", (bits << 32) | (token & 0xFFFFFFFF)))[0]


class _Event:
    def __init__(self, rt: "BatchFakeRuntime", step: int) -> None:
        self.rt, self.step = rt, step

    def wait(self) -> None:
        self.rt.waited.append(self.step)


class BatchFakeRuntime:
    """CallerRuntime + DeviceSteps + PrefixRuntime of a batched manifest (`facts`), on CPU.

    The model: row r at position p with token t predicts base = mix(t, p, hash of the row's KV at 0..p-1 read
    through its block-table row) % VOCAB + 3 (greedy). With temperature > 0 the token is mix(seed, p, base) % VOCAB
    + 3 (a function of the row's own seed and position: what Philox keyed by (seed, position) gives the real
    sampler). With a repetition penalty > 1 a token held in the row's history is skipped (the next id up that is
    not). Logprob -(mix(...) % 1000) / 1000. `steps`: False makes it a runtime without DeviceSteps (the
    synchronous loop)."""

    def __init__(self, facts: ManifestFacts, num_pages: int = 256, page_tokens: int = 16, ring_len: int = 64,
                 packed: bool = True) -> None:
        from kern_pool import Layout, Pool

        self.facts = facts
        self.page_tokens = page_tokens
        self.num_pages = num_pages
        self.kern_pool = Pool(Layout.simple(page_tokens, pages=num_pages - 1))
        self.weight_load_stats = (1000, 0.001)
        m = facts.manifest
        self.seqs_max = m.vars["seqs"].max
        pps = facts.pages_per_seq
        self.buf: dict[str, np.ndarray] = {
            "token_ids": np.zeros(m.vars["tokens"].max, np.int32), "positions": np.zeros(m.vars["tokens"].max, np.int32),
            "slot_mapping": np.zeros(m.vars["tokens"].max, np.int32), "seq_lens": np.zeros(self.seqs_max, np.int32),
            "cu_seqlens_q": np.zeros(self.seqs_max + 1, np.int32), "block_table": np.zeros((self.seqs_max, pps), np.int32),
        }
        self.sampler = "sampling" in (m.meta or {}).get("caller", {})
        if self.sampler:
            cap = m.meta["caller"]["sampling"]["hist_cap"]
            greedy = np.frombuffer(struct.pack("<fifffffiIIII", 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0), "<u4")
            self.buf["sample_params"] = np.tile(greedy, (self.seqs_max, 1))  # the load program's greedy init
            self.buf["hist_tokens"] = np.full((self.seqs_max, cap), -1, np.int32)
            self.buf["hist_counts"] = np.zeros((self.seqs_max, cap), np.int32)
            self.top_ids = np.zeros((self.seqs_max, 20), np.int32)
            self.top_lps = np.zeros((self.seqs_max, 20), np.float32)
        self.packed = packed and self.sampler
        self.ring = np.full((self.seqs_max, ring_len), -1, np.int64)
        self.next_token = np.zeros(self.seqs_max, np.int64)
        self.slot_kv: dict[int, tuple[int, int]] = {}
        self.calls: list[tuple[str, dict[str, int], bool]] = []
        self.decodes: list[dict[str, np.ndarray]] = []  # the inputs each decode call read (rows < seqs)
        self.writes: list[str] = []
        self.waited: list[int] = []
        self.scratch_writes = 0
        self.closed = False

    # ---- CallerRuntime
    def write_input(self, name: str, array: np.ndarray) -> None:
        dst = self.buf[name]
        array = np.asarray(array)
        assert array.dtype == dst.dtype, (name, array.dtype, dst.dtype)
        assert array.shape[1:] == dst.shape[1:] and array.shape[0] <= dst.shape[0], (name, array.shape, dst.shape)
        dst[:array.shape[0]] = array
        self.writes.append(name)

    def issue(self, program: str, vars: dict[str, int] | None = None, eager: bool = False) -> None:
        vals = dict(vars or {})
        self.calls.append((program, vals, eager))
        if program == "prefill":
            self._prefill(vals["tokens"])
        elif program == "decode":
            assert vals["tokens"] == vals["seqs"], vals
            self._decode(vals["seqs"])
        elif program == "top_logprobs":
            pass  # written with the decode step (the fake keeps both in one place)
        else:
            raise AssertionError(program)

    def _check_row(self, r: int, p: int, slot: int, seq_len: int) -> bool:
        """True for a live row, False for a padding row (after checking each one's contract)."""
        P = self.page_tokens
        row = self.buf["block_table"][r]
        if not row.any():  # a padding row: the scratch page only
            assert 0 <= slot < P, f"padding row {r} writes slot {slot}, outside the scratch page 0"
            self.scratch_writes += 1
            return False
        assert seq_len == p + 1, (r, p, seq_len)
        used = row[:p // P + 1]
        assert 0 not in used, f"row {r}: a live row's pages hold the scratch page 0: {used}"
        assert slot == row[p // P] * P + p % P, f"row {r}: slot {slot} is not slot({p}) through its row"
        return True

    def _prefill(self, n: int) -> None:
        ids, pos, slots = (self.buf[k][:n] for k in ("token_ids", "positions", "slot_mapping"))
        assert list(self.buf["cu_seqlens_q"][:2]) == [0, n]
        assert int(self.buf["seq_lens"][0]) == int(pos[-1]) + 1
        if not self.buf["block_table"][0].any():  # the warm-up's scratch chunk
            assert (slots < self.page_tokens).all()
            return
        P, row = self.page_tokens, self.buf["block_table"][0]
        for t, p, s in zip(ids, pos, slots):
            assert s == row[p // P] * P + p % P and row[p // P] != 0
            self.slot_kv[int(s)] = (int(p), int(t))

    def _kv_hash(self, r: int, p: int) -> int:
        P, row = self.page_tokens, self.buf["block_table"][r]
        h = 0
        for q in range(p):
            at, tok = self.slot_kv.get(int(row[q // P]) * P + q % P, (-1, -1))
            assert at == q, f"row {r}: position {q} < {p} missing from its KV (slot holds {at})"
            h = _mix(h, tok)
        return h

    def _params(self, r: int) -> tuple[float, float, int]:
        if not self.sampler:
            return 0.0, 1.0, 0
        words = self.buf["sample_params"][r]
        raw = struct.pack("<12I", *[int(w) for w in words])
        temperature, _, _, _, repetition, _, _, _, lo, hi, _, _ = struct.unpack("<fifffffiIIII", raw)
        return temperature, repetition, lo | (hi << 32)

    def _decode(self, seqs: int) -> None:
        b = self.buf
        if seqs > 1:  # one query row per sequence (the one-sequence Generator leaves prefill's [0, L] there)
            assert list(b["cu_seqlens_q"][:seqs + 1]) == list(range(seqs + 1))
        self.decodes.append({k: np.array(b[k][:seqs]) for k in ("token_ids", "positions", "slot_mapping", "seq_lens",
                                                                  "block_table")})
        outs = []
        for r in range(seqs):
            t, p, slot, seq_len = (int(b[k][r]) for k in ("token_ids", "positions", "slot_mapping", "seq_lens"))
            live = self._check_row(r, p, slot, seq_len)
            if live:
                h = self._kv_hash(r, p)
                self.slot_kv[slot] = (p, t)
            else:
                h = 0
            base = _mix(t, p, h) % VOCAB + 3
            temperature, repetition, seed = self._params(r)
            token = _mix(seed, p, base) % VOCAB + 3 if temperature > 0 else base
            if repetition > 1.0:
                held = {int(x) for x, c in zip(b["hist_tokens"][r], b["hist_counts"][r]) if c > 0}
                while token in held:
                    token = token + 1 if token < VOCAB + 2 else 3
            lp = -(_mix(seed, p, token) % 1000) / 1000.0
            outs.append((token, lp))
            if self.sampler:  # kern_sample_history_append, every row
                ht, hc = b["hist_tokens"][r], b["hist_counts"][r]
                hit = np.nonzero((hc > 0) & (ht == token))[0]
                free = np.nonzero(hc <= 0)[0]
                if hit.size:
                    hc[hit[0]] += 1
                elif free.size:
                    ht[free[0]], hc[free[0]] = token, 1
                for k in range(20):
                    self.top_ids[r, k] = (token + k) % 1000
                    self.top_lps[r, k] = lp - k
        for r, (token, lp) in enumerate(outs):  # the device advance (tools/reference_step.py), per row
            value = pack(token, lp) if self.packed else token
            self.next_token[r] = value
            p = int(b["positions"][r]) + 1
            self.ring[r, p % self.ring.shape[1]] = value
            row = b["block_table"][r]
            b["token_ids"][r] = token
            b["positions"][r] = p
            b["seq_lens"][r] = p + 1
            idx = p // self.page_tokens
            b["slot_mapping"][r] = row[idx] * self.page_tokens + p % self.page_tokens if idx < row.size else -1

    def read_output(self, name: str, rows: int | None = None) -> np.ndarray:
        src = {"next_token": self.next_token, "top_ids": getattr(self, "top_ids", None),
               "top_logprobs": getattr(self, "top_lps", None)}[name]
        assert src is not None
        return np.array(src if rows is None else src[:rows])

    def read_buffer(self, name: str, rows: int | None = None) -> np.ndarray:
        raise AssertionError("the batch caller reads no other buffer")

    def describe(self) -> dict:
        return {}

    def into_resident(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True

    # ---- the pool API (PrefixRuntime)
    def _run(self, plan) -> None:  # type: ignore[no-untyped-def]
        P = self.page_tokens
        for c in plan.page_copies:
            for k in range(P):
                src = c.src_page_id * P + k
                if src in self.slot_kv:
                    self.slot_kv[c.dst_page_id * P + k] = self.slot_kv[src]
                else:
                    self.slot_kv.pop(c.dst_page_id * P + k, None)

    def lease(self, num_tokens: int, *, wait: bool = True):  # type: ignore[no-untyped-def]
        lease = self.kern_pool.lease(num_tokens)
        self._run(lease.plan)
        return lease

    def lease_from(self, checkpoint, num_tokens: int, *, prefix_tokens=None, hold=None, wait=True):  # type: ignore[no-untyped-def]
        lease = self.kern_pool.lease_from(checkpoint, num_tokens, prefix_tokens=prefix_tokens, hold=hold)
        self._run(lease.plan)
        return lease

    def retire(self, lease, num_tokens: int):  # type: ignore[no-untyped-def]
        return self.kern_pool.retire(lease, num_tokens)

    def checkpoint(self, lease, num_tokens: int, *, wait: bool = True):  # type: ignore[no-untyped-def]
        cp = self.kern_pool.checkpoint(lease, num_tokens)
        self._run(cp.plan)
        return cp

    # ---- DeviceSteps
    def record_event(self) -> _Event:
        return _Event(self, sum(1 for c in self.calls if c[0] == "decode"))

    def host_array(self, name: str) -> np.ndarray:
        assert name == "token_ring"
        return self.ring


def expected_tokens(prompt: list[int], steps: int, temperature: float = 0.0, seed: int = 0, repetition: float = 1.0,
                    hist_cap: int = HIST_CAP, eos: frozenset[int] = frozenset()) -> tuple[list[int], list[float]]:
    """(tokens, logprobs) the fake model gives `prompt` decoded alone with a correct KV cache: the same rule
    applied to the true sequence, its penalty history the prompt then the generated ids (kept as the device
    keeps it: distinct ids in order of first occurrence, at most hist_cap). Stops after an EOS id."""
    seq = list(prompt)
    held: dict[int, int] = {}
    for t in prompt:
        if t in held or len(held) < hist_cap:
            held[t] = held.get(t, 0) + 1
    out, lps = [], []
    for _ in range(steps):
        p = len(seq) - 1
        h = 0
        for q in range(p):
            h = _mix(h, seq[q])
        base = _mix(seq[-1], p, h) % VOCAB + 3
        token = _mix(seed, p, base) % VOCAB + 3 if temperature > 0 else base
        if repetition > 1.0:
            while token in held:
                token = token + 1 if token < VOCAB + 2 else 3
        out.append(token)
        lps.append(-(_mix(seed, p, token) % 1000) / 1000.0)
        if token in held or len(held) < hist_cap:
            held[token] = held.get(token, 0) + 1
        seq.append(token)
        if token in eos:
            break
    return out, lps
