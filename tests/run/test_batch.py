"""kern_run.batch over a fake batched runtime (fake_rows_runtime.py): buckets, padding rows, ragged per-row
inputs, per-row stops, compaction, waves, the sampler's per-row params and history, the synchronous loop and the
top-logprobs path, prefix sharing inside a wave, and the warm-up at load. Every run is checked against the fake
model applied to each prompt's true sequence (expected_tokens), so a wrong input in any row changes its tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fake_rows_runtime import HIST_CAP, BatchFakeRuntime, batched_facts, expected_tokens

from kern_run.batch import (
    BatchDecoder, BatchOptions, RowRequest, bucket_for, buckets_upto, max_rows,
)
from kern_run.batch_pages import BatchPages
from kern_run.errors import InputError, SamplingError
from kern_run.generate import Generator
from kern_run.sampler_meta import read_sampler
from kern_run.sampling import SamplingParams


@pytest.fixture(scope="module")
def facts64(tmp_path_factory: pytest.TempPathFactory, kernels_dir: Path):
    return batched_facts(tmp_path_factory.mktemp("b") / "tiny-64.json", kernels_dir)


@pytest.fixture(scope="module")
def facts_argmax(tmp_path_factory: pytest.TempPathFactory, kernels_dir: Path):
    return batched_facts(tmp_path_factory.mktemp("a") / "tiny-64-argmax.json", kernels_dir, sampler=False)


def _prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 253, size=n).tolist() for n in lengths]


def _decoder(facts, rt=None, pipelined: bool = True, prefix: bool = False, lookahead: int = 4, compact: bool = True,
             eos: frozenset[int] = frozenset(), chunk: int = 16):
    from kern_pool import Prefix

    rt = rt if rt is not None else BatchFakeRuntime(facts)
    gen = Generator(rt, facts, eos, steps=rt if pipelined else None)
    pages = BatchPages(rt, 16, Prefix() if prefix else None, chunk, facts.prefill_batch_invariant)
    sampler = read_sampler(facts.manifest, "m.json")
    return BatchDecoder(gen, BatchOptions(chunk, lookahead=lookahead, compact=compact), sampler, pages), rt


def _decode_buckets(rt: BatchFakeRuntime) -> list[int]:
    return [c[1]["seqs"] for c in rt.calls if c[0] == "decode"]


# ---------------------------------------------------------------- buckets


def test_buckets() -> None:
    assert [bucket_for(n, 64) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 63, 64)] == [
        1, 2, 4, 4, 8, 8, 16, 16, 32, 64, 64, 64]
    assert max_rows(1) == 1 and max_rows(48) == 32 and max_rows(64) == 64 and max_rows(500) == 64
    assert bucket_for(1, 1) == 1 and bucket_for(20, 48) == 32
    for bad in (0, 33):
        with pytest.raises(ValueError):
            bucket_for(bad, 48)
    assert buckets_upto(5, 64) == (1, 2, 4, 8) and buckets_upto(1, 64) == (1,) and buckets_upto(700, 64)[-1] == 64
    assert buckets_upto(3, 1) == (1,)


# ---------------------------------------------------------------- greedy rows: alone == batched


@pytest.mark.parametrize("lengths, bucket", [([7], 1), ([1, 5, 17, 40], 4), ([3, 9, 33, 2, 60], 8)])
@pytest.mark.parametrize("pipelined", [True, False])
def test_each_row_decodes_as_alone(facts64, lengths: list[int], bucket: int, pipelined: bool) -> None:
    prompts = _prompts(lengths)
    dec, rt = _decoder(facts64, pipelined=pipelined)
    results = dec.run([RowRequest(tuple(p), 40) for p in prompts])
    for p, r in zip(prompts, results):
        assert r.tokens == expected_tokens(p, 40)[0] and r.stop_reason == "steps"
        assert r.prefill_tokens == len(p) - 1 and r.cached_tokens == 0
    assert set(_decode_buckets(rt)) == {bucket} and len(_decode_buckets(rt)) == 40
    assert dec.timings.pipelined == pipelined and rt.closed is False


def test_64_rows_and_a_second_wave(facts64) -> None:
    prompts = _prompts([1 + (7 * i) % 90 for i in range(70)], seed=1)
    dec, rt = _decoder(facts64, rt=BatchFakeRuntime(facts64, num_pages=1024))
    results = dec.run([RowRequest(tuple(p), 12) for p in prompts])
    assert [r.tokens for r in results] == [expected_tokens(p, 12)[0] for p in prompts]
    assert [r.wave for r in results] == [0] * 64 + [1] * 6
    assert dec.timings.waves == 2 and _decode_buckets(rt) == [64] * 12 + [8] * 12
    assert rt.kern_pool.held_pages == 0  # every lease returned


def test_a_full_pool_ends_the_wave_early(facts64) -> None:
    """Rows whose leases do not fit while others hold pages wait for the next wave; a prompt longer than the pool
    holds is refused before anything runs."""
    prompts = _prompts([40] * 10, seed=2)
    dec, rt = _decoder(facts64, rt=BatchFakeRuntime(facts64, num_pages=1 + 4 * 4))  # 4 rows of 4 pages at a time
    results = dec.run([RowRequest(tuple(p), 20) for p in prompts])
    assert [r.tokens for r in results] == [expected_tokens(p, 20)[0] for p in prompts]
    assert [r.wave for r in results] == [0] * 4 + [1] * 4 + [2] * 2 and dec.timings.pool_limited == 2
    dec, small = _decoder(facts64, rt=BatchFakeRuntime(facts64, num_pages=3))
    with pytest.raises(InputError, match="prompt 1 is 40 tokens, the KV pool and context hold 32"):
        dec.run([RowRequest(tuple(prompts[0]), 20)])
    assert small.calls == []


# ---------------------------------------------------------------- the inputs the decode reads


def test_ragged_rows_and_padding_rows_inputs(facts64) -> None:
    lengths = [5, 1, 33, 17, 2]
    prompts = _prompts(lengths, seed=3)
    dec, rt = _decoder(facts64)
    dec.run([RowRequest(tuple(p), 3) for p in prompts])
    first = rt.decodes[0]  # the segment start: every input written by the host
    assert first["token_ids"].tolist() == [p[-1] for p in prompts] + [0, 0, 0]
    assert first["positions"].tolist() == [n - 1 for n in lengths] + [0, 0, 0]
    assert first["seq_lens"].tolist() == lengths + [1, 1, 1]
    table = first["block_table"]
    assert not table[5:].any() and first["slot_mapping"][5:].tolist() == [0, 0, 0]  # scratch page 0, slot 0
    for r, n in enumerate(lengths):
        pages = -(-(n + 3) // 16)  # the lease: prompt + max tokens
        row = table[r].tolist()
        assert 0 not in row[:pages] and len(set(row[:pages])) == pages and set(row[pages:]) == {row[pages - 1]}
        assert first["slot_mapping"][r] == row[(n - 1) // 16] * 16 + (n - 1) % 16
    # later steps: the device advanced every row, padding rows inside page 0
    assert rt.decodes[2]["positions"].tolist() == [n + 1 for n in lengths] + [2, 2, 2]
    assert rt.decodes[2]["slot_mapping"][5:].tolist() == [2, 2, 2]
    params = rt.buf["sample_params"][:8].view("<f4")
    assert params[:, 0].tolist() == [0.0] * 8 and params[:, 2].tolist() == [1.0] * 8  # greedy, top_p 1
    # host writes only at the segment start (pipelined): one write of each input, none per step
    after_prefill = rt.writes[len(rt.writes) - 7:]
    assert sorted(after_prefill) == sorted(["token_ids", "positions", "slot_mapping", "seq_lens", "block_table",
                                            "cu_seqlens_q", "sample_params"])


# ---------------------------------------------------------------- stops, compaction, leases


def test_per_row_stops(facts64) -> None:
    prompts = _prompts([6, 9, 12, 4], seed=4)
    want = [expected_tokens(p, 30)[0] for p in prompts]
    others = set(want[0] + want[2][:7] + want[3][:11])
    k = next(k for k in range(2, 30) if want[1][k] not in others and want[1][k] not in want[1][:k])
    eos = frozenset({want[1][k]})  # row 1's (k+1)-th token, in no other row's output
    stop_at = {2: 7}  # row 2 answers True (a stop string) at its 7th token

    def on_token(i: int, info) -> bool:  # type: ignore[no-untyped-def]
        seen.setdefault(i, []).append(info.token)
        return len(seen[i]) == stop_at.get(i, -1)

    seen: dict[int, list[int]] = {}
    finished: list[tuple[int, str]] = []
    dec, rt = _decoder(facts64, eos=eos)
    reqs = [RowRequest(tuple(prompts[0]), 30), RowRequest(tuple(prompts[1]), 30), RowRequest(tuple(prompts[2]), 30),
            RowRequest(tuple(prompts[3]), 11)]
    results = dec.run(reqs, on_token, lambda i, r: finished.append((i, r.stop_reason)))
    assert [r.stop_reason for r in results] == ["steps", "eos", "stop", "steps"]
    assert results[0].tokens == want[0] and results[3].tokens == want[3][:11]
    assert results[1].tokens == want[1][:k + 1] and seen[1] == want[1][:k]  # the EOS token kept, not streamed
    assert results[2].tokens == want[2][:7] == seen[2]
    assert sorted(finished) == [(0, "steps"), (1, "eos"), (2, "stop"), (3, "steps")]
    ends = {i: len(results[i].tokens) for i in range(4)}
    assert [i for i, _ in finished] == sorted(range(4), key=lambda i: (ends[i], i))  # each row ends on its own
    assert _decode_buckets(rt)[0] == 4 and _decode_buckets(rt)[-1] == 1  # compacted as rows stopped


@pytest.mark.parametrize("compact", [True, False])
def test_stopped_rows_never_write_past_their_lease(facts64, compact: bool) -> None:
    """Budgets 2..40 with prompt lengths putting lease ends mid-page and on page ends: the fake refuses a live
    row's write outside its pages; a stopped row that would leave its lease forces a re-pack."""
    prompts = _prompts([14, 15, 16, 30, 31, 47, 3, 20], seed=5)
    budgets = [2, 1, 40, 18, 17, 1, 33, 9]
    dec, rt = _decoder(facts64, compact=compact)
    lease_pages = []
    orig = dec.pages.reserve

    def reserve(num_tokens, prompt_ids):  # type: ignore[no-untyped-def]
        got = orig(num_tokens, prompt_ids)
        lease_pages.append(tuple(got[0].page_ids()))
        return got

    dec.pages.reserve = reserve  # type: ignore[method-assign]
    results = dec.run([RowRequest(tuple(p), b) for p, b in zip(prompts, budgets)])
    assert [r.tokens for r in results] == [expected_tokens(p, b)[0] for p, b in zip(prompts, budgets)]
    for d in rt.decodes:  # every write of every non-padding row lands in one of its lease's pages
        for r in range(d["positions"].size):
            row = d["block_table"][r]
            if row.any():
                owner = next(pages for pages in lease_pages if pages[0] == row[0])
                assert d["slot_mapping"][r] // 16 in owner
                assert d["positions"][r] < len(owner) * 16
    assert dec.timings.segments > 1


def test_context_end_stops_a_row(facts64) -> None:
    rt = BatchFakeRuntime(facts64, num_pages=1 + 3 + 8)  # 176 positions: the pool caps one row's context
    dec, _ = _decoder(facts64, rt=rt)
    prompts = _prompts([170, 5], seed=6)
    results = dec.run([RowRequest(tuple(p), 40) for p in prompts])
    assert results[0].stop_reason == "context" and len(results[0].tokens) == 176 - 170 + 1
    assert results[0].tokens == expected_tokens(prompts[0], 7)[0]
    assert results[1].stop_reason == "steps" and results[1].tokens == expected_tokens(prompts[1], 40)[0]


def test_max_tokens_zero_and_empty_or_long_prompts(facts64) -> None:
    dec, rt = _decoder(facts64)
    results = dec.run([RowRequest((5, 6), 0), RowRequest((7,), 3)])
    assert results[0].tokens == [] and results[0].stop_reason == "steps"
    assert results[1].tokens == expected_tokens([7], 3)[0]
    with pytest.raises(InputError, match="prompt 2: empty prompt"):
        dec.run([RowRequest((5,), 3), RowRequest((), 3)])
    with pytest.raises(InputError, match="prompt 1 is 5000 tokens"):
        dec.run([RowRequest(tuple([4] * 5000), 3)])


# ---------------------------------------------------------------- sampling per row


def _sampled(seed: int, **kw) -> SamplingParams:  # type: ignore[no-untyped-def]
    return SamplingParams(temperature=0.8, top_p=0.9, seed=seed, **kw)


def test_params_land_in_their_rows(facts64) -> None:
    prompts = _prompts([4, 8, 12, 16, 20], seed=7)
    params = [SamplingParams(), _sampled(11), SamplingParams(), _sampled(2**64 - 1), _sampled(0)]
    dec, rt = _decoder(facts64)
    results = dec.run([RowRequest(tuple(p), 25, s) for p, s in zip(prompts, params)])
    for p, s, r in zip(prompts, params, results):
        assert r.tokens == expected_tokens(p, 25, s.temperature, s.seed or 0)[0]
        assert r.sampling == s
    words = rt.decodes and rt.buf["sample_params"][:8]
    seeds = [int(w[8]) | (int(w[9]) << 32) for w in words]
    assert seeds == [0, 11, 0, 2**64 - 1, 0, 0, 0, 0]
    assert words.view("<f4")[:, 0].tolist() == pytest.approx([0, 0.8, 0, 0.8, 0.8, 0, 0, 0])


@pytest.mark.parametrize("neighbours", [3, 63])
def test_a_seeded_row_alone_and_among_other_rows(facts64, neighbours: int) -> None:
    target = _prompts([13], seed=8)[0]
    mine = _sampled(1234)
    dec, _ = _decoder(facts64)
    alone = dec.run([RowRequest(tuple(target), 48, mine)])[0].tokens
    others = _prompts([1 + (5 * i) % 70 for i in range(neighbours)], seed=9)
    reqs = [RowRequest(tuple(p), 48 - i % 30, _sampled(i) if i % 2 else SamplingParams())
            for i, p in enumerate(others)]
    reqs.insert(neighbours // 2, RowRequest(tuple(target), 48, mine))
    dec, rt = _decoder(facts64, rt=BatchFakeRuntime(facts64, num_pages=1024))
    batched = dec.run(reqs)[neighbours // 2].tokens
    assert batched == alone == expected_tokens(target, 48, 0.8, 1234)[0]
    assert _decode_buckets(rt)[0] == bucket_for(neighbours + 1, 64)


def test_a_random_seed_is_drawn_once_per_request(facts64) -> None:
    dec, _ = _decoder(facts64)
    r = dec.run([RowRequest((9, 9, 9), 20, SamplingParams(temperature=1.0))])[0]
    assert r.sampling.seed is not None and r.tokens == expected_tokens([9, 9, 9], 20, 1.0, r.sampling.seed)[0]


@pytest.mark.parametrize("pipelined", [True, False])
def test_repetition_penalty_history_is_the_prompt_then_the_output(facts64, pipelined: bool) -> None:
    """Rows with a repetition penalty skip every id of their history (the fake's rule): the prompt's ids and
    every id generated so far, kept on the device by the history append and re-written by the host when rows
    are re-packed (budgets force compaction mid-run, moving rows to other slots)."""
    prompts = _prompts([5, 11, 2, 30, 7], seed=10)
    pen = SamplingParams(repetition_penalty=1.3)
    params = [pen, SamplingParams(), _sampled(5, repetition_penalty=1.2), pen, SamplingParams()]
    budgets = [3, 30, 30, 2, 4]
    dec, rt = _decoder(facts64, pipelined=pipelined)
    results = dec.run([RowRequest(tuple(p), b, s) for p, b, s in zip(prompts, budgets, params)])
    for p, b, s, r in zip(prompts, budgets, params, results):
        assert r.tokens == expected_tokens(p, b, s.temperature, s.seed or 0, s.repetition_penalty)[0]
    assert _decode_buckets(rt)[0] == 8 and _decode_buckets(rt)[-1] == 2  # re-packed twice, rows moved
    hist = rt.buf["hist_tokens"]
    assert hist.shape[1] == HIST_CAP


def test_logprobs_and_top_logprobs(facts64) -> None:
    prompts = _prompts([6, 3], seed=11)
    dec, rt = _decoder(facts64)
    reqs = [RowRequest(tuple(prompts[0]), 6, _sampled(3, logprobs=True)),
            RowRequest(tuple(prompts[1]), 6, SamplingParams(logprobs=True, top_logprobs=3))]
    got: list = []
    results = dec.run(reqs, lambda i, info: got.append((i, info)) and False)
    for p, req, r in zip(prompts, reqs, results):
        toks, lps = expected_tokens(p, 6, req.sampling.temperature, req.sampling.seed or 0)
        assert r.tokens == toks and r.logprobs == pytest.approx(lps)
    assert results[0].top_logprobs == []
    assert results[1].top_logprobs[0] == tuple(((results[1].tokens[0] + k) % 1000,
                                                pytest.approx(results[1].logprobs[0] - k)) for k in range(3))
    assert all(info.logprob is not None for _, info in got)
    programs = [c[0] for c in rt.calls if c[0] != "prefill"]
    assert programs[:4] == ["decode", "top_logprobs", "decode", "top_logprobs"]  # synchronous: one step at a time


def test_an_argmax_manifest_runs_greedy_rows_only(facts_argmax) -> None:
    prompts = _prompts([5, 9], seed=12)
    dec, rt = _decoder(facts_argmax)
    results = dec.run([RowRequest(tuple(p), 10) for p in prompts])
    assert [r.tokens for r in results] == [expected_tokens(p, 10)[0] for p in prompts] and not rt.packed
    for bad, field in ((SamplingParams(temperature=0.7), "temperature = 0.7"),
                       (SamplingParams(repetition_penalty=1.1), "repetition_penalty = 1.1"),
                       (SamplingParams(logprobs=True), "logprobs = 'on'")):
        with pytest.raises(SamplingError, match=f"prompt 2: {field} needs the GPU sampler"):
            dec.run([RowRequest((3,), 2), RowRequest((3,), 2, bad)])


# ---------------------------------------------------------------- prefixes shared inside a wave


@pytest.mark.parametrize("invariant, cached", [(True, [0, 40, 40, 24]), (False, [0, 32, 32, 16])])
def test_shared_prefix_prefilled_once_inside_a_wave(facts64, invariant: bool, cached: list[int]) -> None:
    """Each row's prompt KV is filed as soon as it is prefilled (the row keeps decoding): the later rows of the
    same wave resume it, the whole hit with batch-invariant prefill, else rounded down to the chunk (16)."""
    import dataclasses

    facts = dataclasses.replace(facts64, prefill_batch_invariant=invariant)
    shared = _prompts([40], seed=13)[0]
    prompts = [shared + tail for tail in _prompts([10, 7, 1], seed=14)] + [shared[:25]]
    dec, rt = _decoder(facts, prefix=True)
    results = dec.run([RowRequest(tuple(p), 16) for p in prompts])
    assert [r.tokens for r in results] == [expected_tokens(p, 16)[0] for p in prompts]
    assert [r.cached_tokens for r in results] == cached
    assert [r.prefill_tokens for r in results] == [len(p) - 1 - c for p, c in zip(prompts, cached)]
    assert dec.timings.waves == 1
    dec.pages.close()
    assert rt.kern_pool.held_pages == 0


# ---------------------------------------------------------------- the warm-up at load


def test_warm_up_touches_only_the_scratch_page(facts64) -> None:
    rt = BatchFakeRuntime(facts64)
    gen = Generator(rt, facts64, steps=rt)
    warm = gen.warm_up((1, 2, 4), sampler=read_sampler(facts64.manifest, "m"))
    assert [(c[0], c[1]["tokens"]) for c in rt.calls] == [("prefill", 1), ("prefill", 2), ("decode", 1),
                                                          ("decode", 2), ("decode", 4)]
    assert warm.prefill_tokens == (1, 2) and warm.buckets == (1, 2, 4) and rt.slot_kv == {}
    assert warm.line().startswith("warm-up ") and "prefill chunks of 1, 2 tokens" in warm.line()
    assert "decode at 1, 2, 4 rows" in warm.line()
    # a generation after the warm-up is unaffected
    dec, _ = _decoder(facts64, rt=rt)
    assert dec.run([RowRequest((4, 5, 6), 9)])[0].tokens == expected_tokens([4, 5, 6], 9)[0]


def test_the_single_sequence_generator_stays_greedy_after_a_sampled_batch(facts64) -> None:
    """Generator.generate (teacher forcing, kern test, the benches) writes row 0's params greedy: a batch that
    left a sampled row there does not leak into it."""
    from kern_run.generate import GenerateOptions

    dec, rt = _decoder(facts64)
    dec.run([RowRequest((5, 6, 7), 4, _sampled(77))])
    gen = Generator(rt, facts64, steps=rt)
    result = gen.generate([8, 9, 10, 11], GenerateOptions(20, 16, stop_at_eos=False))
    assert result.tokens == expected_tokens([8, 9, 10, 11], 20)[0] and result.timings.pipelined
