"""CPU checks of kernels-src/attention_decode.cu (kern_attn_decode_partial_stream) against the sources it must
agree with, and of the pieces tools/decode_attention_cpu_emu.py rests on.

- Its copy of the decode split rule (split length, 32-bit row bound, launch limits) says what attention.cu's says:
  kern_attn_decode_reduce (attention.cu) recomputes the split length, so the two must never drift apart.
- The committed kernels.json holds the entry in module attention_decode with the contract's ABI (the early
  entries' parameters) and the shared memory its launch geometry is designed for (6 blocks per SM).
- The emulator's stand-ins cover exactly the PTX wrappers they replace.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from kern_run.models import qwen3 as gq
from tools import decode_attention_cpu_emu as emu

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "kernels-src"


def _function(text: str, name: str) -> str:
    """The definition of KERN_DEV function `name` (signature and body), whitespace collapsed."""
    match = re.search(rf"KERN_DEV [\w:]+ {name}\((.*?)\n}}\n", text, re.S)
    assert match, f"{name} not found"
    return " ".join(match.group(0).split())


def _define(text: str, name: str) -> int:
    match = re.search(rf"#define {name} (\d+)", text)
    assert match, f"#define {name} not found"
    return int(match.group(1))


def test_split_rule_is_the_one_of_attention_cu() -> None:
    old, new = (SRC / "attention.cu").read_text(), (SRC / "attention_decode.cu").read_text()
    assert _define(old, "DEC_GRAN") == _define(new, "ST_GRAN")
    assert _define(old, "DEC_MAX_D") == _define(new, "ST_MAX_D_ANY")
    renames = {"st_num_pages_overflow": "num_pages_overflow", "st_split_len": "decode_split_len",
               "st_launch_ok": "decode_launch_ok", "ST_GRAN": "DEC_GRAN", "ST_MAX_D_ANY": "DEC_MAX_D"}
    for mine, theirs in (("st_num_pages_overflow", "num_pages_overflow"), ("st_split_len", "decode_split_len"),
                         ("st_launch_ok", "decode_launch_ok")):
        body = _function(new, mine)
        for a, b in renames.items():
            body = re.sub(rf"\b{a}\b", b, body)
        assert body == _function(old, theirs), f"{mine} differs from attention.cu's {theirs}"
    # the entry derives begin / end exactly as decode_split_range does
    assert "min((int64_t)x * len, (int64_t)seq_len)" in new and "min((int64_t)x * len + len, (int64_t)seq_len)" in new


def test_committed_kernels_json_has_the_stream_entry() -> None:
    meta = json.loads((ROOT / "kernels" / "kernels.json").read_text())
    mod = meta["modules"]["attention_decode"]
    assert mod["source"] == "kernels-src/attention_decode.cu"
    info = mod["entries"]["kern_attn_decode_partial_stream"]
    wide = meta["modules"]["attention"]["entries"]["kern_attn_decode_partial_wide"]
    assert info["params"] == wide["params"], "the stream partial must take the wide partial's parameters"
    assert gq.KERNEL_SIGNATURES["kern_attn_decode_partial_stream"] == (
        "attention_decode", gq.KERNEL_SIGNATURES["kern_attn_decode_partial_wide"][1])
    assert "kern_attn_decode_partial_stream" in gq.PDL_ENTRIES
    # static shared memory (plus the 1 KiB a block reserves) and registers for 6 blocks of 64 threads per SM
    assert info["local"] == 0, "the stream partial spills"
    assert 6 * info["shared"] <= 228 * 1024 and 6 * 64 * info["registers"] <= 65536, info
    assert (ROOT / "kernels" / mod["file"]).is_file()


def test_emulator_stand_ins_cover_the_ptx_wrappers() -> None:
    prefill = (SRC / "prefill.cuh").read_text()
    stand_ins = (ROOT / "tools" / "cpu_emu" / "attn_emu.h").read_text()
    for name in emu.PTX_WRAPPERS:
        assert f" {name}(" in prefill and f" {name}(" in stand_ins, name
        stripped = emu._strip_function(prefill, name)
        assert not re.search(rf"^KERN_DEV \w+ {name}\(", stripped, re.M) and len(stripped) < len(prefill), name
    real, fake = (SRC / "stream_copy.cuh").read_text(), (ROOT / "tools" / "cpu_emu" / "stream_copy.cuh").read_text()
    names = set(re.findall(r"KERN_DEV \w+ (\w+)\(", real))
    assert names == {"cp_async16_if", "cp_async_wait_1", "movmatrix_trans"} == set(re.findall(r"KERN_DEV \w+ (\w+)\(", fake))
    assert "asm" not in (SRC / "attention_decode.cu").read_text(), "inline PTX belongs in stream_copy.cuh"
    assert emu.R32_MARKER in (SRC / "attention.cu").read_text()
