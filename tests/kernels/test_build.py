"""CPU tests of the kernel build tool (tools/build_kernels.py) and its ABI parser (tools/kernel_abi.py),
plus a check that the committed kernels/kernels.json matches the contract in docs/kernels.md."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

from tools import build_kernels  # noqa: E402
from tools.kernel_abi import KernelAbiError, parse_kparam_info, parse_res_usage  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures"

# Parameter sizes per entry, from the signatures in docs/kernels.md (p = pointer 8, i = int32 4,
# f = float 4, q = int64 8). Offsets follow C alignment.
CONTRACT = {
    "kern_embed_gather": "pppiii",
    "kern_add_rmsnorm": "ppppiif",
    "kern_rope_table": "piif",
    "kern_rope_table_llama3": "piifffff",
    "kern_qk_norm_rope_kv": "ppppppppiiiiiiif",
    "kern_attn_decode_partial": "ppppppiiiiiiiif",
    "kern_attn_decode_reduce": "ppppiiii",
    "kern_attn_prefill": "ppppppiiiiiif",
    "kern_attn_prefill_r32": "ppppppiiiiiif",
    "kern_attn_prefill_wg": "ppppppiiiiiif",
    "kern_qk_norm_rope_kv_warp": "ppppppppiiiiiiif",
    "kern_silu_mul": "ppii",
    "kern_argmax_partial": "piippi",
    "kern_argmax_final": "ppip",
    "kern_sample_bf16": "pppppiipppp",
    "kern_sample_f32": "pppppiipppp",
    "kern_sample_top_logprobs_bf16": "ppiipp",
    "kern_sample_top_logprobs_f32": "ppiipp",
    "kern_sample_history_append": "pppii",
    "kern_philox4x32_10": "ppi",
}


def c_layout(kinds: str) -> list[list[int]]:
    size = {"p": 8, "i": 4, "f": 4, "q": 8}
    out, offset = [], 0
    for kind in kinds:
        s = size[kind]
        offset = (offset + s - 1) // s * s
        out.append([offset, s])
        offset += s
    return out


def test_parse_kparam_info_fixture():
    params = parse_kparam_info((FIXTURES / "tiny.elf.txt").read_text())
    # kern_tiny(const float*, int32_t, double, int8_t, float*)
    assert params["kern_tiny"] == [[0, 8], [8, 4], [16, 8], [24, 1], [32, 8]]
    assert params["kern_tiny_noargs"] == []


def test_parse_res_usage_fixture():
    usage = parse_res_usage((FIXTURES / "tiny.res.txt").read_text())
    assert usage["kern_tiny"]["REG"] == 12
    assert usage["kern_tiny"]["SHARED"] == 0
    assert usage["kern_tiny_noargs"]["REG"] == 4
    assert usage["kern_tiny"]["CONSTANT[0]"] == 568


def test_parse_kparam_rejects_gap_and_duplicate():
    section = ".nv.info.k\n"
    rec = "\tValue:\tIndex : 0x0\tOrdinal : {o}\tOffset  : {off}\tSize    : 0x8\n"
    with pytest.raises(KernelAbiError, match="not 0..1"):
        parse_kparam_info(section + rec.format(o="0x0", off="0x0") + rec.format(o="0x2", off="0x8"))
    with pytest.raises(KernelAbiError, match="twice"):
        parse_kparam_info(section + rec.format(o="0x0", off="0x0") + rec.format(o="0x0", off="0x8"))
    with pytest.raises(KernelAbiError, match="overlaps"):
        parse_kparam_info(section + rec.format(o="0x0", off="0x0") + rec.format(o="0x1", off="0x4"))


def test_committed_kernels_json_matches_contract_and_files():
    doc = json.loads((REPO_ROOT / "kernels" / "kernels.json").read_text())
    assert doc["format"] == "kern-kernels/1"
    assert doc["arch"] == "sm_90"
    entries = {}
    for name, module in doc["modules"].items():
        path = REPO_ROOT / "kernels" / module["file"]
        assert module["file"] == f"{name}-{module['sha256'][:12]}.cubin"
        assert path.is_file(), f"{path} missing"
        assert hashlib.sha256(path.read_bytes()).hexdigest() == module["sha256"], f"{path} hash mismatch"
        assert module["source"] == f"kernels-src/{name}.cu"
        # sm_90 everywhere but the wgmma module (sm_90a: wgmma exists only on the architecture-specific target)
        assert module["flags"] == list(build_kernels.module_flags(name)), name
        for entry, info in module["entries"].items():
            entries[entry] = info
            # kern_attn_prefill_r32: 255 registers and a few loop-invariant values spilled (reloaded once per K/V
            # tile; measured, docs/perf.md "Prefill, ninth session"); kern_attn_decode_gqa_fused: 8 bytes of stack for
            # the call to the IEEE division's slow path in its merge (`o / l`, as kern_attn_decode_reduce divides),
            # made at 168 live registers; no spill. Anything more is a regression
            limit = {"kern_rope_table": None, "kern_rope_table_llama3": None, "kern_attn_prefill_r32": 64,
                     "kern_attn_decode_gqa_fused": 8}.get(entry, 0)
            assert limit is None or info["local"] <= limit, f"{entry}: {info['local']} local bytes (spills?)"
    # kern_attn_prefill_wg moves registers between its warpgroups with setmaxnreg (producer 40, consumers 232):
    # 128 x 40 + 256 x 232 = 65,536 - 1,024 fits only if the launch allocates exactly 168 per thread (384
    # threads); at fewer the consumers' setmaxnreg.inc would wait forever
    assert entries["kern_attn_prefill_wg"]["registers"] == 168
    for entry, kinds in CONTRACT.items():
        assert entry in entries, f"{entry} missing from kernels.json"
        assert entries[entry]["params"] == c_layout(kinds), f"{entry}: ABI differs from docs/kernels.md"


def _toolchain_or_skip():
    try:
        return build_kernels.find_toolchain()
    except build_kernels.BuildError as exc:
        pytest.skip(f"no CUDA toolchain here: {exc}")


def test_real_build_of_tiny_kernel_is_reproducible_and_append_only(tmp_path):
    tc = _toolchain_or_skip()
    src = tmp_path / "src"
    src.mkdir()
    (src / "tiny.cu").write_text((FIXTURES / "tiny.cu").read_text())
    out = tmp_path / "out"
    out.mkdir()
    stale = out / "tiny-000000000000.cubin"  # an old build: must survive
    stale.write_bytes(b"old")
    work1, work2 = tmp_path / "w1", tmp_path / "w2"
    work1.mkdir()
    work2.mkdir()
    doc1 = build_kernels.build_all(src, out, tc, work1)
    doc2 = build_kernels.build_all(src, out, tc, work2)
    assert doc1 == doc2, "two builds of the same source differ"
    module = doc1["modules"]["tiny"]
    assert (out / module["file"]).is_file() and stale.read_bytes() == b"old"
    assert module["entries"]["kern_tiny"]["params"] == [[0, 8], [8, 4], [16, 8], [24, 1], [32, 8]]
    assert module["entries"]["kern_tiny_noargs"]["params"] == []
    assert module["flags"] == list(build_kernels.FLAGS)
    build_kernels.write_json(doc1, out / "kernels.json")
    assert json.loads((out / "kernels.json").read_text()) == doc1
    assert build_kernels.check(src, out, tc) == []


def test_module_flags_swap_only_the_arch():
    """A MODULE_ARCH module gets FLAGS with its own -arch in place of sm_90 and nothing else changed; every other
    module gets FLAGS as they are."""
    assert build_kernels.module_flags("attention") == build_kernels.FLAGS
    wg = build_kernels.module_flags("attention_wg")
    assert wg == tuple("-arch=sm_90a" if f == "-arch=sm_90" else f for f in build_kernels.FLAGS)
    assert "-arch=sm_90" not in wg and len(wg) == len(build_kernels.FLAGS)
