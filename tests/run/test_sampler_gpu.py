"""On the GPU: the decode program's sampler (`--sampler gpu`, models/qwen3/sampling.py) end to end, on tiny
manifests built in-process against the repository's kernels/ and the seeded `tiny` checkpoint.

- Greedy rows through the sampler give the argmax manifest's tokens for 64 device-advanced steps (one row on
  the GEMV decode; four ragged rows on the cuBLASLt decode at seqs 4, one of them sampled), and so does the
  caller (`Generator`, pipelined) on both manifests.
- A seeded sampled row (temperature, top-k, top-p, penalties) gives the same tokens and logprobs twice, another
  seed other tokens; the in-graph history ends as the prompt's pairs plus every generated token.
- The packed next_token / ring entry decodes to (token, logprob) with logprob <= 0, equal to the log-softmax
  (under the step's filters) of the logits read back at that step; those logits are the raw logits (the argmax
  manifest fed the same tokens) with the penalties over the row's history applied, bit for bit; the
  `top_logprobs` program lists the reference's 20 best with their logprobs, the sampled token's equal to its
  packed logprob bit for bit.

Run on the H200:  KERN_REQUIRE_GPU=1 python3 -m pytest tests/run/test_sampler_gpu.py -q
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pytest

from kern_run.generate import bf16_to_f32
from kern_run.models import qwen3 as gq
from kern_run.sampling import SamplingParams, history_counts, pack_history, pack_params, unpack_packed
from tools import make_checkpoint as mc
from tools import reference_sample as ref

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"
STEPS = 64
CHUNK = 64
SAMPLED = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, repetition_penalty=1.3, presence_penalty=0.5,
                         frequency_penalty=0.2, seed=1234)


def _ids(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 151936, size=n).tolist()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sampler") / "qwen3-tiny"
    mc.write_checkpoint(out, mc.SHAPES["tiny"], seed=0, with_tokenizer=False, log=lambda *_: None)
    return out


def _manifest_path(tmp: Path, name: str, **opts) -> Path:
    m = gq.build_manifest(gq.Qwen3Config.from_name("tiny"), gq.read_kernel_abi(KERNELS),
                          gq.BuildOptions(name, chunk_max=CHUNK, max_context=1024, **opts))
    path = tmp / f"{name}.json"
    path.write_text(gq.dumps(m))
    return path


@pytest.fixture(scope="module")
def manifests(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("sampler-manifests")
    return {"gpu": _manifest_path(tmp, "gpu"), "argmax": _manifest_path(tmp, "argmax", sampler="argmax"),
            "gpu4": _manifest_path(tmp, "gpu4", decode="gemm", seqs_max=4),
            "argmax4": _manifest_path(tmp, "argmax4", decode="gemm", seqs_max=4, sampler="argmax")}


def _load(path: Path, ckpt: Path, seqs: int = 1):
    from kern_runtime import Capacity, Runtime, SafetensorsTensors

    return Runtime.load(str(path), str(KERNELS), SafetensorsTensors.open(str(ckpt)),
                        capacity=Capacity(tokens=4096, seqs=seqs))


@pytest.fixture(scope="module")
def rt_gpu(manifests, ckpt):
    with _load(manifests["gpu"], ckpt) as rt:
        yield rt


@pytest.fixture(scope="module")
def rt_argmax(manifests, ckpt):
    with _load(manifests["argmax"], ckpt) as rt:
        yield rt


class Rows:
    """n sequences on one runtime, driven by hand through the caller contract: each row prefilled alone (block-
    table row 0), then decode steps of all n rows (tokens = seqs = n); the first step's inputs from the host,
    later ones advanced on the device unless `step(forced=...)` writes them."""

    def __init__(self, rt, prompts: Sequence[Sequence[int]], steps: int = STEPS) -> None:
        self.rt, self.n = rt, len(prompts)
        self.width = rt.manifest.buffers["block_table"].shape_at({"seqs": 1})[1]
        self.leases = [rt.lease(len(p) + steps + 1) for p in prompts]
        self.pages = rt.block_table(self.leases, width=self.width)  # i32 [n, width]
        self.positions = [len(p) - 1 for p in prompts]  # the position the next step processes, per row
        pt = rt.page_tokens
        for r, p in enumerate(prompts):
            rt.write_input("block_table", self.pages[r:r + 1])
            for lo in range(0, len(p) - 1, CHUNK):
                piece = np.asarray(p[lo:min(lo + CHUNK, len(p) - 1)], np.int32)
                rt.write_input("token_ids", piece)
                rt.write_input("positions", np.arange(lo, lo + len(piece), dtype=np.int32))
                rt.write_input("slot_mapping", self.slots(r, lo, lo + len(piece)))
                rt.write_input("seq_lens", np.asarray([lo + len(piece)], np.int32))
                rt.write_input("cu_seqlens_q", np.asarray([0, len(piece)], np.int32))
                rt.issue("prefill", {"tokens": len(piece), "seqs": 1})
        rt.write_input("block_table", self.pages)
        self._write_step([p[-1] for p in prompts])
        self.page_tokens = pt

    def slots(self, r: int, start: int, stop: int) -> np.ndarray:
        pt = self.rt.page_tokens
        pos = np.arange(start, stop)
        return (self.pages[r][pos // pt].astype(np.int64) * pt + pos % pt).astype(np.int32)

    def _write_step(self, tokens: Sequence[int]) -> None:
        rt, pos = self.rt, self.positions
        rt.write_input("token_ids", np.asarray(tokens, np.int32))
        rt.write_input("positions", np.asarray(pos, np.int32))
        rt.write_input("slot_mapping", np.concatenate([self.slots(r, p, p + 1) for r, p in enumerate(pos)]))
        rt.write_input("seq_lens", np.asarray([p + 1 for p in pos], np.int32))

    def sampling(self, params: Sequence[SamplingParams], histories: Sequence[Sequence[int]], hist_cap: int) -> None:
        """Write rows' sample_params and histories (pack_params / pack_history), as a caller does at admission."""
        words = np.frombuffer(pack_params(params), "<u4").reshape(len(params), 12)
        toks, counts = pack_history([history_counts(h) for h in histories], hist_cap)
        self.rt.write_input("sample_params", words)
        self.rt.write_input("hist_tokens", np.frombuffer(toks, "<i4").reshape(len(params), hist_cap))
        self.rt.write_input("hist_counts", np.frombuffer(counts, "<i4").reshape(len(params), hist_cap))

    def step(self, forced: Sequence[int] | None = None) -> np.ndarray:
        """One decode step; returns next_token i64 [n] (synchronises). `forced`: write this step's tokens
        (teacher forcing) instead of the device-advanced ones."""
        if forced is not None:
            self._write_step(forced)
        self.rt.issue("decode", {"tokens": self.n, "seqs": self.n})
        out = np.asarray(self.rt.read_output("next_token", self.n))
        self.positions = [p + 1 for p in self.positions]
        return out

    def close(self) -> None:
        for lease in self.leases:
            lease.close()


def _greedy_tokens(rt, prompt: list[int], params: SamplingParams | None = None) -> tuple[list[int], list[float],
                                                                                        list[int]]:
    """(tokens, logprobs, ring entries) of STEPS device-advanced steps of one row (logprobs: 0.0 for an argmax
    manifest's plain ids). `params`: written first (else the row's sampler inputs are left as they are)."""
    rows = Rows(rt, [prompt])
    if params is not None:
        rows.sampling([params], [prompt], 1024)
    ring = rt.host_array("token_ring")
    tokens, lps, ring_seen = [], [], []
    try:
        for _ in range(STEPS):
            nxt = rows.step()
            ring_seen.append(int(ring[0, rows.positions[0] % ring.shape[1]]))
            t, lp = unpack_packed(nxt)
            tokens.append(int(t[0]))
            lps.append(float(lp[0]))
            assert ring_seen[-1] == int(nxt[0]), "the ring entry is next_token's value"
    finally:
        rows.close()
    return tokens, lps, ring_seen


def test_greedy_through_the_sampler_is_the_argmax(manifests, ckpt, rt_argmax) -> None:
    """A freshly loaded sampler manifest decodes greedily with no sampler input written (the load program's
    init), and so it does after greedy params are written."""
    with _load(manifests["gpu"], ckpt) as fresh:
        for i, (seed, n) in enumerate(((1, 40), (2, 1), (3, 130))):
            prompt = _ids(n, seed)
            want, _, plain = _greedy_tokens(rt_argmax, prompt)
            assert plain == want  # argmax manifest: plain token ids in the ring
            got, lps, packed = _greedy_tokens(fresh, prompt, None if i < 2 else SamplingParams())
            assert got == want, f"prompt {seed}: first difference at " \
                f"{next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)}"
            assert all(lp <= 0.0 for lp in lps) and not any(np.isnan(lps))
            assert any(v < 0 for v in packed)  # logprob < 0 sets bit 63: these are packed entries, not plain ids


def test_the_caller_decodes_the_same_tokens_on_both_manifests(manifests, ckpt) -> None:
    from kern_run.generate import GenerateOptions, Generator
    from kern_run.preflight import read_manifest

    prompt = _ids(40, 1)
    out = {}
    for key in ("argmax", "gpu"):
        facts = read_manifest(manifests[key])
        with Generator.open(manifests[key], KERNELS, ckpt, facts, capacity_tokens=4096) as gen:
            assert gen.can_pipeline
            for lookahead in (0, 4):
                r = gen.generate(prompt, GenerateOptions(STEPS, CHUNK, stop_at_eos=False, lookahead=lookahead))
                out[key, lookahead] = r.tokens
    assert out["gpu", 0] == out["gpu", 4] == out["argmax", 0] == out["argmax", 4]


def _sampled_run(rt, prompt: list[int], params: SamplingParams, hist_cap: int = 1024):
    rows = Rows(rt, [prompt])
    rows.sampling([params], [prompt], hist_cap)
    try:
        packed = np.concatenate([rows.step() for _ in range(STEPS)])
        hist = (np.asarray(rt.read_buffer("hist_tokens", 1)), np.asarray(rt.read_buffer("hist_counts", 1)))
    finally:
        rows.close()
    tokens, lps = unpack_packed(packed)
    return tokens.tolist(), lps, hist


def test_a_seeded_row_repeats_and_its_history_grows_in_the_graph(rt_gpu) -> None:
    prompt = _ids(50, 7)
    a, lp_a, hist = _sampled_run(rt_gpu, prompt, SAMPLED)
    b, lp_b, _ = _sampled_run(rt_gpu, prompt, SAMPLED)
    assert a == b and lp_a.tobytes() == lp_b.tobytes()
    # the tiny model's random weights give flat distributions: another key draws other tokens
    other, _, _ = _sampled_run(rt_gpu, prompt, SamplingParams(**{**SAMPLED.__dict__, "seed": 99}))
    assert other != a
    assert (lp_a <= 0).all()
    greedy, _, _ = _greedy_tokens(rt_gpu, prompt, SamplingParams())
    assert a != greedy
    # every step appended its token: the history is the prompt's pairs, then each new id, in first-seen order
    toks, counts = pack_history([history_counts(prompt + a)], 1024)
    np.testing.assert_array_equal(hist[0].reshape(-1), np.frombuffer(toks, "<i4"))
    np.testing.assert_array_equal(hist[1].reshape(-1), np.frombuffer(counts, "<i4"))


def _raw_logits(rt_argmax, prompt: list[int], tokens: list[int]) -> list[np.ndarray]:
    """The logits f32 [vocab] of each step fed prompt[-1], tokens[0], ... (the argmax manifest: no penalty)."""
    rows = Rows(rt_argmax, [prompt])
    out = []
    try:
        for i in range(len(tokens)):
            rows.step(forced=[prompt[-1] if i == 0 else tokens[i - 1]])
            out.append(bf16_to_f32(np.asarray(rt_argmax.read_buffer("logits", 1))).reshape(-1))
    finally:
        rows.close()
    return out


@pytest.mark.parametrize("params", [SamplingParams(), SAMPLED,
                                    SamplingParams(temperature=0.7, min_p=0.02, seed=5, repetition_penalty=0.8)],
                         ids=["greedy", "filters-penalties", "min-p"])
def test_packed_logprob_is_the_log_softmax_of_the_step_logits(rt_gpu, rt_argmax, params: SamplingParams) -> None:
    prompt, steps = _ids(30, 11), 12
    rows = Rows(rt_gpu, [prompt], steps)
    rows.sampling([params], [prompt], 1024)
    ring = rt_gpu.host_array("token_ring")
    got = []
    try:
        for _ in range(steps):
            nxt = rows.step()
            t, lp = unpack_packed(nxt)
            rt_gpu.issue("top_logprobs", {"tokens": 1, "seqs": 1})  # before the next step is queued
            got.append((int(t[0]), lp[0], bf16_to_f32(np.asarray(rt_gpu.read_buffer("logits", 1))).reshape(-1),
                        np.asarray(rt_gpu.read_output("top_ids", 1))[0],
                        np.asarray(rt_gpu.read_output("top_logprobs", 1))[0],
                        np.asarray(rt_gpu.read_buffer("sample_stats", 1))[0]))
            rt, lpr = unpack_packed(np.asarray(ring[0, rows.positions[0] % ring.shape[1]]).reshape(1))
            assert (int(rt[0]), lpr[0].tobytes()) == (int(t[0]), lp[0].tobytes())
    finally:
        rows.close()
    tokens = [g[0] for g in got]
    raw = _raw_logits(rt_argmax, prompt, tokens)
    for i, (tok, lp, logits, top_ids, top_lps, stats) in enumerate(got):
        history = history_counts(prompt + tokens[:i])
        want_logits = ref.penalize(raw[i], [t for t, _ in history], [c for _, c in history],
                                   params.repetition_penalty, params.presence_penalty, params.frequency_penalty)
        np.testing.assert_array_equal(logits, want_logits, err_msg=f"step {i}: the logits the sampler left")
        m, log_z, thr, inv_t = stats
        l = ref.scaled(logits, params.temperature if params.temperature > 0 else 1.0)
        assert m == l.max() and inv_t == (np.float32(1) / np.float32(params.temperature) if params.temperature > 0
                                          else 1.0)
        if params.greedy:
            assert thr == -np.inf
        else:  # the kept set: the reference's threshold, or one a float32 mass may round either way
            t = ref.thresholds(l, params.top_k, params.top_p, params.min_p)
            assert thr == t.thr or ref.rounding_boundary(l, thr, t.thr, params.top_k, params.top_p, params.min_p), (
                i, thr, t.thr)
        want = ref.log_probs_at(l, thr)
        # log Z_kept: the maximum is always kept, and its logprob is -log Z_kept
        assert abs(float(log_z) + want[int(np.argmax(l))]) <= 2e-4 * max(1.0, abs(float(log_z)))
        assert lp <= 0 and np.isfinite(want[tok]), (i, tok, lp)
        assert abs(float(lp) - want[tok]) <= 2e-4 + 2e-5 * abs(want[tok]), (i, tok, float(lp), want[tok])
        if params.greedy:
            assert tok == ref.greedy(logits)
        # top logprobs: the reference's 20 best (l desc, index asc) under the distribution sampled from
        np.testing.assert_array_equal(top_ids, ref.top_n(logits, params.temperature if params.temperature > 0 else 1.0,
                                                         20))
        kept = np.isfinite(want[top_ids])
        assert (np.isinf(top_lps[~kept]) & (top_lps[~kept] < 0)).all()
        np.testing.assert_allclose(top_lps[kept], want[top_ids[kept]], atol=2e-4, rtol=2e-5)
        hit = np.nonzero(top_ids == tok)[0]
        if hit.size:
            assert top_lps[hit[0]].tobytes() == lp.tobytes()  # the same f32 operations on the same stats


def test_four_ragged_rows_greedy_with_a_sampled_neighbour(manifests, ckpt) -> None:
    """The cuBLASLt decode at seqs 4: rows of different lengths; greedy rows through the sampler give the argmax
    manifest's tokens for 64 steps, whatever their neighbour row samples."""
    prompts = [_ids(n, 20 + n) for n in (33, 5, 70, 18)]
    with _load(manifests["argmax4"], ckpt, seqs=4) as rt:
        rows = Rows(rt, prompts)
        want = np.stack([rows.step() for _ in range(STEPS)])  # [steps, 4] plain ids
        rows.close()
    with _load(manifests["gpu4"], ckpt, seqs=4) as rt:
        rows = Rows(rt, prompts)
        rows.sampling([SamplingParams(), SamplingParams(), SAMPLED, SamplingParams()], prompts, 1024)
        packed = np.stack([rows.step() for _ in range(STEPS)])
        rows.close()
    tokens, lps = unpack_packed(packed)
    for r in (0, 1, 3):
        assert tokens[:, r].tolist() == want[:, r].tolist(), f"row {r}"
    assert tokens[:, 2].tolist() != want[:, 2].tolist()  # the sampled row drew its own tokens
    assert (lps <= 0).all()
