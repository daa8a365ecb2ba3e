"""The batched decode caller on the GPU (kern_run.batch), on the committed tiny-en model (models/qwen3-tiny-en,
trained weights: real top-2 margins) with its batch-invariant manifest, manifests/qwen3-tiny-en-inv.json (`kern
manifest build --batch-invariant --seqs-max 64`: the same launches at every bucket, 1 included; docs/caller.md
"Batch-invariant decode"), and again with that manifest's MMA twin (`--decode gemv --gemv v2 --batch-proj mma`,
built by the test), where a row alone is `kern run` of its prompt on that manifest:

- (a) every row of a batched greedy run gives the tokens of its prompt decoded alone (one row, bucket 1), 128
  steps, ragged prompt lengths, at buckets 4 and 64 (and the synchronous loop at bucket 4): bit for bit;
- rows of other budgets stopping mid-batch (kept as harmless rows, then re-packed into smaller buckets) leave
  every other row's tokens unchanged;
- (b) a seeded sampled request gives the same tokens alone and inside batches of 4 and 64 with other neighbours;
- (c) `kern run --prompts FILE --stop S` ends the row whose text holds S and cuts its line before S.
- the warm-up at load captures the buckets' graphs and the first generation after it pays no capture.
- the fast manifest (manifests/qwen3-tiny-en.json: M = 1 GEMVs at bucket 1, cuBLASLt's heuristic at 2..64) is
  not batch-invariant: a non-strict note records how its 64-row rows compare with each alone.

Run on the H200:  KERN_REQUIRE_GPU=1 python3 -m pytest tests/run/test_batch_gpu.py -q -s
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
SEQS = 64
STEPS = 128
INVARIANT = ROOT / "manifests" / "qwen3-tiny-en-inv.json"
FAST = ROOT / "manifests" / "qwen3-tiny-en.json"


def _open(manifest: Path):  # type: ignore[no-untyped-def]
    from kern_run.generate import Generator
    from kern_run.preflight import read_manifest
    from kern_run.text import load_codec

    weights = ROOT / "models" / "qwen3-tiny-en"
    return Generator.open(manifest, ROOT / "kernels", weights, read_manifest(manifest), gpu=0,
                          capacity_tokens=64 * 1024, eos_ids=load_codec(weights).eos_ids)


def _mma_manifest(out: Path) -> Path:
    """The tiny-en invariant manifest with every decode projection on the small-M MMA entries (`--batch-invariant
    --decode gemv --gemv v2 --batch-proj mma`), built here (not committed: slower than the cuBLASLt decode,
    docs/perf.md)."""
    import dataclasses

    from kern_run.models.qwen3.command import build_texts, write_outputs
    from tools import regen_manifests as rm

    req = rm.request("qwen3-tiny-en-inv.json", ROOT / "kernels", rm.ALGOS, out)
    options = {**req.options, "decode": "gemv", "gemv": "v2", "batch_proj": "mma"}
    req = dataclasses.replace(req, options=options, name="qwen3-tiny-en-inv-mma", verify=True)
    write_outputs(build_texts(req))
    return req.out


@pytest.fixture(scope="module", params=["cublaslt", "mma"])
def manifest(request, tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    """The committed invariant manifest (cuBLASLt projections), then its MMA twin."""
    return INVARIANT if request.param == "cublaslt" else _mma_manifest(tmp_path_factory.mktemp("mma"))


@pytest.fixture(scope="module")
def gen(manifest: Path):  # type: ignore[no-untyped-def]
    g = _open(manifest)
    yield g
    g.close()


def _decoder(gen, pipelined: bool = True):  # type: ignore[no-untyped-def]
    from kern_run.batch import BatchDecoder, BatchOptions
    from kern_run.generate import Generator
    from kern_run.sampler_meta import read_sampler

    g = gen if pipelined else Generator(gen.rt, gen.facts, gen.eos_ids, steps=None)
    return BatchDecoder(g, BatchOptions(chunk=64), read_sampler(gen.facts.manifest, "tiny-en"))


def _prompts(n: int, seed: int) -> list[tuple[int, ...]]:
    rng = np.random.default_rng(seed)
    return [tuple(rng.integers(0, 8192, size=1 + (37 * i + 11) % 190).tolist()) for i in range(n)]


def _alone(gen, prompt, steps: int, params=None):  # type: ignore[no-untyped-def]
    from kern_run.batch import RowRequest
    from kern_run.sampling import SamplingParams

    req = RowRequest(prompt, steps, params or SamplingParams(), stop_at_eos=False)
    return _decoder(gen).run([req])[0].tokens


def _first_difference(a: list[int], b: list[int]) -> str:
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"first difference at step {k} of {len(a)} / {len(b)}"


def test_manifest_takes_64_rows_and_samples(gen) -> None:
    from kern_run.batch import decode_rows_max
    from kern_run.sampler_meta import read_sampler

    assert decode_rows_max(gen.facts) >= SEQS, "the builder did not make a 64-row decode"
    assert read_sampler(gen.facts.manifest, "tiny-en") is not None, "the manifest has no GPU sampler"
    assert gen.facts.decode_batch_invariant


@pytest.mark.parametrize("rows, pipelined", [(4, True), (4, False), (64, True)])
def test_each_batched_row_decodes_as_alone(gen, rows: int, pipelined: bool) -> None:
    from kern_run.batch import RowRequest

    prompts = _prompts(rows, seed=rows)
    alone = [_alone(gen, p, STEPS) for p in prompts]
    dec = _decoder(gen, pipelined)
    results = dec.run([RowRequest(p, STEPS, stop_at_eos=False) for p in prompts])
    assert dec.timings.steps == {rows: STEPS}, dec.timings.steps
    bad = [(i, len(p), _first_difference(r.tokens, a)) for i, (p, r, a) in enumerate(zip(prompts, results, alone))
           if r.tokens != a]
    assert bad == [], f"rows differing from their prompt alone (row, prompt tokens, where): {bad}"


def test_rows_stopping_mid_batch_leave_the_others_alone(gen) -> None:
    """Budgets from 3 to 128: stopped rows keep running as harmless rows, then the batch is re-packed into smaller
    buckets (compaction) with the live rows' inputs re-written."""
    from kern_run.batch import RowRequest

    prompts = _prompts(40, seed=7)
    budgets = [3 + (29 * i) % 126 for i in range(40)]
    alone = [_alone(gen, p, b) for p, b in zip(prompts, budgets)]
    results = _decoder(gen).run([RowRequest(p, b, stop_at_eos=False) for p, b in zip(prompts, budgets)])
    bad = [(i, _first_difference(r.tokens, a)) for i, (r, a) in enumerate(zip(results, alone)) if r.tokens != a]
    assert bad == []


@pytest.mark.parametrize("rows", [4, 64])
def test_a_seeded_request_is_the_same_alone_and_in_batches(gen, rows: int) -> None:
    from kern_run.batch import RowRequest
    from kern_run.sampling import SamplingParams

    mine = SamplingParams(temperature=0.8, top_k=50, top_p=0.95, seed=1234, repetition_penalty=1.1)
    target = _prompts(1, seed=99)[0]
    alone = _alone(gen, target, 96, mine)
    neighbours = [SamplingParams(), SamplingParams(temperature=1.0, seed=7), SamplingParams(temperature=0.6, min_p=0.1,
                  seed=8), SamplingParams(temperature=1.2, top_k=5, seed=9, frequency_penalty=0.5)]
    for trial in range(2):  # two different neighbourhoods, the request in another row each time
        others = _prompts(rows - 1, seed=100 + trial)
        reqs = [RowRequest(p, 96 - (i % 17), neighbours[(i + trial) % 4], stop_at_eos=False)
                for i, p in enumerate(others)]
        at = (rows // 2 + trial) % rows
        reqs.insert(at, RowRequest(target, 96, mine, stop_at_eos=False))
        got = _decoder(gen).run(reqs)[at]
        assert got.tokens == alone, f"trial {trial}, row {at}: {_first_difference(got.tokens, alone)}"
        assert got.sampling.seed == 1234


def test_warm_up_captures_the_buckets(gen) -> None:
    from kern_run.batch import RowRequest

    from kern_run.sampler_meta import read_sampler

    warm = gen.warm_up((1, 2, 4, 8), sampler=read_sampler(gen.facts.manifest, "tiny-en"))
    keys = {dict(k[1]).get("seqs") for k in gen.rt.graph_keys if k[0] == "decode"}
    assert {1, 2, 4, 8} <= keys
    print(warm.line(), file=sys.stderr)
    prompt = _prompts(1, seed=5)[0][:4]
    ttft = []
    for _ in range(3):
        t0 = time.perf_counter()
        r = _decoder(gen).run([RowRequest(prompt, 2, stop_at_eos=False)])[0]
        ttft.append((r.ttft_s, time.perf_counter() - t0))
    print(f"TTFT after the warm-up, 4-token prompt (s): {ttft}", file=sys.stderr)


def test_kern_run_stop_cuts_its_row(tmp_path: Path, gen, manifest: Path) -> None:
    """`kern run --prompts FILE --greedy` (tiny-en samples by default) prints each prompt's greedy text on its own
    line, in prompt order; with --stop S
    each line ends before its first S (here S is taken from the middle of the second prompt's text), the other
    lines unchanged unless they hold S too."""
    from typer.testing import CliRunner

    from kern_run.batch import RowRequest
    from kern_run.cli import app
    from kern_run.text import load_codec

    weights = ROOT / "models" / "qwen3-tiny-en"
    codec = load_codec(weights)
    texts = ["Once upon a time", "The little dog", "She said"]
    rows = _decoder(gen).run([RowRequest(tuple(codec.encode(t)), 48, stop_at_eos=False) for t in texts])
    full = [codec.decode(r.tokens) for r in rows]
    assert len(full[1]) > 12, full
    stop = full[1][6:10]
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(texts) + "\n")
    base = ["run", "--manifest", str(manifest), "--kernels", str(ROOT / "kernels"), "--weights", str(weights),
            "--prompts", str(prompts), "--max-tokens", "48", "--ignore-eos", "--capacity", "8192", "--greedy"]
    plain = CliRunner().invoke(app, base)
    assert plain.exit_code == 0, plain.stderr[-3000:]
    assert plain.stdout == "".join(f + "\n" for f in full)
    cut = CliRunner().invoke(app, [*base, "--stop", stop])
    assert cut.exit_code == 0, cut.stderr[-3000:]
    assert cut.stdout == "".join((f[:f.find(stop)] if stop in f else f) + "\n" for f in full)
    assert "warm-up " in cut.stderr and "(stop: stop)" in cut.stderr


@pytest.mark.xfail(strict=False, reason=(
    "the fast manifest is not batch-invariant: bucket 1 runs the fused M = 1 GEMVs and the wide partial, buckets "
    "2..64 cuBLASLt's heuristic with separate norms and the stream partial, so a greedy row can flip at a near-tie "
    "(H200, fourteenth session: 27 of 64 rows at bucket 64). A note, not a requirement: kern serve runs the "
    "invariant manifest"))
def test_fast_manifest_rows_against_alone_note() -> None:
    from kern_run.batch import RowRequest

    fast = _open(FAST)
    try:
        prompts = _prompts(SEQS, seed=SEQS)
        alone = [_alone(fast, p, STEPS) for p in prompts]
        results = _decoder(fast).run([RowRequest(p, STEPS, stop_at_eos=False) for p in prompts])
        bad = [i for i, (r, a) in enumerate(zip(results, alone)) if r.tokens != a]
        print(f"fast manifest, {SEQS} rows x {STEPS} steps: {len(bad)} rows differ from alone", file=sys.stderr)
        assert bad == []
    finally:
        fast.close()
