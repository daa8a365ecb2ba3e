"""Run kern_persistent_decode (kernels-src/persistent_decode.cu) on the CPU (no GPU): one decode step of a tiny
Qwen3-shaped model, every block of the grid at once, against a numpy model of today's decode step built from
tools/reference_kernels.py; and a planted hang against the error word. The "wide" step cases (hidden 552,
intermediate 640) take the GEMV-row path through several ring steps per batch with uneven chunks per lane, and
DOWN's k-split path (the tiny shape's DOWN, k 96, the row path; both shapes' O_PROJ, k 128, and the wide DOWN
split with `row_split="always"`, whole with "auto", which the step count picks at these shapes). Step
cases run the fused attention (ATTN: the new token in the last split, in a middle one before an empty split, alone)
and the split one (ROPE, ATTN_PARTIAL, ATTN_REDUCE).

The kernel source is compiled with g++ against tools/cpu_emu_persist/ (common.cuh: each block its own 256
std::threads, block barrier, warp exchanges and dynamic shared memory; persistent_sync.cuh: std::atomic_ref counters,
steady_clock for %globaltimer). The table is the builder's (kern_run.models.qwen3.persistent.schedule), so blocks
really wait on each other's counters. Checks per case: the error word stays zero, every counter ends at its number of
signallers (an ATTN ticket at its splits), the logits within 2e-2 of the reference (relative to the largest), next_token the reference's argmax
wherever its top-2 margin exceeds twice the measured error, q, the written K/V row, attn_out and the final residual
within bf16 rounding of the reference. The planted hang: one wait whose target nothing reaches makes the step end
with code 1 (the instruction, counter, value and target in the detail) within a bounded time. A logic check of the
CUDA source where no GPU is at hand, not a substitute for tests/kernels/test_persistent_gpu.py (no real memory
model, no real warps or timing).

    uv run --frozen python -m tools.persistent_cpu_emu [--quick] [--seed N] [--only step|attention]   # needs g++

The attention-only tables (ATTN_CASES: ATTN_PARTIAL and ATTN_REDUCE alone, q and the pages given) cover what the
tiny step does not: head_dim 64 / 128 / 256 on the 16-byte path, 48 on the scalar one, groups 1 to 8, absent pages
inside a split, a split with no present token, empty splits, several token iterations per warp, and every placement
of the cross-warp merge; each split's (acc, m, l) against a float64 reference, attn_out against
reference_kernels.attn_decode.

Exit 0 when every case passes, 1 otherwise (the failures are printed), 2 without g++.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kern_run.models.qwen3.config import Qwen3Config
from kern_run.models.qwen3.persistent.isa import FLAG_EVICT_FIRST, FLAG_TABLE_AHEAD, NO_COUNTER, Instr, Op, Table
from kern_run.models.qwen3.persistent.manifest import shared_bytes
from kern_run.models.qwen3.persistent.schedule import build_schedule
from tools import reference_kernels as ref

REPO = Path(__file__).resolve().parent.parent
EMU = REPO / "tools" / "cpu_emu_persist"
SRC = REPO / "kernels-src"
PAGE_TOKENS = 16
MAX_POS = 64
NUM_PAGES = 6
PAGE_IDS = (3, 1, 4)  # the sequence's pages, not in order


def tiny_config() -> Qwen3Config:
    """hidden 64, 2 layers, 4 q heads over 2 kv heads of 32, intermediate 96, vocab 160."""
    return Qwen3Config(hidden=64, layers=2, q_heads=4, kv_heads=2, head_dim=32, intermediate=96, vocab=160, tied=True,
                       rope_theta=1e6, eps=1e-6, max_position_embeddings=MAX_POS)


def wide_config() -> Qwen3Config:
    """tiny_config with hidden 552 and intermediate 640 (QKV / GATE_UP rows of 69 16-byte chunks: lanes with 2 and
    3 chunks, two ring steps per batch of the GEMV-row path, batches with one row; DOWN rows of 80 chunks, split 10
    chunks a warp by the k-split path, lanes 0..9 busy) and vocab 200."""
    return dataclasses.replace(tiny_config(), hidden=552, intermediate=640, vocab=200)


CONFIGS = {"tiny": tiny_config, "wide": wide_config}


def build(out: Path) -> Path:
    """Compile the driver with the kernel source copied next to the emulator headers. Raises CalledProcessError."""
    for f in EMU.iterdir():
        shutil.copy(f, out / f.name)
    shutil.copy(SRC / "persistent_decode.cu", out / "persistent_decode.cu")
    exe = out / "driver"
    subprocess.run(["g++", "-std=c++20", "-O2", "-pthread", f"-I{out}", "-o", str(exe), str(out / "driver.cpp")],
                   check=True, capture_output=True, text=True)
    return exe


def bf(x: np.ndarray) -> np.ndarray:
    return ref.bf16_round(np.asarray(x, np.float32))


@dataclasses.dataclass
class Model:
    cfg: Qwen3Config
    weights: dict[str, np.ndarray]  # bf16-valued float32
    residual: np.ndarray  # [H], the embedding's output
    kv: list[np.ndarray]  # per layer [pages, 2, page_tokens, Hkv, D]
    rope: np.ndarray
    position: int


def random_model(cfg: Qwen3Config, seed: int, position: int) -> Model:
    rng = np.random.default_rng(seed)
    H, D, I = cfg.hidden, cfg.head_dim, cfg.intermediate
    q_dim, kv_dim = cfg.q_heads * D, cfg.kv_heads * D
    w: dict[str, np.ndarray] = {}
    for layer in range(cfg.layers):
        w[f"w_qkv.{layer}"] = bf(rng.normal(0, 0.15, (q_dim + 2 * kv_dim, H)))
        w[f"w_o.{layer}"] = bf(rng.normal(0, 0.1, (H, q_dim)))
        w[f"w_gate_up.{layer}"] = bf(rng.normal(0, 0.15, (2 * I, H)))
        w[f"w_down.{layer}"] = bf(rng.normal(0, 0.1, (H, I)))
        for name, n in (("ln_in", H), ("ln_post", H), ("q_norm", D), ("k_norm", D)):
            w[f"{name}.{layer}"] = bf(1 + rng.normal(0, 0.1, n))
    w["final_norm"] = bf(1 + rng.normal(0, 0.1, H))
    w["lm_head"] = bf(rng.normal(0, 0.2, (cfg.vocab, H)))
    kv = []
    for _ in range(cfg.layers):
        cache = np.zeros((NUM_PAGES, 2, PAGE_TOKENS, cfg.kv_heads, D), np.float32)
        for p in range(position):  # the earlier tokens' K/V, already in their pages
            page, off = PAGE_IDS[p // PAGE_TOKENS], p % PAGE_TOKENS
            cache[page, :, off] = bf(rng.normal(0, 1.0, (2, cfg.kv_heads, D)))
        kv.append(cache)
    return Model(cfg, w, bf(rng.normal(0, 1.0, H)), kv, ref.rope_table(MAX_POS, D, cfg.rope_theta), position)


def slot_of(position: int) -> int:
    return PAGE_IDS[position // PAGE_TOKENS] * PAGE_TOKENS + position % PAGE_TOKENS


def reference_step(m: Model) -> dict[str, np.ndarray]:
    """Today's decode step (one token at m.position) in numpy, through reference_kernels: every projection a float64
    dot rounded to bf16, the norms, rope, attention and SwiGLU as the existing kernels compute them."""
    cfg, w = m.cfg, m.weights
    D, q_dim = cfg.head_dim, cfg.q_heads * cfg.head_dim
    residual = m.residual.astype(np.float32)[None]  # [1, H]
    kv = [c.copy() for c in m.kv]
    block_table = np.array([list(PAGE_IDS)], np.int32)
    q = np.zeros((1, cfg.q_heads, D), np.float32)
    for layer in range(cfg.layers):
        _, x = ref.add_rmsnorm(residual, None, w[f"ln_in.{layer}"], cfg.eps)
        qkv = bf(x.astype(np.float64) @ w[f"w_qkv.{layer}"].T.astype(np.float64))
        ref.qk_norm_rope_kv(qkv, w[f"q_norm.{layer}"], w[f"k_norm.{layer}"], m.rope, np.array([m.position]),
                            np.array([slot_of(m.position)]), q, kv[layer], cfg.q_heads, cfg.kv_heads, D, cfg.eps)
        attn = bf(ref.attn_decode(q, kv[layer], block_table, np.array([m.position + 1]), D ** -0.5, NUM_PAGES))
        residual = bf(residual + bf(attn.astype(np.float64) @ w[f"w_o.{layer}"].T.astype(np.float64)))
        _, x = ref.add_rmsnorm(residual, None, w[f"ln_post.{layer}"], cfg.eps)
        gate_up = bf(x.astype(np.float64) @ w[f"w_gate_up.{layer}"].T.astype(np.float64))
        act = ref.silu_mul(gate_up)
        residual = bf(residual + bf(act.astype(np.float64) @ w[f"w_down.{layer}"].T.astype(np.float64)))
    _, x = ref.add_rmsnorm(residual, None, w["final_norm"], cfg.eps)
    logits = bf(x.astype(np.float64) @ w["lm_head"].T.astype(np.float64))[0]
    return {"logits": logits, "residual": residual[0], "q": q.reshape(q_dim), "attn_out": attn[0], "kv": kv}


def bits(x: np.ndarray) -> bytes:
    return ref.bf16_bits(np.asarray(x, np.float32)).astype("<u2").tobytes()


def write_inputs(d: Path, m: Model, table: bytes, counters: int, splits: int, lm_tiles: int) -> None:
    cfg = m.cfg
    D, I, q_dim = cfg.head_dim, cfg.intermediate, cfg.q_heads * cfg.head_dim
    group = cfg.q_heads // cfg.kv_heads
    geometry = [cfg.hidden, cfg.q_heads, cfg.kv_heads, D, I, cfg.vocab, cfg.layers, PAGE_TOKENS, MAX_POS, splits]
    files = {
        "shape": struct.pack("<10i2f", *geometry, cfg.eps, D ** -0.5),
        "num_pages": struct.pack("<i", NUM_PAGES),
        "table": table, "counters": bytes(4 * counters), "error": bytes(32),
        "residual": bits(m.residual), "qkv": bytes(2 * (q_dim + 2 * cfg.kv_heads * D)), "q": bytes(2 * q_dim),
        "attn_partials": bytes(4 * cfg.kv_heads * splits * group * (D + 2)), "attn_out": bytes(2 * q_dim),
        "act": bytes(2 * I), "logits": bytes(2 * cfg.vocab), "argmax_partials": bytes(8 * lm_tiles),
        "next_token": struct.pack("<q", -1), "final_norm": bits(m.weights["final_norm"]),
        "lm_head": bits(m.weights["lm_head"]), "rope": m.rope.astype("<f4").tobytes(),
        "positions": struct.pack("<i", m.position), "slot_mapping": struct.pack("<i", slot_of(m.position)),
        "seq_lens": struct.pack("<i", m.position + 1),
        "block_table": np.array(PAGE_IDS, "<i4").tobytes(),
    }
    for layer in range(cfg.layers):
        for name in ("w_qkv", "w_o", "w_gate_up", "w_down", "ln_in", "ln_post", "q_norm", "k_norm"):
            files[f"{name}.{layer}"] = bits(m.weights[f"{name}.{layer}"])
        files[f"kv.{layer}"] = bits(m.kv[layer])
    for name, data in files.items():
        (d / f"{name}.bin").write_bytes(data)


def read_bf16(d: Path, name: str) -> np.ndarray:
    return ref.from_bf16_bits(np.frombuffer((d / f"{name}.bin").read_bytes(), "<u2").copy())


def run(exe: Path, d: Path, grid: int, timeout_ns: int, cfg: Qwen3Config) -> float:
    start = time.perf_counter()
    subprocess.run([str(exe), str(d), str(grid), str(timeout_ns), str(shared_bytes(cfg)), str(cfg.layers)],
                   check=True, timeout=600)
    return time.perf_counter() - start


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


def check_step(exe: Path, work: Path, grid: int, seed: int, position: int, shape: str = "tiny",
               attn: str = "fused", splits: int = 2, row_split: str = "auto") -> list[str]:
    """One decode step on `grid` blocks of the CONFIGS[shape] model with the `attn` attention over `splits` context
    splits and O_PROJ / DOWN's `row_split` (schedule.build_schedule); returns the failures (empty: ok). Fused, q
    never leaves shared memory: the q buffer must stay zero."""
    cfg = CONFIGS[shape]()
    m = random_model(cfg, seed, position)
    sched = build_schedule(cfg, grid, splits=splits, attn=attn, row_split=row_split)
    # the hint flags (the ring's L2 policy, the next instruction's L1 prefetch) on the fused cases, off on the split
    # ones: hints change no result, so both kinds must pass either way
    table = dataclasses.replace(sched.table, flags=FLAG_EVICT_FIRST | FLAG_TABLE_AHEAD if attn == "fused" else 0)
    d = work / f"step-{shape}-{grid}-{position}-{attn}-{splits}-{row_split}"
    d.mkdir()
    write_inputs(d, m, table.pack(), sched.table.num_counters, sched.splits, sched.lm_tiles)
    run(exe, d, grid, 60_000_000_000, cfg)
    want = reference_step(m)
    fails = []
    err = np.frombuffer((d / "error.bin").read_bytes(), "<u4")
    if err.any():
        return [f"error word {err.tolist()}"]
    counters = np.frombuffer((d / "counters.bin").read_bytes(), "<u4")
    # every counter at its signallers; an ATTN ticket (signal + 1 + kv head) at its splits, one draw each
    signals = np.bincount([i.signal_counter for i in sched.table.instrs]
                          + [i.ticket for i in sched.table.instrs if i.ticket is not None],
                          minlength=sched.table.num_counters)
    if not np.array_equal(counters, signals):
        fails.append(f"counters {counters.tolist()} != signallers and tickets {signals.tolist()}")
    logits = read_bf16(d, "logits")
    e = rel_err(logits, want["logits"])
    if e > 2e-2:
        fails.append(f"logits: relative error {e:.3e}")
    token = struct.unpack("<q", (d / "next_token.bin").read_bytes())[0]
    top = np.argsort(-want["logits"], kind="stable")[:2]
    margin = float(want["logits"][top[0]] - want["logits"][top[1]])
    if token != int(np.argmax(logits)):
        fails.append(f"next_token {token} is not the argmax {int(np.argmax(logits))} of the kernel's own logits")
    if token != int(top[0]) and margin > 2 * float(np.max(np.abs(logits - want["logits"]))):
        fails.append(f"next_token {token}, the reference's {int(top[0])} (margin {margin:.3e})")
    if attn == "fused" and read_bf16(d, "q").any():
        fails.append("q: written by the fused attention, which keeps q in shared memory")
    for name in ("attn_out", "residual") if attn == "fused" else ("q", "attn_out", "residual"):
        e = rel_err(read_bf16(d, name), want[name])
        if e > 2e-2:
            fails.append(f"{name}: relative error {e:.3e}")
    slot = slot_of(position)
    page, off = divmod(slot, PAGE_TOKENS)
    for layer in range(cfg.layers):
        got = read_bf16(d, f"kv.{layer}").reshape(NUM_PAGES, 2, PAGE_TOKENS, cfg.kv_heads, cfg.head_dim)
        e = rel_err(got[page, :, off], want["kv"][layer][page, :, off])
        if e > 2e-2:
            fails.append(f"kv.{layer} written row: relative error {e:.3e}")
        others = np.ones(got.shape[:3], bool)
        others[page, :, off] = False
        if not np.array_equal(got[others], m.kv[layer][others]):
            fails.append(f"kv.{layer}: rows other than slot {slot} changed")
    return fails


def _blocked_by(table: Table, index: int) -> set[int]:
    """Instructions that cannot finish when instruction `index` never does: it, every instruction whose wait counter
    a blocked instruction signals, every instruction queued after a blocked one; a fixed point."""
    blocked = {index}
    changed = True
    while changed:
        changed = False
        dead_counters = {table.instrs[i].signal_counter for i in blocked}
        for queue in table.queues:
            stuck = False
            for i in queue:
                stuck = stuck or i in blocked or table.instrs[i].wait_counter in dead_counters
                if stuck and i not in blocked:
                    blocked.add(i)
                    changed = True
    return blocked


def check_planted_hang(exe: Path, work: Path, grid: int) -> list[str]:
    """The first waiting instruction's target raised past its signallers (a table Table.check refuses, packed as the
    kernel would meet it): code 1 with the instruction, counter, value and target, within a bounded time."""
    cfg = tiny_config()
    m = random_model(cfg, 0, 5)
    sched = build_schedule(cfg, grid, splits=2)
    table = sched.table
    index = next(i for i, ins in enumerate(table.instrs) if ins.wait_counter != 0xFFFFFFFF)
    bad = dataclasses.replace(table.instrs[index], wait_target=table.instrs[index].wait_target + 1)
    planted = Table(table.instrs[:index] + (bad,) + table.instrs[index + 1:], table.queues, table.num_counters)
    data = bytearray(sched.table.pack())
    instrs_at = struct.unpack_from("<I", data, 8 * 4)[0]
    struct.pack_into("<I", data, 4 * (instrs_at + 8 * index + 5), bad.wait_target)
    d = work / f"hang-{grid}"
    d.mkdir()
    write_inputs(d, m, bytes(data), planted.num_counters, sched.splits, sched.lm_tiles)
    # 20 s: far above any legitimate wait of the emulated step, also on a loaded 2-core machine
    elapsed = run(exe, d, grid, 20_000_000_000, cfg)
    err = np.frombuffer((d / "error.bin").read_bytes(), "<u4").tolist()
    fails = []
    # The planted instruction never runs, so every instruction downstream of it (waiting on a counter it or another
    # blocked one signals, or queued after a blocked one) waits forever too; whichever of those waits started
    # first times out first (under a loaded CPU: ATTN_PARTIAL 5 on ROPE 3's counter, say). The error word must name
    # one of them, its counter, a value short of its target, and the target.
    blocked = _blocked_by(planted, index)
    got, counter, value, target = err[1:5]
    if err[0] != 1 or got not in blocked:
        fails.append(f"error word {err}, expected code 1 naming the planted instruction {index} or one it blocks")
    elif (counter, target) != (planted.instrs[got].wait_counter, planted.instrs[got].wait_target) or value >= target:
        fails.append(f"error word {err}: instruction {got} waits on counter {planted.instrs[got].wait_counter} for "
                     f"{planted.instrs[got].wait_target}")
    if elapsed > 120:
        fails.append(f"the planted hang took {elapsed:.1f} s")
    return fails


@dataclasses.dataclass(frozen=True)
class AttnCase:
    """An attention-only table (ATTN_PARTIAL per (kv head, split), ATTN_REDUCE per kv head) at one geometry:
    `n` context tokens, `pages` the block table (ids outside [0, NUM_ATTN_PAGES) are absent pages), `hidden` sizing
    the kernel's x buffer (whether the cross-warp merge runs in sm.x, in rounds, or in sm.head)."""

    label: str
    head_dim: int
    q_heads: int
    kv_heads: int
    hidden: int
    n: int
    splits: int
    pages: tuple[int, ...]
    grid: int = 3
    fused: bool = False  # ATTN per (kv head, split) from the raw qkv row instead: its rope, K / V write and ticket
    slot_offset: int = 0  # fused: slot_mapping this many slots past token n - 1's own (not 0: fault 5 expected)


NUM_ATTN_PAGES = 24
ATTN_CASES = (
    # 16-byte path, T = 16 lanes per token, group 4 (Qwen3-4B / 8B), one head per merge round; a page id -1 and one
    # past the bound (absent tokens inside splits), 300 tokens in 3 splits of 100 (two iterations of 4 x 16 tokens)
    AttnCase("d128 group4", 128, 8, 2, 128, 300, 3, (3, 7, 1, 0, 22, -1, 9, 11, 30, 5, 6, 12, 13, 14, 15, 16, 17, 18, 19)),
    # 16-byte path, T = 8, group 8 (G = 8, two token steps in flight), every head in one merge round; 16 splits of 10
    # tokens: the last split is empty
    AttnCase("d64 group8", 64, 16, 2, 4096, 150, 16, (2, 4, 6, 8, 10, 12, 14, 16, 18, 20)),
    # 16-byte path, split k = page k exactly and page 2 absent: split 2 has no token (m -inf, l 0)
    AttnCase("d64 group2 absent split", 64, 4, 2, 64, 64, 4, (1, 3, -1, 5)),
    # 16-byte path with T = 32 (head_dim 256), group 1
    AttnCase("d256 group1", 256, 2, 2, 64, 70, 2, (4, 2, 0, 1, 3)),
    # scalar path (head_dim 48: 48 / 8 does not divide 32), group 3, merge buffer in sm.head (x too small)
    AttnCase("d48 group3 scalar", 48, 6, 2, 64, 40, 2, (0, 5, 2)),
    # 5 tokens over 4 splits of 2: the last split empty, one token step of one iteration in use
    AttnCase("d128 group4 short", 128, 8, 2, 64, 5, 4, (7,)),
    # 20 splits of 10 tokens: more splits than ATTN_REDUCE loads at once (its two-pass path), page 4 absent
    AttnCase("d64 group2 20 splits", 64, 4, 2, 64, 200, 20, (12, 3, 7, 0, -1, 9, 1, 11, 2, 8, 10, 5, 6)),
)
# every case again as ATTN (the fused attention): the q heads roped from qkv, token n - 1's K / V written by the split
# holding it (d128 group4: token 299's page 5 present; d64 group2 20 splits: 199 on page 0), then the ticket's reduce
ATTN_CASES += tuple(dataclasses.replace(c, label=f"{c.label} fused", fused=True) for c in ATTN_CASES)
# one block running the splits last to first: the writer split (the last non-empty one) comes first, so a kernel
# whose writer were another split would read token n - 1's row before it is written (the row starts as NaN)
ATTN_CASES += (dataclasses.replace(ATTN_CASES[0], label="d128 group4 one block fused", fused=True, grid=1),
               # slot_mapping one slot past the block table's (a caller bug the splits would race on): fault 5
               dataclasses.replace(ATTN_CASES[0], label="d128 group4 fused, slot not the last token's", fused=True,
                                   slot_offset=1))


def attention_table(case: AttnCase) -> Table:
    """ATTN_PARTIAL (kv head g, split x) signalling counter g, then ATTN_REDUCE g waiting on it (target: the splits),
    signalling counter kv_heads; fused, ATTN (g, x) signalling counter 0, its tickets counters 1 .. kv_heads.
    Queues round-robin in table order."""
    if case.fused:  # splits last to first (the order is free: the ticket, not the table, picks the reducer)
        instrs = [Instr(Op.ATTN, 0, g, case.splits, NO_COUNTER, 0, 0, x)
                  for g in range(case.kv_heads) for x in reversed(range(case.splits))]
    else:
        instrs = [Instr(Op.ATTN_PARTIAL, 0, g, case.splits, NO_COUNTER, 0, g, x)
                  for g in range(case.kv_heads) for x in range(case.splits)]
        instrs += [Instr(Op.ATTN_REDUCE, 0, g, case.splits, g, case.splits, case.kv_heads)
                   for g in range(case.kv_heads)]
    queues = tuple(tuple(range(q, len(instrs), case.grid)) for q in range(case.grid))
    return Table(tuple(instrs), queues, case.kv_heads + 1)


def attention_reference(case: AttnCase, q: np.ndarray, kv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(parts [kv_heads, splits, group, D + 2] float64: acc, m, l of each split as the kernel's contract states;
    attn_out [q_heads * D] float64, tools/reference_kernels.attn_decode)."""
    D, group = case.head_dim, case.q_heads // case.kv_heads
    present = ref.kv_present(np.array(case.pages), case.n, PAGE_TOKENS, NUM_ATTN_PAGES)
    length = -(-case.n // case.splits)
    parts = np.zeros((case.kv_heads, case.splits, group, D + 2))
    parts[..., D] = -np.inf
    for g in range(case.kv_heads):
        for x in range(case.splits):
            toks = [t for t in range(x * length, min(case.n, (x + 1) * length)) if present[t]]
            if not toks:
                continue
            rows = [(case.pages[t // PAGE_TOKENS], t % PAGE_TOKENS) for t in toks]
            k = np.array([kv[p, 0, o, g] for p, o in rows], np.float64)
            v = np.array([kv[p, 1, o, g] for p, o in rows], np.float64)
            for h in range(group):
                sc = k @ q[g * group + h].astype(np.float64) * D ** -0.5
                m = sc.max()
                p = np.exp(sc - m)
                parts[g, x, h, :D] = p @ v
                parts[g, x, h, D] = m
                parts[g, x, h, D + 1] = p.sum()
    out = ref.attn_decode(q[None].astype(np.float64), kv.astype(np.float64), np.array([case.pages]),
                          np.array([case.n]), D ** -0.5, NUM_ATTN_PAGES)[0]
    return parts, out


def check_attention(exe: Path, work: Path, case: AttnCase, seed: int) -> list[str]:
    """Run `case`'s attention-only table; compare the partials (acc, m, l) with the float64 reference within 1e-4
    (relative to the row's largest |acc|; m absolute, l relative; empty splits exactly 0, -inf, 0) and attn_out
    within 2e-2 (bf16). Fused: q is the reference rope of a random qkv row at position n - 1, whose K / V the
    kernel must write to token n - 1's slot (within bf16 rounding; every other row unchanged; q never written)."""
    rng = np.random.default_rng(seed)
    D, group = case.head_dim, case.q_heads // case.kv_heads
    max_pos = max(MAX_POS, case.n)
    cfg = Qwen3Config(hidden=case.hidden, layers=1, q_heads=case.q_heads, kv_heads=case.kv_heads, head_dim=D,
                      intermediate=case.hidden, vocab=8, tied=True, rope_theta=1e6, eps=1e-6,
                      max_position_embeddings=max_pos)
    q = bf(rng.normal(0, 1.0, (case.q_heads, D)))
    kv = bf(rng.normal(0, 1.0, (NUM_ATTN_PAGES, 2, PAGE_TOKENS, case.kv_heads, D)))
    q_dim = case.q_heads * D
    qkv = np.zeros(q_dim + 2 * case.kv_heads * D, np.float32)
    rope = np.zeros((max_pos, D), np.float32)
    norms = {"q_norm": np.zeros(D, np.float32), "k_norm": np.zeros(D, np.float32)}
    slot = -1
    kv_in = kv
    if case.fused:  # the kernel's inputs are the raw row; the reference ropes it and writes the new token's K / V
        qkv = bf(rng.normal(0, 1.0, qkv.shape))
        rope = ref.rope_table(max_pos, D, cfg.rope_theta)
        norms = {name: bf(1 + rng.normal(0, 0.1, D)) for name in norms}
        page = case.pages[(case.n - 1) // PAGE_TOKENS]
        own = page * PAGE_TOKENS + (case.n - 1) % PAGE_TOKENS if 0 <= page < NUM_ATTN_PAGES else -1
        slot = own + case.slot_offset if own >= 0 else -1
        q_ref = np.zeros((1, case.q_heads, D), np.float32)
        if slot >= 0:  # the stale row of token n - 1: what a read before the write would see
            kv_in = kv_in.copy()
            kv_in[slot // PAGE_TOKENS, :, slot % PAGE_TOKENS] = np.nan
        kv = kv_in.copy()
        ref.qk_norm_rope_kv(qkv[None], norms["q_norm"], norms["k_norm"], rope, np.array([case.n - 1]),
                            np.array([slot]), q_ref, kv, case.q_heads, case.kv_heads, D, cfg.eps)
        q = q_ref[0]
    table = attention_table(case)
    geometry = [case.hidden, case.q_heads, case.kv_heads, D, case.hidden, 8, 1, PAGE_TOKENS, max_pos, case.splits]
    files = {
        "shape": struct.pack("<10i2f", *geometry, 1e-6, D ** -0.5), "num_pages": struct.pack("<i", NUM_ATTN_PAGES),
        "table": table.pack(), "counters": bytes(4 * table.num_counters), "error": bytes(32),
        "residual": bytes(2 * case.hidden), "qkv": bits(qkv), "q": bytes(2 * q_dim) if case.fused else bits(q),
        "attn_partials": np.full(case.kv_heads * case.splits * group * (D + 2), np.nan, "<f4").tobytes(),
        "attn_out": bytes(2 * q_dim), "act": bytes(2 * case.hidden), "logits": bytes(16), "argmax_partials": bytes(8),
        "next_token": struct.pack("<q", -1), "final_norm": bytes(2 * case.hidden), "lm_head": bytes(16 * case.hidden),
        "rope": rope.astype("<f4").tobytes(), "positions": struct.pack("<i", case.n - 1 if case.fused else 0),
        "slot_mapping": struct.pack("<i", slot if case.fused else 0),
        "seq_lens": struct.pack("<i", case.n), "block_table": np.array(case.pages, "<i4").tobytes(),
        "kv.0": bits(kv_in),
    }
    for name in ("w_qkv", "w_o", "w_gate_up", "w_down", "ln_in", "ln_post"):
        files[f"{name}.0"] = bytes(16)
    for name, w in norms.items():
        files[f"{name}.0"] = bits(w) if case.fused else bytes(16)
    d = work / f"attn-{case.label.replace(' ', '-')}"
    d.mkdir()
    for name, data in files.items():
        (d / f"{name}.bin").write_bytes(data)
    run(exe, d, case.grid, 60_000_000_000, cfg)
    err = np.frombuffer((d / "error.bin").read_bytes(), "<u4")
    if case.slot_offset:  # fault 5: [1] slot_mapping, [2] the block table's slot, [3] seq_len
        want_err = [5, slot, own, case.n, 0, 0, 0, 0]
        if err.tolist() != want_err:
            return [f"error word {err.tolist()}, not {want_err}"]
        got_kv = read_bf16(d, "kv.0").reshape(kv.shape)
        same = (got_kv == kv_in) | (np.isnan(got_kv) & np.isnan(kv_in))
        return [] if same.all() else ["kv.0 changed by a step that faulted before its rope"]
    if err.any():
        return [f"error word {err.tolist()}"]
    want_parts, want_out = attention_reference(case, q, kv)
    got = np.frombuffer((d / "attn_partials.bin").read_bytes(), "<f4").reshape(want_parts.shape).astype(np.float64)
    fails = []
    for g in range(case.kv_heads):
        for x in range(case.splits):
            for h in range(group):
                w, o = want_parts[g, x, h], got[g, x, h]
                where = f"kv head {g} split {x} q head {h}"
                if np.isneginf(w[D]):
                    if not (np.isneginf(o[D]) and o[D + 1] == 0 and not o[:D].any()):
                        fails.append(f"{where}: empty split wrote m {o[D]}, l {o[D + 1]}, max|acc| {np.abs(o[:D]).max()}")
                    continue
                scale = max(float(np.abs(w[:D]).max()), 1e-30)
                e_acc = float(np.abs(o[:D] - w[:D]).max()) / scale
                e_m, e_l = abs(o[D] - w[D]), abs(o[D + 1] - w[D + 1]) / w[D + 1]
                if not (e_acc <= 1e-4 and e_m <= 1e-4 and e_l <= 1e-4):
                    fails.append(f"{where}: acc error {e_acc:.2e}, m {o[D]} vs {w[D]}, l {o[D + 1]} vs {w[D + 1]}")
    e = rel_err(read_bf16(d, "attn_out"), want_out)
    if e > 2e-2:
        fails.append(f"attn_out: relative error {e:.3e}")
    if case.fused:
        counters = np.frombuffer((d / "counters.bin").read_bytes(), "<u4")
        want_counters = [case.kv_heads * case.splits] + [case.splits] * case.kv_heads
        if counters.tolist() != want_counters:
            fails.append(f"counters {counters.tolist()} != {want_counters} (signal, then one ticket a kv head)")
        if read_bf16(d, "q").any():
            fails.append("q: written by ATTN, which keeps q in shared memory")
        got_kv = read_bf16(d, "kv.0").reshape(kv.shape)
        changed = np.argwhere(((got_kv != kv_in) & ~(np.isnan(got_kv) & np.isnan(kv_in))).any(axis=(3, 4)))
        if slot < 0 and len(changed):
            fails.append(f"kv.0: rows {changed[:3].tolist()} changed, and token n - 1's page is absent")
        elif slot >= 0:
            page, off = divmod(slot, PAGE_TOKENS)
            if {tuple(r) for r in changed.tolist()} - {(page, 0, off), (page, 1, off)}:
                fails.append(f"kv.0: rows other than slot {slot} changed: {changed[:4].tolist()}")
            e = rel_err(got_kv[page, :, off], kv[page, :, off])
            if e > 2e-2:
                fails.append(f"kv.0 written row (slot {slot}): relative error {e:.3e}")
    return fails[:8]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer cases (the pytest run)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=("step", "attention"), default=None,
                        help="only the decode-step cases (and the planted hang) or only the attention-only tables")
    args = parser.parse_args(argv)
    if shutil.which("g++") is None:
        print("persistent_cpu_emu: g++ not found", file=sys.stderr)
        return 2
    # (kind, grid, position, attn, splits, row_split): fused with the new token in the last split (37 of 38 over
    # 2), in a middle one before an empty split (5 of 6 over 4: splits of 2 tokens, the fourth empty), and alone (0
    # of 1); O_PROJ (k 128) and the wide DOWN (k 640) split across the warps ("always") or whole ("auto" at these
    # shapes: the split streams more steps); the tiny DOWN (k 96) cannot split
    if args.quick:
        cases = [("step", 3, 37, "fused", 2, "always"), ("step", 3, 5, "fused", 4, "auto"),
                 ("step", 1, 5, "split", 2, "auto"), ("step", 3, 37, "split", 2, "always"),
                 ("wide", 2, 20, "fused", 2, "always")]
    else:
        cases = [("step", g, p, a, sp, r) for g in (1, 2, 3, 5) for p in (0, 5, 37) for a in ("fused", "split")
                 for sp in (2, 4) for r in ("auto", "always")]
        cases += [("wide", g, p, a, 2, r) for g in (2, 5) for p in (5, 20) for a in ("fused", "split")
                  for r in ("auto", "always")]
    cases.append(("hang", 3, 0, "fused", 2, "auto"))
    if args.only == "attention":
        cases = []
    if args.only != "step":
        cases += [("attention", i, 0, "split", 0, "auto") for i in range(len(ATTN_CASES))]
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        try:
            exe = build(work)
        except subprocess.CalledProcessError as exc:
            print(f"persistent_cpu_emu: the driver does not compile:\n{exc.stderr}")
            return 1
        for kind, grid, position, attn, splits, row_split in cases:
            if kind == "attention":
                label = f"attention {ATTN_CASES[grid].label}"
                fails = check_attention(exe, work, ATTN_CASES[grid], args.seed + grid)
            elif kind == "hang":
                label = f"hang grid {grid}"
                fails = check_planted_hang(exe, work, grid)
            else:
                label = f"{kind} grid {grid} position {position} {attn} {splits} splits, row split {row_split}"
                fails = check_step(exe, work, grid, args.seed + grid, position, "tiny" if kind == "step" else kind,
                                   attn, splits, row_split)
            print(f"{label}: " + ("ok" if not fails else "FAILED\n  " + "\n  ".join(fails)))
            failed += bool(fails)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
