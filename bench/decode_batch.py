#!/usr/bin/env python3
"""Batched decode benchmark, Qwen3-4B shape: kern's decode step at seqs = batch against a torch.compile'd batched
step, both as one replayed CUDA graph, interleaved in one process (GPU machine).

    python3 bench/decode.py --batch 1,8,32,64 --contexts 128,2048 --manifest M --ckpt W
        [--steps 64] [--rounds 5] [--compile-mode default] [--only kern,torch] [--no-check] [--breakdown]
        [--timeline STEPS] [--variants B.json,C.json] [--json out.json]

(`bench/decode.py --batch ...` runs this file; `--weights` is an alias of `--ckpt`, `--context` of `--contexts`.)
A missing `--ckpt` is made first (tools/make_checkpoint.py --shape qwen3-4b). Every `--batch` value lies in
[1, 64] and within the manifest's `vars.seqs.max` (today's committed manifests: 1, so `--batch 1`; a batched
manifest comes from `kern manifest build --seqs-max 64`); a bad value is a usage error naming it.

What is timed, per (batch, context), all rows at that context:
- `kern`: the manifest's `decode` program issued with seqs = tokens = batch (its CUDA graph for that key, captured
  on first use). Row r has its own lease of the runtime's pool (ctx + 1 tokens: distinct page ids per row, the
  block-table row padded with the scratch page), token_ids / positions / slot_mapping / seq_lens / cu_seqlens_q
  for one token at position ctx (seq_len ctx + 1). A manifest with sampling inputs (`meta.caller.sampling`, or an
  input `sample_params`) gets greedy rows: `pack_params([SamplingParams()] * batch)`, empty histories
  (`pack_history`). Before every replay the inputs written for it (all but the block table) are copied back
  from a device snapshot, outside the timed events, so every replay is the same step at the same context even
  when the program advances its own inputs (kern_decode_advance). ms per step = CUDA events around the graph
  launch (the sampler and the step boundary included; no host readback). The KV pages hold whatever the pool
  hands out (zeros or earlier K/V): attention time does not depend on the values.
- `torch`: bench/torch_qwen3.py's `decode_step_batch`, [batch] tokens at per-row positions over a dense (not
  paged) cache [layers, batch, kv_heads, S, head_dim], S = ctx + 1 rounded up to 16 (each row attends over all
  S positions, masked to its position: it reads S >= ctx + 1 tokens of KV), its decoder layer through
  torch.compile(mode=`--compile-mode`, dynamic=False) (one compile per (batch, S): max-autotune takes ~80 s
  per shape, so the default is `default`; `eager` skips compiling), the step captured as one CUDA graph
  (GraphedStep), same weights. Events around the graph replay.
`--breakdown`: after kern's rounds at each (batch, ctx), every launch of one step timed alone (eager replay with
events between launches, the inputs restored before each of `--breakdown-replays` replays; bench/decode.py
`time_launches`), summed per op and kernel: where the batched step's time goes (issue 27's 64-row floor target).
`--variants B.json,...`: more manifests, each loaded as its own Runtime in the same process and timed in the same
rounds as `--manifest` (the order rotating with the peer's): a table of each variant's step against kern's and its
floor (what an A/B of two builds of the same model needs: one run, interleaved).
`--timeline STEPS`: STEPS graph replays traced by CUPTI (torch.profiler) per (batch, ctx), each op's duration,
start lag and advance of the step's end (bench/profile_step.py `timeline`: the advances sum to the step, PDL
overlaps included, a cuBLASLt call one op, the attention's partial and reduce a row each): what each op costs
the graph step, where `--breakdown` times launches alone.
Each side runs `--rounds` rounds of `--steps` replays, alternating which goes first; the tables quote medians
over all of them. Floor = (checkpoint bytes + batch x ctx x 2 x layers x kv_heads x head_dim x 2 bytes) /
4.3 TB/s. Printed last: ms per step, tokens/s (= batch / step), x floor, kern / peer, the issue's targets (bs=8 /
bs=1 step at ctx 128 <= 1.10, bs=32 at ctx 2048 >= 80% of the floor, faster than the peer everywhere).

`--check` (default on; `--no-check` skips): before timing, rows of ragged lengths (`--check-tokens` + 5 x (r % 4))
of distinct random prompts are prefilled one sequence at a time through kern's `prefill` and through the
peer's bs=1 forward; then for every batch one greedy decode step (position = the row's length) runs through
kern's graph and the peer's eager batched step, and both are judged against the peer's bs=1 forward of the
whole prompt (`judge`): max relative logit error <= `--check-rel-tol`, every row nearest its own reference row
(rows not mixed up), and kern's token = the argmax of its logits (top-1 agreement is printed). A failure
prints CHECK FAILED and makes the exit status 1.

The small-M kernel crossover (M = 1 GEMV vs tensor-core small-M vs cuBLASLt) is not timed here: bench/gemv.py,
bench/kernels.py.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from bench import decode as base

ROOT = Path(__file__).resolve().parents[1]
HBM_BYTES_PER_S = base.HBM_BYTES_PER_S  # 4.3e12
MAX_BATCH = 64  # the issue's batch range: 1..64 rows per step
PEERS = ("kern", "torch")
SAMPLING_DEFAULT_NAMES = {"params": "sample_params", "hist_tokens": "hist_tokens", "hist_counts": "hist_counts"}
# per-row decode inputs of the caller contract (docs/caller.md), written for row r at position p
ROW_INPUTS = ("token_ids", "positions", "slot_mapping", "seq_lens", "cu_seqlens_q", "block_table")
# how arrays of a manifest dtype cross write_input (bf16 / fp8 as raw bits, as the runtime exchanges them)
_NUMPY = {"i8": np.int8, "u8": np.uint8, "i16": np.int16, "i32": np.int32, "u32": np.uint32, "i64": np.int64,
          "u64": np.uint64, "f16": np.float16, "f32": np.float32, "f64": np.float64, "bf16": np.uint16,
          "fp8_e4m3": np.uint8, "fp8_e5m2": np.uint8}


class BatchSpecError(ValueError):
    """A bad `--batch` or `--contexts` value; the message names the flag, the value and the allowed range."""


# ---------------------------------------------------------------- pure parts (tested on CPU)


def _comma_ints(text: str, flag: str, low: int, high: int | None) -> list[int]:
    values: list[int] = []
    items = [t.strip() for t in str(text).split(",")]
    if not any(items):
        raise BatchSpecError(f"{flag} {text!r}: give a comma list of integers")
    bound = f"[{low}, {high}]" if high is not None else f">= {low}"
    for item in items:
        if not item:
            raise BatchSpecError(f"{flag} {text!r}: an empty entry (a stray comma)")
        try:
            value = int(item, 10)
        except ValueError:
            raise BatchSpecError(f"{flag} {item!r} is not an integer (allowed: {bound})") from None
        if value < low or (high is not None and value > high):
            raise BatchSpecError(f"{flag} {value} is outside {bound}")
        if value in values:
            raise BatchSpecError(f"{flag} {value} is given twice")
        values.append(value)
    return values


def parse_batches(text: str) -> list[int]:
    """`--batch` "1,8,32,64" -> [1, 8, 32, 64] (order kept): rows per decode step, each an integer in [1, 64],
    none repeated. Raises BatchSpecError naming the value ("x", 0, 65, an empty entry, a repeat)."""
    return _comma_ints(text, "--batch", 1, MAX_BATCH)


def parse_contexts(text: str) -> list[int]:
    """`--contexts` "128,2048" -> [128, 2048]: tokens of KV each row holds before the step (>= 1, none repeated).
    Raises BatchSpecError naming the value."""
    return _comma_ints(text, "--contexts", 1, None)


def seqs_max(manifest: Any) -> int:
    """The manifest's `vars.seqs.max` (1 when it declares no `seqs` var): the most rows one decode step takes."""
    var = manifest.vars.get("seqs")
    return int(var.max) if var is not None else 1


def check_batches_fit(batches: Sequence[int], limit: int, manifest: str | Path) -> None:
    """Every batch must be <= the manifest's seqs max `limit`. Raises BatchSpecError naming the batch, the
    manifest and its limit."""
    over = [b for b in batches if b > limit]
    if over:
        raise BatchSpecError(f"--batch {over[0]}: manifest {manifest} takes at most {limit} row(s) per decode step "
                             f"(vars.seqs.max); build a batched one (kern manifest build --seqs-max {MAX_BATCH}) "
                             f"or pass --batch values <= {limit}")


def kv_bytes_per_token(config: Mapping[str, Any]) -> int:
    """KV bytes one token of one row adds, from a Hugging Face config.json: K and V, every layer, bf16:
    2 * num_hidden_layers * num_key_value_heads * head_dim * 2 (147456 for Qwen3-4B)."""
    heads = int(config["num_key_value_heads"])
    head_dim = int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    return 2 * int(config["num_hidden_layers"]) * heads * head_dim * 2


def floor_ms(weight_bytes: int, batch: int, ctx: int, kv_per_token: int, hbm: float = HBM_BYTES_PER_S) -> float:
    """The memory floor of one decode step in ms: the weights read once plus every row's KV for `ctx` tokens,
    (weight_bytes + batch * ctx * kv_per_token) / hbm (bytes/s; 4.3 TB/s, docs/perf.md)."""
    return 1e3 * (weight_bytes + batch * ctx * kv_per_token) / hbm


def cache_size(ctx: int) -> int:
    """Positions per row of the torch peer's dense cache for a step at position `ctx`: ctx + 1 rounded up to 16."""
    return -(-(ctx + 1) // 16) * 16


def check_lengths(tokens: int, rows: int) -> list[int]:
    """Ragged prompt lengths of the check: row r holds `tokens` + 5 * (r % 4) tokens before its step."""
    return [tokens + 5 * (r % 4) for r in range(rows)]


def decode_vars(manifest: Any, batch: int) -> dict[str, int]:
    """The vars of a decode step of `batch` rows, one token each: tokens = seqs = batch (those the manifest
    declares; the runtime normalises the ones the program does not read)."""
    return {name: batch for name in ("tokens", "seqs") if name in manifest.vars}


def row_inputs(page_rows: Sequence[Sequence[int]], positions: Sequence[int], tokens: Sequence[int],
               page_tokens: int, width: int, scratch_page: int = 0) -> dict[str, np.ndarray]:
    """The caller contract's decode inputs for len(page_rows) rows, one token each: row r runs `tokens[r]` at
    `positions[r]` over pages `page_rows[r]`. Returns i32 arrays: token_ids, positions, slot_mapping
    (page_rows[r][p // page_tokens] * page_tokens + p % page_tokens), seq_lens (p + 1) [rows], cu_seqlens_q
    [rows + 1] (0, 1, .., rows: one query token per row) and block_table [rows, width] (padded with
    `scratch_page`). Raises ValueError when the lengths disagree, a row's pages exceed `width` or do not cover
    its position."""
    rows = len(page_rows)
    if not (len(positions) == len(tokens) == rows):
        raise ValueError(f"{rows} page rows, {len(positions)} positions, {len(tokens)} tokens")
    table = np.full((rows, width), scratch_page, dtype=np.int32)
    slots = np.zeros(rows, dtype=np.int32)
    for r, (pages, p) in enumerate(zip(page_rows, positions)):
        if len(pages) > width:
            raise ValueError(f"row {r}: {len(pages)} pages, the block table has room for {width}")
        if not 0 <= p < len(pages) * page_tokens:
            raise ValueError(f"row {r}: position {p} is not inside its {len(pages)} pages of {page_tokens}")
        table[r, :len(pages)] = pages
        slots[r] = pages[p // page_tokens] * page_tokens + p % page_tokens
    pos = np.asarray(positions, dtype=np.int32)
    return {"token_ids": np.asarray(tokens, dtype=np.int32), "positions": pos, "slot_mapping": slots,
            "seq_lens": pos + 1, "cu_seqlens_q": np.arange(rows + 1, dtype=np.int32), "block_table": table}


def sampling_names(manifest: Any) -> dict[str, str]:
    """The sampler's per-row input buffers of `manifest`, {"params": name, "hist_tokens": name, "hist_counts":
    name} for those present: names from `meta.caller.sampling` when it is an object naming them, else
    sample_params / hist_tokens / hist_counts. {} for a manifest without sampling inputs (argmax only). Raises
    ValueError when `meta.caller.sampling` is declared but names no input buffer for the params."""
    meta = manifest.meta if manifest.meta is not None else {}
    caller = meta.get("caller", {}) if isinstance(meta, Mapping) else {}
    declared = caller.get("sampling") if isinstance(caller, Mapping) else None
    names = dict(SAMPLING_DEFAULT_NAMES)
    if isinstance(declared, Mapping):
        names.update({k: v for k, v in declared.items() if k in names and isinstance(v, str)})
    found = {k: v for k, v in names.items() if v in manifest.buffers and manifest.buffers[v].kind == "input"}
    if declared and "params" not in found:
        raise ValueError(f"meta.caller.sampling is declared but the manifest has no input buffer {names['params']!r} "
                         "for the per-row sampling parameters")
    return found if "params" in found else {}


def sampling_inputs(manifest: Any, batch: int) -> dict[str, np.ndarray]:
    """Greedy sampler inputs for `batch` rows (empty without sampling inputs): the params buffer holds
    kern_run.sampling.pack_params([SamplingParams()] * batch) (48 bytes a row, every other byte zero), the
    histories pack_history of empty rows (token -1, count 0), each as the buffer's dtype and trailing shape."""
    from kern_manifest import var_max
    from kern_run.sampling import SamplingParams, pack_history, pack_params

    names = sampling_names(manifest)
    if not names:
        return {}
    at_max = var_max(manifest.vars)

    def as_rows(name: str, raw: bytes) -> np.ndarray:  # the bytes of `batch` rows as the buffer's dtype and shape
        spec = manifest.buffers[name]
        dtype = np.dtype(_NUMPY[spec.dtype])
        trailing = spec.shape_at(at_max)[1:]
        row_bytes = math.prod(trailing) * dtype.itemsize
        if trailing and row_bytes * batch != len(raw):
            raise ValueError(f"input {name!r} ({spec.dtype} {list(spec.shape_at(at_max))}) holds {row_bytes} bytes a "
                             f"row; the sampler's packing writes {len(raw) // batch}")
        array = np.frombuffer(raw, dtype=dtype).copy()
        return array.reshape(batch, *trailing) if trailing else array

    out = {names["params"]: as_rows(names["params"], pack_params([SamplingParams()] * batch))}
    if "hist_tokens" in names:
        cap = int(manifest.buffers[names["hist_tokens"]].shape_at(at_max)[-1])
        tokens, counts = pack_history([[] for _ in range(batch)], cap)
        out[names["hist_tokens"]] = as_rows(names["hist_tokens"], tokens)
        if "hist_counts" in names:
            out[names["hist_counts"]] = as_rows(names["hist_counts"], counts)
    return out


def judge(a: np.ndarray, ref: np.ndarray, rel_tol: float, tokens: np.ndarray | None = None) -> dict[str, Any]:
    """One greedy step of `rows` rows under test against a reference. `a`, `ref`: f32 [rows, vocab] logits;
    `tokens`: the step's own next tokens [rows] (kern's GPU output) or None. Passes when every row's max
    |a - ref| / max |ref| <= `rel_tol`, each row is strictly nearest its own reference row (rows >= 2: rows not
    mixed up; measured on every 8th vocabulary entry) and each token equals the argmax of its row of `a`. Top-1
    agreement with the reference is reported, not judged: two correct bf16 computations of a 36-layer random
    model disagree on ~7% of near-tied steps (docs/perf.md), and a top-1 flip always comes with an error of at
    least half the reference's top-2 margin, so no margin rule can tell a flip from a near tie that the error
    bound does not. Returns {"ok", "rows", "max_rel", "top1", "mixed", "token_vs_argmax", "failures": [text]}.
    Raises ValueError unless both are [rows, vocab] of one shape."""
    from kern_run.compare import compare_logits

    a = np.asarray(a, dtype=np.float32)
    ref = np.asarray(ref, dtype=np.float32)
    if a.shape != ref.shape or a.ndim != 2:
        raise ValueError(f"logits [rows, vocab] expected, got {list(a.shape)} and {list(ref.shape)}")
    cmp = compare_logits(a, ref, 0.0)
    rows = a.shape[0]
    mixed = []
    if rows > 1:  # on every 8th vocabulary entry: enough to tell rows apart, 8x cheaper at 64 rows
        sub_a, sub_ref = a[:, ::8], ref[:, ::8]
        scale = np.maximum(np.abs(sub_ref).max(axis=1), 1e-30)  # [rows]
        for r in range(rows):
            err = np.abs(sub_ref - sub_a[r]).max(axis=1) / scale  # row r against every reference row
            if int(np.argmin(err)) != r or np.sum(err <= err[r]) > 1:
                mixed.append(r)
    wrong_tokens = []
    if tokens is not None:
        argmax = np.argmax(a, axis=1)
        wrong_tokens = [r for r in range(rows) if int(tokens[r]) != int(argmax[r])]
    failures = []
    if cmp.max_rel > rel_tol:
        failures.append(f"max relative logit error {cmp.max_rel:.3g} > {rel_tol:g}")
    if mixed:
        failures.append(f"rows {mixed[:8]} are nearer another row's reference than their own")
    if wrong_tokens:
        failures.append(f"the step's token is not the argmax of its logits at rows {wrong_tokens[:8]}")
    return {"ok": not failures, "rows": rows, "max_rel": cmp.max_rel, "top1": cmp.top1_agreement, "mixed": mixed,
            "token_vs_argmax": wrong_tokens, "failures": failures}


# ---------------------------------------------------------------- table (tested on CPU)


def _step(results: list[dict[str, Any]], side: str, batch: int, ctx: int) -> float | None:
    r = next((r for r in results if r.get("side") == side and r.get("batch") == batch and r.get("ctx") == ctx), None)
    return None if r is None else float(r["ms_per_step"])


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def targets(results: list[dict[str, Any]], floors: Mapping[tuple[int, int], float]) -> list[str]:
    """The issue's three targets from the step records: bs=8 / bs=1 step at ctx 128 (<= 1.10), bs=32 at ctx
    2048 as % of its floor (>= 80%), kern faster than the peer at every measured (batch, ctx)."""
    def verdict(ok: bool | None) -> str:
        return "not measured" if ok is None else ("met" if ok else "MISSED")

    lines = []
    for side in PEERS:
        k8, k1 = _step(results, side, 8, 128), _step(results, side, 1, 128)
        ratio = _ratio(k8, k1)
        note = f" (target <= 1.10: {verdict(None if ratio is None else ratio <= 1.10)})" if side == "kern" else ""
        lines.append(f"bs=8 / bs=1 step at ctx 128, {side}: " + ("-" if ratio is None else f"{ratio:.3f}x") + note)
    for side in PEERS:
        ms, fl = _step(results, side, 32, 2048), floors.get((32, 2048))
        pct = None if ms is None or fl is None else 100 * fl / ms
        note = f" (target >= 80%: {verdict(None if pct is None else pct >= 80)})" if side == "kern" else ""
        lines.append(f"bs=32 at ctx 2048, {side}: " + ("-" if pct is None else f"{pct:.1f}% of floor") + note)
    pairs = sorted({(r["batch"], r["ctx"]) for r in results if r.get("side") in PEERS})
    ratios = {(b, c): _ratio(_step(results, "kern", b, c), _step(results, "torch", b, c)) for b, c in pairs}
    measured = {k: v for k, v in ratios.items() if v is not None}
    slower = [f"bs={b} ctx {c} ({v:.2f}x)" for (b, c), v in measured.items() if v >= 1.0]
    ok = None if not measured else not slower
    lines.append(f"kern faster than the peer at every measured batch and context: {verdict(ok)}"
                 + (f"; slower at {', '.join(slower)}" if slower else "")
                 + (f" ({len(measured)} of {len(pairs)} measured on both sides)" if measured else ""))
    return lines


def variant_tag(path: str | Path) -> str:
    """A --variants manifest's label in the tables: its file stem."""
    return Path(path).stem


def variant_lines(results: list[dict[str, Any]], batches: Sequence[int], contexts: Sequence[int],
                  floors: Mapping[tuple[int, int], float]) -> list[str]:
    """The --variants table: per (ctx, batch), kern's step on --manifest, then each variant's ms, its ratio to
    --manifest's and its % of the floor. [] without variant records."""
    tags = list(dict.fromkeys(r["tag"] for r in results if r.get("side") == "variant"))
    if not tags:
        return []
    head = f"{'batch':>5s} {'ctx':>6s} {'floor ms':>9s} | {'kern ms':>8s} {'% floor':>7s}" + "".join(
        f" | {t[:18]:>18s} {'/ kern':>6s} {'% floor':>7s}" for t in tags)
    lines = ["", "===== variants (interleaved with kern's rounds in the same process; median ms per step)", head,
             "-" * len(head)]
    for c in contexts:
        for b in batches:
            fl = floors[(b, c)]
            k = _step(results, "kern", b, c)
            row = f"{b:>5d} {c:>6d} {fl:>9.3f} | " + (f"{k:>8.3f} {100 * fl / k:>6.1f}%" if k else f"{'-':>8s} {'':>7s}")
            for t in tags:
                r = next((r for r in results if r.get("side") == "variant" and r.get("tag") == t
                          and r.get("batch") == b and r.get("ctx") == c), None)
                if r is None:
                    row += f" | {'-':>18s} {'':>6s} {'':>7s}"
                    continue
                ms = float(r["ms_per_step"])
                ratio = _ratio(ms, k)
                row += f" | {ms:>18.3f} " + (f"{ratio:>6.3f}" if ratio is not None else f"{'-':>6s}") + \
                    f" {100 * fl / ms:>6.1f}%"
            lines.append(row)
    return lines


def table(results: list[dict[str, Any]], batches: Sequence[int], contexts: Sequence[int], weight_bytes: int,
          kv_per_token: int, notes: Sequence[str] = ()) -> str:
    """The batched decode table: one line per (ctx, batch): floor ms, then per side ms/step, tokens/s, x floor,
    then kern / peer; the targets, the check verdicts and `notes` after it."""
    floors = {(b, c): floor_ms(weight_bytes, b, c, kv_per_token) for b in batches for c in contexts}
    peer = next((r for r in results if r.get("side") == "torch"), None)
    peer_label = peer["label"] if peer else "torch peer"
    steps = next((r["steps"] for r in results if r.get("side") == "kern"), None)
    head = (f"{'batch':>5s} {'ctx':>6s} {'floor ms':>9s} | {'kern ms':>8s} {'tok/s':>8s} {'x floor':>7s} | "
            f"{'peer ms':>8s} {'tok/s':>8s} {'x floor':>7s} | {'kern/peer':>9s}")
    over = f" over {steps} steps" if steps else ""
    lines = ["", f"===== batched decode, one CUDA-graph step per row batch (median ms per step{over}); floor = "
             f"(weights {weight_bytes / 1e9:.2f} GB + batch x ctx x {kv_per_token} B of KV) / "
             f"{HBM_BYTES_PER_S / 1e12:.1f} TB/s",
             f"peer: {peer_label}", head, "-" * len(head)]

    def cells(ms: float | None, batch: int, fl: float) -> str:
        if ms is None:
            return f"{'-':>8s} {'':>8s} {'':>7s}"
        return f"{ms:>8.3f} {1e3 * batch / ms:>8.0f} {ms / fl:>7.2f}"

    for c in contexts:
        for b in batches:
            fl = floors[(b, c)]
            k, t = _step(results, "kern", b, c), _step(results, "torch", b, c)
            ratio = _ratio(k, t)
            lines.append(f"{b:>5d} {c:>6d} {fl:>9.3f} | {cells(k, b, fl)} | {cells(t, b, fl)} | "
                         + (f"{ratio:>9.2f}" if ratio is not None else f"{'-':>9s}"))
    lines += variant_lines(results, batches, contexts, floors)
    lines += ["", *targets(results, floors)]
    for r in results:
        if r.get("side") == "check":
            verdict = "ok" if r["ok"] else "CHECK FAILED"
            parts = [f"{side} max rel {r[side]['max_rel']:.2e}, top-1 {100 * r[side]['top1']:.0f}%"
                     + ("" if r[side]["ok"] else f" ({'; '.join(r[side]['failures'])})")
                     for side in PEERS if side in r]
            lines.append(f"check bs={r['batch']}: {verdict}: " + "; ".join(parts))
    for r in results:
        if r.get("side") == "breakdown":
            lines += base.breakdown_lines(f", batch {r['batch']}, ctx {r['ctx']}", r["summary"], r["sum_us"])
        if r.get("side") == "timeline":
            tag = f" [{r['tag']}]" if r.get("tag") else ""
            lines += [f"-- graph timeline{tag}, batch {r['batch']}, ctx {r['ctx']} (CUPTI; GPU us per step "
                      f"{r['step_us']:.1f}; advance = what the op adds to the step's end):",
                      f"   {'op':24s} {'n':>3s} {'dur us':>7s} {'lag us':>7s} {'adv us':>7s} {'adv us/step':>11s} {'share':>6s}"]
            lines += [f"   {o['op'][:24]:24s} {o['n']:>3d} {o['dur_us']:7.2f} {o['lag_us']:7.2f} {o['adv_us']:7.2f} "
                      f"{o['adv_us_per_step']:11.1f} {100 * o['adv_us_per_step'] / r['step_us']:5.1f}%" for o in r["ops"]]
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)


# ---------------------------------------------------------------- kern side (GPU)


class InputSnapshot:
    """Device copies of a step's inputs as written (`names` -> bytes), taken on the runtime's stream after the
    writes; `restore()` enqueues their copy back before a replay (cuMemcpyDtoDAsync), `close()` frees them."""

    def __init__(self, rt: Any, nbytes: Mapping[str, int]) -> None:
        cu = base._cu()
        self.rt = rt
        self.pairs: list[tuple[int, int, int]] = []  # (input address, snapshot address, bytes)
        for name, n in nbytes.items():
            if n <= 0:
                continue
            snap = int(base._check(cu.cuMemAlloc(n)))
            address = int(rt.address_of(name))
            base._check(cu.cuMemcpyDtoDAsync(snap, address, n, rt.stream))
            self.pairs.append((address, snap, n))

    def restore(self) -> None:
        cu = base._cu()
        for address, snap, n in self.pairs:
            base._check(cu.cuMemcpyDtoDAsync(address, snap, n, self.rt.stream))

    def close(self) -> None:
        self.rt.synchronize()  # no copy of ours still in flight
        cu = base._cu()
        while self.pairs:
            _, snap, _ = self.pairs.pop()
            base._check(cu.cuMemFree(snap))


class KernRows:
    """kern's decode program at seqs = `batch`, every row at position `positions[r]` over its own lease of
    `positions[r] + 1` tokens. `write(tokens)` writes the step's inputs (and snapshots them), `time(steps)`
    replays the graph `steps` times and returns the GPU ms of each, `close()` releases the leases."""

    def __init__(self, rt: Any, facts: Any, positions: Sequence[int], leases: Sequence[Any] | None = None) -> None:
        """`leases`: rows' leases to use instead of fresh ones (not released by `close`)."""
        self.rt = rt
        self.facts = facts
        self.manifest = facts.manifest
        self.batch = len(positions)
        self.positions = list(positions)
        self.vars = decode_vars(self.manifest, self.batch)
        self.owned = leases is None
        self.leases = [rt.lease(p + 1) for p in positions] if leases is None else list(leases)
        self.pages = [list(lease.page_ids()) for lease in self.leases]
        self.snapshot: InputSnapshot | None = None

    def write(self, tokens: Sequence[int]) -> None:
        inputs = row_inputs(self.pages, self.positions, tokens, int(self.rt.page_tokens), self.facts.pages_per_seq,
                            int(self.rt.scratch_page_id or 0))
        inputs = {k: v for k, v in inputs.items() if k in self.manifest.buffers}
        inputs.update(sampling_inputs(self.manifest, self.batch))
        for name, array in inputs.items():
            self.rt.write_input(name, array)
        if self.snapshot is not None:
            self.snapshot.close()
        self.snapshot = InputSnapshot(self.rt, {k: v.nbytes for k, v in inputs.items() if k != "block_table"})

    def issue(self) -> None:
        """One graph step from the written inputs (restored first)."""
        assert self.snapshot is not None, "write() first"
        self.snapshot.restore()
        self.rt.issue("decode", self.vars)

    def time(self, steps: int) -> list[float]:
        ev = base.TimingEvents(self.rt.stream)
        starts = [ev.new() for _ in range(steps)]
        ends = [ev.new() for _ in range(steps)]
        assert self.snapshot is not None, "write() first"
        for i in range(steps):
            self.snapshot.restore()
            ev.record(starts[i])
            self.rt.issue("decode", self.vars)
            ev.record(ends[i])
        ev.sync(ends[-1])
        out = [ev.ms(s, e) for s, e in zip(starts, ends)]
        ev.destroy(starts + ends)
        return out

    def breakdown(self, replays: int) -> list[dict[str, Any]]:
        """Each launch of one step timed alone (bench/decode.py `time_launches`, eager), the written inputs restored
        before every replay."""
        assert self.snapshot is not None, "write() first"
        return base.time_launches(self.rt, self.vars, replays, before=self.snapshot.restore)

    def timeline(self, steps: int, trace: Path) -> dict[str, Any]:
        """`steps` graph replays traced by CUPTI (torch.profiler), summarised per op as bench/profile_step.py
        `--graph` does: each op's duration, start lag and advance of the step's end (us; the advances sum to the
        step's GPU time). The launches are named by one hooked eager replay first; the trace goes to `trace`."""
        from torch.profiler import ProfilerActivity, profile

        from bench.profile_step import load_chrome_trace, program_launches, timeline

        assert self.snapshot is not None, "write() first"
        self.snapshot.restore()
        ops = program_launches(self.rt, "decode", self.vars)
        self.time(2)  # the graph replays once more before the range
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            self.time(steps)
        prof.export_chrome_trace(str(trace))
        return timeline(load_chrome_trace(trace), ops, f", batch {self.batch}")

    def close(self) -> None:
        if self.snapshot is not None:
            self.snapshot.close()
            self.snapshot = None
        if self.owned:
            for lease in self.leases:
                lease.close()
        self.leases = []


def kern_prefill(rt: Any, facts: Any, pages: Sequence[int], ids: Sequence[int], chunk: int) -> None:
    """Prefill `ids` (positions 0..len-1) of one sequence over `pages` through the `prefill` program, as the
    caller contract does (docs/caller.md): block-table row 0 = `pages`, chunks of `chunk` tokens."""
    from kern_run.generate import slot_mapping

    width = facts.pages_per_seq
    row = np.full((1, width), int(rt.scratch_page_id or 0), dtype=np.int32)
    row[0, :len(pages)] = pages
    rt.write_input("block_table", row)
    for lo in range(0, len(ids), chunk):
        piece = np.asarray(ids[lo:lo + chunk], dtype=np.int32)
        n = len(piece)
        rt.write_input("token_ids", piece)
        rt.write_input("positions", np.arange(lo, lo + n, dtype=np.int32))
        rt.write_input("slot_mapping", slot_mapping(pages, int(rt.page_tokens), lo, lo + n))
        rt.write_input("seq_lens", np.asarray([lo + n], dtype=np.int32))
        rt.write_input("cu_seqlens_q", np.asarray([0, n], dtype=np.int32))
        rt.issue("prefill", {name: v for name, v in (("tokens", n), ("seqs", 1)) if name in facts.manifest.vars})


def kern_step_logits(rows: KernRows, tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """One graph step of `rows` with `tokens`: (next tokens i64 [batch], logits f32 [batch, vocab])."""
    from kern_run.generate import bf16_to_f32
    from kern_run.sampling import unpack_packed

    rows.write(tokens)
    rows.issue()
    # the token id is bits 0..31 of next_token (a sampler manifest packs its logprob above; an argmax one holds the
    # plain id): kern_run.sampling.unpack_packed
    nxt = unpack_packed(np.asarray(rows.rt.read_output("next_token", rows=rows.batch)).reshape(-1))[0].astype(np.int64)
    logits = bf16_to_f32(np.asarray(rows.rt.read_buffer("logits", rows=rows.batch))).reshape(rows.batch, -1)
    return nxt, logits


# ---------------------------------------------------------------- torch side (GPU)


class PeerRows:
    """The torch peer's batched step for `batch` rows at position `ctx`, captured as one CUDA graph with its
    layer compiled by torch.compile(mode) (`mode` "eager": not compiled). `time(steps)` -> GPU ms each."""

    def __init__(self, model: Any, batch: int, ctx: int, tokens: Sequence[int], mode: str) -> None:
        import torch

        from bench.torch_qwen3 import GraphedStep

        self.model = model
        model.set_batch_cache(batch, cache_size(ctx))
        self.mode = mode
        self.compile_error = ""
        t0 = time.perf_counter()
        with torch.inference_mode():
            try:
                self._layer(mode)
                self.graphed = GraphedStep(model.decode_step_batch, rows=batch)
            except Exception as exc:  # noqa: BLE001 - a compile failure: say so, time the eager layer instead
                if mode == "eager":
                    raise
                self.compile_error = f"{type(exc).__name__}: {str(exc)[:200]}"
                self.mode = "eager"
                self._layer("eager")
                self.graphed = GraphedStep(model.decode_step_batch, rows=batch)
            self.graphed.token.copy_(torch.as_tensor(list(tokens), dtype=torch.int64))
            self.graphed.position.fill_(ctx)
        torch.cuda.synchronize()
        self.build_s = time.perf_counter() - t0

    def _layer(self, mode: str) -> None:
        import torch

        if mode == "eager":
            self.model.batch_layer_fn = self.model.batch_layer
            return
        torch._dynamo.reset()
        self.model.batch_layer_fn = torch.compile(self.model.batch_layer, mode=mode, dynamic=False)

    @property
    def label(self) -> str:
        how = "eager layer" if self.mode == "eager" else f"torch.compile({self.mode})"
        return f"torch batched step ({how}), one CUDA graph, dense [batch, S] KV cache"

    def time(self, steps: int) -> list[float]:
        import torch

        starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
        with torch.inference_mode():
            for i in range(steps):
                starts[i].record()
                self.graphed.graph.replay()
                ends[i].record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]

    def close(self) -> None:
        import torch

        del self.graphed
        self.model.kb = self.model.vb = None
        self.model.batch_layer_fn = self.model.batch_layer
        torch.cuda.empty_cache()


def peer_reference(model: Any, prompts: Sequence[Sequence[int]]) -> tuple[np.ndarray, Any, Any]:
    """The peer's bs=1 forward of each whole prompt: (logits f32 [rows, vocab] at each prompt's last position,
    K and V of every row, bf16 [layers, rows, kv_heads, S, head_dim], S = cache_size(longest prompt))."""
    import torch

    size = cache_size(max(len(p) for p in prompts))
    model.resize_cache(size)
    device = model.k_cache.device
    logits, ks, vs = [], [], []
    with torch.inference_mode():
        for ids in prompts:
            t = torch.as_tensor(list(ids), dtype=torch.int64, device=device)
            logits.append(model.forward(t, torch.arange(len(ids), device=device))[-1].float().cpu().numpy())
            ks.append(model.k_cache.permute(0, 2, 1, 3).clone())  # [layers, kv_heads, S, D]
            vs.append(model.v_cache.permute(0, 2, 1, 3).clone())
    return np.stack(logits), torch.stack(ks, 1), torch.stack(vs, 1)


def peer_batch_logits(model: Any, k_rows: Any, v_rows: Any, tokens: Sequence[int], positions: Sequence[int]) -> np.ndarray:
    """The peer's eager batched step of len(tokens) rows over caches copied from `k_rows` / `v_rows`: logits f32."""
    import torch

    b = len(tokens)
    model.set_batch_cache(b, k_rows.shape[3])
    model.batch_layer_fn = model.batch_layer
    device = model.kb.device
    with torch.inference_mode():
        model.kb.copy_(k_rows[:, :b])
        model.vb.copy_(v_rows[:, :b])
        out = model.forward_batch(torch.as_tensor(list(tokens), dtype=torch.int64, device=device),
                                  torch.as_tensor(list(positions), dtype=torch.int64, device=device))
    logits = out.float().cpu().numpy()
    model.kb = model.vb = None
    return logits


# ---------------------------------------------------------------- the worker


def run_check(rt: Any, facts: Any, model: Any, batches: Sequence[int], args: argparse.Namespace,
              out: str) -> None:
    """The `--check` step (module docstring): one record {"side": "check", "batch", "ok", "kern", "torch"} per
    batch, each side's `judge` against the peer's bs=1 forward."""
    rows = max(batches)
    lengths = check_lengths(args.check_tokens, rows)
    prompts = [base._prompt(n + 1, 1000 + r, vocab=int(model.shape.vocab)) for r, n in enumerate(lengths)]
    ref, k_rows, v_rows = peer_reference(model, prompts)  # the reference of both sides
    chunk = min(512, facts.tokens_max)
    kern = KernRows(rt, facts, lengths) if "kern" in args.only_peers else None
    if kern is not None:
        for r, ids in enumerate(prompts):
            kern_prefill(rt, facts, kern.pages[r], ids[:-1], chunk)
    last = [p[-1] for p in prompts]
    for b in batches:
        rec: dict[str, Any] = {"side": "check", "batch": b, "lengths": lengths[:b]}
        if kern is not None:
            sub = KernRows(rt, facts, lengths[:b], leases=kern.leases[:b])  # the first b prefilled rows
            tokens, logits = kern_step_logits(sub, last[:b])
            sub.close()
            rec["kern"] = judge(logits, ref[:b], args.check_rel_tol, tokens)
        if "torch" in args.only_peers:
            rec["torch"] = judge(peer_batch_logits(model, k_rows, v_rows, last[:b], lengths[:b]), ref[:b],
                                 args.check_rel_tol)
        rec["ok"] = all(rec[s]["ok"] for s in PEERS if s in rec)
        base._emit(out, rec)
    if kern is not None:
        kern.close()
    del k_rows, v_rows


def worker(args: argparse.Namespace, out: str) -> None:
    """Everything on the GPU, one process: load kern and the torch peer, `--check`, then per (ctx, batch) the
    interleaved rounds; one JSON line per result as it is measured (a killed worker leaves what it measured)."""
    from kern_runtime import Capacity, Runtime, SafetensorsTensors
    from kern_run.preflight import read_manifest

    cu = base._cu()
    base._check(cu.cuInit(0))
    context = base._check(cu.cuDevicePrimaryCtxRetain(base._check(cu.cuDeviceGet(args.gpu))))
    base._check(cu.cuCtxSetCurrent(context))
    facts = read_manifest(args.manifest)
    batches, contexts = args.batches, args.context_list
    page = facts.page_tokens
    longest = max(max(contexts), max(check_lengths(args.check_tokens, max(batches)))) + 1
    capacity = max(batches) * (-(-longest // page) + 1) * page + 4 * page
    free0, _ = base._check(cu.cuMemGetInfo())
    t0 = time.perf_counter()
    def load(manifest: Any) -> Any:
        return Runtime.load(manifest, str(args.kernels), SafetensorsTensors.open(str(args.ckpt)), gpu=args.gpu,
                            capacity=Capacity(tokens=capacity, seqs=max(batches)))

    rt = None
    variants: list[tuple[str, Any, Any]] = []  # (tag, facts, runtime) of each --variants manifest
    if "kern" in args.only_peers:
        rt = load(facts.manifest)
        for path in args.variant_list:
            vfacts = read_manifest(path)
            variants.append((variant_tag(path), vfacts, load(vfacts.manifest)))
    kern_load_s = time.perf_counter() - t0
    free1, _ = base._check(cu.cuMemGetInfo())
    model = None
    torch_load_s = 0.0
    if "torch" in args.only_peers or args.check:
        import torch

        from bench.torch_qwen3 import TorchQwen3

        torch.cuda.set_device(args.gpu)
        t0 = time.perf_counter()
        model = TorchQwen3(args.ckpt, max_context=cache_size(longest))
        torch_load_s = time.perf_counter() - t0
    base._emit(out, {"side": "setup", "manifest": str(args.manifest), "seqs_max": seqs_max(facts.manifest),
                     "sampling": sorted(sampling_names(facts.manifest).values()), "kern_load_s": kern_load_s,
                     "torch_load_s": torch_load_s, "kern_device_gb": (free0 - free1) / 1e9, "pool_tokens": capacity})
    if args.check:
        run_check(rt, facts, model, batches, args, out)
    vocab = int(json.loads((Path(args.ckpt) / "config.json").read_text())["vocab_size"])
    rng = np.random.default_rng(7)

    def warm_rows(runtime: Any, rfacts: Any, ctx: int, tokens: list[int]) -> KernRows:
        rows = KernRows(runtime, rfacts, [ctx] * len(tokens))
        rows.write(tokens)
        rows.time(4)  # the first captures the graph
        return rows

    def emit_timeline(rows: KernRows, b: int, ctx: int, tag: str | None) -> None:
        trace = Path(out).with_name(f"trace-{tag + '-' if tag else ''}b{b}-ctx{ctx}.json")
        base._emit(out, {"side": "timeline", **({"tag": tag} if tag else {}), "batch": b, "ctx": ctx,
                         "trace": str(trace), **rows.timeline(args.timeline, trace)})

    for ctx in contexts:
        for b in batches:
            tokens = rng.integers(0, min(vocab, 151643), size=b).tolist()  # row r's token at its step
            kern = peer = None
            alts: list[tuple[str, KernRows]] = []
            if "kern" in args.only_peers:
                kern = warm_rows(rt, facts, ctx, tokens)
                alts = [(tag, warm_rows(vrt, vfacts, ctx, tokens)) for tag, vfacts, vrt in variants]
            if "torch" in args.only_peers:
                peer = PeerRows(model, b, ctx, tokens, args.compile_mode)
                peer.time(4)
            samples: dict[str, list[float]] = {"kern": [], "torch": [], **{tag: [] for tag, _ in alts}}
            for i in range(args.rounds):
                order = [("kern", kern), *alts, ("torch", peer)]
                for side, runner in (order if i % 2 == 0 else order[::-1]):
                    if runner is not None:
                        samples[side] += runner.time(args.steps)
            common = {"batch": b, "ctx": ctx, "rounds": args.rounds}
            for tag, alt in alts:
                base._emit(out, {"side": "variant", "tag": tag, **common, "ms_per_step": statistics.median(samples[tag]),
                                 "stats": base._ms(samples[tag]), "steps": len(samples[tag])})
                if args.timeline:
                    emit_timeline(alt, b, ctx, tag)
                alt.close()
            if kern is not None:
                base._emit(out, {"side": "kern", "label": f"kern {Path(args.manifest).name}", **common,
                                 "ms_per_step": statistics.median(samples["kern"]), "stats": base._ms(samples["kern"]),
                                 "steps": len(samples["kern"])})
                if args.breakdown:
                    launches = kern.breakdown(args.breakdown_replays)
                    base._emit(out, {"side": "breakdown", "batch": b, "ctx": ctx, **base.breakdown_record(launches)})
                if args.timeline:
                    emit_timeline(kern, b, ctx, None)
                kern.close()
            if peer is not None:
                base._emit(out, {"side": "torch", "label": peer.label, "mode": peer.mode, **common,
                                 "compile_error": peer.compile_error, "build_s": peer.build_s,
                                 "ms_per_step": statistics.median(samples["torch"]),
                                 "stats": base._ms(samples["torch"]), "steps": len(samples["torch"]),
                                 "kv_positions_per_row": cache_size(ctx)})
                peer.close()
    for _, _, vrt in variants:
        vrt.close()
    if rt is not None:
        rt.close()


# ---------------------------------------------------------------- orchestration


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", default="1,8,32,64", help="comma list of rows per decode step, each in [1, 64]")
    p.add_argument("--contexts", "--context", dest="contexts", default="128,2048",
                   help="comma list of KV tokens per row before the step")
    p.add_argument("--ckpt", "--weights", dest="ckpt", type=Path,
                   default=Path(os.environ.get("KERN_WEIGHTS", "/tmp/kern-weights")) / "qwen3-4b")
    p.add_argument("--manifest", type=Path, default=ROOT / "manifests" / "qwen3-4b-v2.json")
    p.add_argument("--variants", default="", help="comma list of more manifests, each loaded beside --manifest and "
                   "timed in the same rounds (kern side only)")
    base.add_peer_args(p, PEERS, only_help="comma list of kern, torch")
    p.add_argument("--steps", type=int, default=64, help="replays per side per round")
    p.add_argument("--rounds", type=int, default=5, help="rounds, the sides alternating which goes first")
    p.add_argument("--compile-mode", default="default",
                   help="torch.compile mode of the peer's layer (default, max-autotune-no-cudagraphs, ...) or eager")
    p.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="verify one greedy step per batch against the peer's bs=1 forward first (default on)")
    p.add_argument("--check-tokens", type=int, default=32, help="shortest prompt of the check (rows are ragged)")
    p.add_argument("--check-rel-tol", type=float, default=0.25,
                   help="largest max-relative logit error the check accepts (healthy 4B random-weight runs: ~0.05)")
    p.add_argument("--breakdown", action="store_true", help="kern: also time every launch of one step alone, per "
                   "(batch, ctx) (eager, events between launches): where the batched step's time goes")
    p.add_argument("--breakdown-replays", type=int, default=8)
    p.add_argument("--timeline", type=int, default=0, metavar="STEPS",
                   help="kern: also trace STEPS graph replays per (batch, ctx) with CUPTI (torch.profiler) and print "
                        "each op's advance of the step (bench/profile_step.py --graph's table; 0: off)")
    p.add_argument("--budget", type=float, default=540.0, help="seconds for the worker")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--worker", choices=["batch"], help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    return p


def parse_args(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """Parse and validate (BatchSpecError -> a usage error naming the value, exit status 2)."""
    p = build_parser()
    args = p.parse_args(argv)
    try:
        args.batches = parse_batches(args.batch)
        args.context_list = parse_contexts(args.contexts)
    except BatchSpecError as exc:
        p.error(str(exc))
    args.variant_list = [Path(v) for v in args.variants.split(",") if v]
    args.only_peers = [s for s in args.only.split(",") if s]
    bad = [s for s in args.only_peers if s not in PEERS]
    if bad or not args.only_peers:
        p.error(f"--only {args.only!r}: a comma list of {', '.join(PEERS)}")
    for flag, value, low in (("--steps", args.steps, 1), ("--rounds", args.rounds, 1),
                             ("--check-tokens", args.check_tokens, 1),
                             ("--breakdown-replays", args.breakdown_replays, 1), ("--timeline", args.timeline, 0)):
        if value < low:
            p.error(f"{flag} {value} must be >= {low}")
    return p, args


def main(argv: list[str] | None = None) -> int:
    p, args = parse_args(argv)
    if args.worker:
        worker(args, args.worker_out)
        return 0
    from kern_run.errors import RefusalError
    from kern_run.preflight import read_manifest

    try:
        facts = read_manifest(args.manifest)
    except RefusalError as exc:
        p.error(str(exc))
    try:
        check_batches_fit(args.batches, seqs_max(facts.manifest), args.manifest)
        sampling_names(facts.manifest)
        for path in args.variant_list:
            vfacts = read_manifest(path)
            check_batches_fit(args.batches, seqs_max(vfacts.manifest), path)
            sampling_names(vfacts.manifest)
    except (BatchSpecError, ValueError, RefusalError) as exc:
        p.error(str(exc))
    if not (args.ckpt / "config.json").is_file():
        print(f"# {args.ckpt} missing: making it (tools/make_checkpoint.py --shape qwen3-4b)", flush=True)
        subprocess.run([sys.executable, str(ROOT / "tools" / "make_checkpoint.py"), "--shape", "qwen3-4b",
                        "--out", str(args.ckpt)], check=True)
    start = time.perf_counter()
    argv_worker = ["--worker", "batch", "--batch", ",".join(map(str, args.batches)), "--contexts",
                   ",".join(map(str, args.context_list)), "--ckpt", str(args.ckpt), "--manifest", str(args.manifest),
                   "--kernels", str(args.kernels), "--gpu", str(args.gpu), "--only", ",".join(args.only_peers),
                   "--variants", ",".join(map(str, args.variant_list)),
                   "--steps", str(args.steps), "--rounds", str(args.rounds), "--compile-mode", args.compile_mode,
                   "--check-tokens", str(args.check_tokens), "--check-rel-tol", str(args.check_rel_tol),
                   "--breakdown-replays", str(args.breakdown_replays), "--timeline", str(args.timeline)] \
        + (["--breakdown"] if args.breakdown else []) \
        + ["--check" if args.check else "--no-check"]
    out = os.path.join(tempfile.mkdtemp(prefix="kern-bench-decode-batch-"), "batch.jsonl")
    results, status = base._run_worker(argv_worker, args.budget, out, script=Path(__file__).resolve())
    notes = [] if status == "ok" else [f"worker: {status[:400]}"]
    for r in results:
        if r.get("compile_error"):
            notes.append(f"bs={r['batch']} ctx {r['ctx']}: torch.compile failed ({r['compile_error']}); eager layer timed")
    cfg = json.loads((args.ckpt / "config.json").read_text())
    kv = kv_bytes_per_token(cfg)
    wbytes = base.checkpoint_bytes(args.ckpt)
    checks = [r for r in results if r.get("side") == "check"]
    failed = [r["batch"] for r in checks if not r["ok"]]
    if args.check and not checks:
        notes.append("check: no verdict (the worker stopped before it)")
    if failed:
        notes.append(f"CHECK FAILED at batch {failed}: the timings above are of a program that is wrong")
    summary = {"weight_bytes": wbytes, "kv_bytes_per_token": kv, "batches": args.batches,
               "contexts": args.context_list, "floors_ms": {f"{b},{c}": floor_ms(wbytes, b, c, kv)
                                                            for b in args.batches for c in args.context_list},
               "results": results, "notes": notes, "seconds": time.perf_counter() - start}
    base.write_json(args.json, "bench-decode-batch.json", summary, notes)
    print(table(results, args.batches, args.context_list, wbytes, kv, notes))
    if failed or (args.check and not checks):
        return 1
    return base.exit_code(results, "ms_per_step", "bench/decode.py --batch")


if __name__ == "__main__":
    sys.exit(main())
