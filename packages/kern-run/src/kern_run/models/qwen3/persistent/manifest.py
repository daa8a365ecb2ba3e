"""The persistent decode manifest: today's Qwen3 manifest (gemv v2, argmax sampler, one decode row) with the decode
program's body, every launch between the embedding and decode_advance, replaced by one cooperative launch of
kern_persistent_decode over the schedule's instruction table (docs/persistent.md).

What the runtime sees is general manifest features only (docs/manifest.md): the table is a workspace buffer with
`init` (its packed bytes), the counters a `zero_each_run` buffer, the error word a host `error` buffer with its
codes, the launch `cooperative`, the geometry and the per-layer pointers two `pack` parameters. Prefill, the
caller contract and every buffer the caller touches are the base manifest's.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
from typing import Any

from ....errors import ManifestBuildError
from ..abi import KernelAbi
from ..config import Qwen3Config
from ..jsonio import manifest_digest
from ..manifest import build_manifest
from ..options import BuildOptions
from .isa import FLAG_EVICT_FIRST, FLAG_FENCES, FLAG_L2_PREFETCH, FLAG_TABLE_AHEAD, INSTR_WORDS, NO_COUNTER, Instr, Op
from .schedule import Schedule, build_schedule

ENTRY = "kern_persistent_decode"
MODULE = "persistent_decode"
THREADS = 256  # PD_THREADS
MAX_LAYERS = 64  # kMaxLayers
MAX_HEAD_DIM = 256  # kMaxHeadDim
MAX_GROUP = 8  # kMaxGroup
LAYER_SLOTS = 16  # pointers per PersistLayer
LAYER_FIELDS = ("w_qkv", "w_o", "w_gate_up", "w_down", "ln_in", "ln_post", "q_norm", "k_norm", "kv")
POINTERS = ("table", "counters", "error", "residual", "qkv", "q", "attn_partials", "attn_out", "act", "logits",
            "argmax_partials", "next_token", "final_norm", "lm_head", "rope", "positions", "slot_mapping", "seq_lens",
            "block_table")
# the kernel's parameter sizes: the pointers, PersistShape (48), num_pages, timeout_ns, PersistLayers (8192)
PARAM_SIZES = (8,) * len(POINTERS) + (48, 4, 8, LAYER_SLOTS * 8 * MAX_LAYERS)
ERROR_CODES = {"1": "a counter wait timed out (detail: instruction, counter, value seen, target, block)",
               "2": "the instruction table is malformed (detail: block, word or instruction)",
               "3": "the launch does not fit the table (detail: grid, block, dynamic shared bytes)",
               "4": "the model geometry does not fit the kernel (detail: which check)",
               "5": "ATTN: slot_mapping is not the block table's slot of the last token (detail: slot_mapping, the "
                    "block table's slot, seq_len)"}
DEFAULT_TIMEOUT_NS = 500_000_000  # one wait; a decode step takes milliseconds
RING_STEP_BYTES = THREADS * 4 * 16  # kRingStepBytes: one ring step of every warp (4 16-byte pieces a lane)
MAX_RING_STAGES = 8  # kRingMaxStages
DEFAULT_RING_STAGES = 4  # measured best at 4B (docs/perf.md, twenty-sixth session: 3 / 4 / 6 / 8 stages)
MAX_SHARED_BYTES = 227 * 1024  # dynamic shared memory of one block on sm_90 (cudaDevAttrMaxSharedMemoryPerBlockOptin)


def scratch_bytes(cfg: Qwen3Config) -> int:
    """Shared memory before the weight ring, 16-byte aligned: x (f32[max(H, I, q_dim)]), 64 reduction floats,
    (MAX_GROUP + 1) head rows of MAX_HEAD_DIM floats."""
    raw = 4 * (max(cfg.hidden, cfg.intermediate, cfg.q_heads * cfg.head_dim) + 64 + (MAX_GROUP + 1) * MAX_HEAD_DIM)
    return (raw + 15) // 16 * 16


def ring_stages(cfg: Qwen3Config, stages: int | None = None) -> int:
    """Weight-ring steps per warp: `stages` (2..MAX_RING_STAGES), or None for DEFAULT_RING_STAGES, fewer where only
    fewer fit MAX_SHARED_BYTES beside the scratch. Raises ManifestBuildError when fewer than 2 fit, or `stages` is
    out of range or does not fit."""
    fit = min(MAX_RING_STAGES, (MAX_SHARED_BYTES - scratch_bytes(cfg)) // RING_STEP_BYTES)
    if stages is None:
        stages = min(DEFAULT_RING_STAGES, fit)
    elif not 2 <= stages <= MAX_RING_STAGES:
        raise ManifestBuildError(f"ring stages {stages}: the kernel takes 2..{MAX_RING_STAGES}")
    if stages > fit or stages < 2:
        raise ManifestBuildError(f"a {stages}-stage weight ring ({stages} x {RING_STEP_BYTES} bytes) beside "
                                 f"{scratch_bytes(cfg)} bytes of scratch exceeds the {MAX_SHARED_BYTES} bytes of "
                                 f"shared memory a block has (at most {max(fit, 0)} stages fit)")
    return stages


def shared_bytes(cfg: Qwen3Config, stages: int | None = None) -> int:
    """Dynamic shared memory of one block: the scratch (scratch_bytes), then the weight ring of
    ring_stages(cfg, stages) steps of RING_STEP_BYTES. The kernel derives its ring depth from this size. Raises
    what ring_stages raises."""
    return scratch_bytes(cfg) + ring_stages(cfg, stages) * RING_STEP_BYTES


def check_shape(cfg: Qwen3Config) -> None:
    """Raise ManifestBuildError for a model the kernel does not cover (its kMaxLayers, kMaxHeadDim, kMaxGroup)."""
    group = cfg.q_heads // cfg.kv_heads
    if cfg.layers > MAX_LAYERS:
        raise ManifestBuildError(f"{cfg.layers} layers: the persistent kernel holds at most {MAX_LAYERS}")
    if cfg.head_dim > MAX_HEAD_DIM or cfg.head_dim % 2:
        raise ManifestBuildError(f"head_dim {cfg.head_dim}: the persistent kernel takes an even head_dim <= "
                                 f"{MAX_HEAD_DIM}")
    if group * cfg.kv_heads != cfg.q_heads or group > MAX_GROUP:
        raise ManifestBuildError(f"{cfg.q_heads} q heads over {cfg.kv_heads} kv heads: the persistent kernel takes "
                                 f"1..{MAX_GROUP} q heads per kv head")


def _launch_params(abi: KernelAbi) -> list[list[int]]:
    if ENTRY not in abi.entries:
        raise ManifestBuildError(f"{abi.source} has no entry {ENTRY!r} (module {MODULE!r}); rebuild with "
                                 "tools/build_kernels.py")
    module, params = abi.entries[ENTRY]
    if module != MODULE or tuple(size for _, size in params) != PARAM_SIZES:
        raise ManifestBuildError(f"{abi.source} entry {ENTRY!r} (module {module!r}) has param sizes "
                                 f"{[s for _, s in params]}; kern_run.models.qwen3.persistent expects {list(PARAM_SIZES)}")
    return params


def _op(cfg: Qwen3Config, sched: Schedule, params: list[list[int]], num_queues: int, max_pos: int,
        timeout_ns: int, stages: int) -> dict[str, Any]:
    layer_args = [f"{f}.{layer}" for layer in range(cfg.layers) for f in LAYER_FIELDS]
    args = [{"name": n, "kind": "ptr"} for n in (*POINTERS, *layer_args)] + [{"name": "num_pages", "kind": "int"}]
    geometry = [cfg.hidden, cfg.q_heads, cfg.kv_heads, cfg.head_dim, cfg.intermediate, cfg.vocab, cfg.layers,
                16, max_pos, sched.splits]  # page_tokens: patched below
    shape_fields = [{"offset": 4 * i, "i32": v} for i, v in enumerate(geometry)]
    shape_fields += [{"offset": 40, "f32": cfg.eps}, {"offset": 44, "f32": cfg.head_dim ** -0.5}]
    layer_fields = [{"offset": (layer * LAYER_SLOTS + slot) * 8, "arg": f"{f}.{layer}"}
                    for layer in range(cfg.layers) for slot, f in enumerate(LAYER_FIELDS)]
    wiring = ([{"arg": n} for n in POINTERS]
              + [{"pack": {"size": 48, "fields": shape_fields}}, {"arg": "num_pages", "type": "i32"},
                 {"u64": timeout_ns}, {"pack": {"size": PARAM_SIZES[-1], "fields": layer_fields}}])
    launch = {"module": MODULE, "entry": ENTRY, "grid": [num_queues, 1, 1], "block": [THREADS, 1, 1],
              "shared_mem": shared_bytes(cfg, stages), "cooperative": True, "params": params, "args": wiring}
    return {"args": args, "launches": [launch]}


def build_persistent_manifest(cfg: Qwen3Config, abi: KernelAbi, opts: BuildOptions, *, num_queues: int = 132,
                              splits: int | None = None, timeout_ns: int = DEFAULT_TIMEOUT_NS,
                              config_digest: str = "", stages: int | None = None, l2_prefetch: bool = False,
                              ablate: frozenset[Op] = frozenset(), row_quantum: int = 8, counter_stride: int = 1,
                              fences: bool = False, attn: str = "split", row_split: str = "auto",
                              evict_first: bool = True,
                              table_ahead: bool = False) -> tuple[dict[str, Any], Schedule]:
    """(the manifest object with its digest, the schedule it packs). `opts` are today's builder options; the
    decode-related ones are forced to what the persistent path replaces (gemv v2, argmax sampler, one row).
    `num_queues`: the grid, one block per SM of the target GPU (H200: 132); `splits`: attention context splits
    (None: schedule.default_splits); `timeout_ns`: the bound of one counter wait; `stages`: the weight ring's
    steps per warp (None: ring_stages' default); `l2_prefetch`, `fences`: the table's FLAG_L2_PREFETCH and
    FLAG_FENCES (both off by default: measured slower, docs/perf.md); `evict_first`, `table_ahead`: the table's
    FLAG_EVICT_FIRST (the weight ring's copies evict-first in L2; on by default: measured -4 to -8% a step) and
    FLAG_TABLE_AHEAD (the next instruction's words asked of L1 before the wait; off: measured no change).
    `ablate`: instruction classes turned into NOPs (their waits and signals kept): a timing experiment whose decode
    outputs are meaningless, named in meta.persistent.ablated. `row_quantum`: projection tiles are multiples of it
    (schedule.build_schedule). `attn`: "split" (ROPE, ATTN_PARTIAL, ATTN_REDUCE, the default) or "fused"
    (one ATTN instruction per kv head and split; schedule.build_schedule). `row_split`: O_PROJ / DOWN's row split,
    "auto" (by schedule.row_split_steps), "always" or "never". `counter_stride`: counter c of the schedule becomes
    word c x counter_stride of the counters buffer (32: one counter per 128-byte L2 line, so pollers of different
    counters share no line). Raises ManifestBuildError for a model the kernel does not cover, a ring that does not
    fit, a counter stride outside 1..64, kernels.json without the entry or with another ABI, and whatever
    build_manifest raises; ValueError for another `attn` or `row_split`."""
    check_shape(cfg)
    stages = ring_stages(cfg, stages)
    if not 1 <= num_queues <= 1024:
        raise ManifestBuildError(f"num_queues {num_queues}: one block per SM, 1..1024")
    if not 1 <= timeout_ns < 2**64:
        raise ManifestBuildError(f"timeout_ns {timeout_ns}: a u64 of at least 1 ns")
    if not 1 <= counter_stride <= 64:
        raise ManifestBuildError(f"counter_stride {counter_stride}: 1..64 words")
    params = _launch_params(abi)
    base_opts = dataclasses.replace(opts, decode="gemv", gemv="v2", sampler="argmax", seqs_max=1)
    m = build_manifest(cfg, abi, base_opts, config_digest)
    sched = build_schedule(cfg, num_queues, splits=splits, row_quantum=row_quantum, attn=attn, row_split=row_split)

    def respaced(i: Instr) -> Instr:
        wait = i.wait_counter if i.wait_counter == NO_COUNTER else i.wait_counter * counter_stride
        return dataclasses.replace(i, op=Op.NOP if i.op in ablate else i.op, wait_counter=wait,
                                   signal_counter=i.signal_counter * counter_stride)

    sched = dataclasses.replace(sched, table=dataclasses.replace(
        sched.table, instrs=tuple(respaced(i) for i in sched.table.instrs),
        num_counters=sched.table.num_counters * counter_stride,
        flags=(FLAG_L2_PREFETCH if l2_prefetch else 0) | (FLAG_FENCES if fences else 0)
        | (FLAG_EVICT_FIRST if evict_first else 0) | (FLAG_TABLE_AHEAD if table_ahead else 0)))
    table = sched.table.pack()
    group = cfg.q_heads // cfg.kv_heads
    decode = m["programs"]["decode"]["calls"]
    if decode[0]["op"] != "embed" or decode[-1]["op"] != "decode_advance":
        raise AssertionError(f"the base decode program is {[c['op'] for c in decode]}")  # a bug in this builder
    max_pos = int(m["buffers"]["rope"]["shape"][0])
    op = _op(cfg, sched, params, num_queues, max_pos, timeout_ns, stages)
    op["launches"][0]["args"][len(POINTERS)]["pack"]["fields"][7]["i32"] = base_opts.page_tokens
    m["ops"]["persistent_decode"] = op
    m["modules"][MODULE] = abi.modules[MODULE]
    m["modules"] = dict(sorted(m["modules"].items()))
    m["buffers"].update({
        "persist_table": {"kind": "workspace", "dtype": "u32", "shape": [len(table) // 4],
                          "init": {"base64": base64.b64encode(table).decode("ascii")}},
        "persist_counters": {"kind": "workspace", "dtype": "u32", "shape": [sched.table.num_counters],
                             "zero_each_run": True},
        "persist_error": {"kind": "workspace", "dtype": "u32", "shape": [8], "placement": "host",
                          "error": {"codes": ERROR_CODES}},
        "attn_partials": {"kind": "workspace", "dtype": "f32",
                          "shape": [cfg.kv_heads * sched.splits * group, cfg.head_dim + 2]},
        "argmax_partials": {"kind": "workspace", "dtype": "u32", "shape": [sched.lm_tiles, 2]},
    })
    names = {"table": "persist_table", "counters": "persist_counters", "error": "persist_error",
             "lm_head": "embed" if cfg.tied else "lm_head"}
    call_args: dict[str, Any] = {n: names.get(n, n) for n in POINTERS}
    call_args.update({f"{f}.{layer}": f"{f}.{layer}" for layer in range(cfg.layers) for f in LAYER_FIELDS})
    call_args["num_pages"] = {"pages_of": "kv.0"}
    m["programs"]["decode"]["calls"] = [decode[0], {"op": "persistent_decode", "args": call_args}, decode[-1]]
    used = {c["op"] for p in m["programs"].values() for c in p["calls"] if "op" in c}
    m["ops"] = {name: op for name, op in m["ops"].items() if name in used}  # the replaced decode ops go
    live = {launch["module"] for op in m["ops"].values() for launch in op["launches"] if "module" in launch}
    m["modules"] = {name: sha for name, sha in m["modules"].items() if name in live}
    m["meta"]["persistent"] = {"entry": ENTRY, "num_queues": num_queues, "splits": sched.splits,
                               "instructions": len(sched.table.instrs), "counters": sched.table.num_counters,
                               "instr_words": INSTR_WORDS, "table_sha256": hashlib.sha256(table).hexdigest(),
                               "timeout_ns": timeout_ns, "ring_stages": stages, "l2_prefetch": l2_prefetch,
                               "row_quantum": row_quantum, "counter_stride": counter_stride,
                               "fences": fences, "attn": attn, "row_split": row_split,
                               "evict_first": evict_first, "table_ahead": table_ahead}
    if ablate:
        m["meta"]["persistent"]["ablated"] = sorted(o.name for o in ablate)
    m.pop("digest", None)
    m["digest"] = manifest_digest(m)
    return m, sched
