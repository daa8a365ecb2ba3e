"""Every `pdl: true` launch of the committed manifests runs a kernel that waits for its predecessor.

Programmatic dependent launch lets a kernel start before the previous one on the stream has finished;
that is only safe when the kernel executes `griddepcontrol.wait` (SASS `ACQBULK`) before touching what
the predecessor writes. tools/gen_qwen3.py only marks entries of its PDL_ENTRIES table; this test checks
that table against the SASS of the committed cubins (cuobjdump -sass; skipped where cuobjdump or nvdisasm
is missing: set CUOBJDUMP and NVDISASM_PATH, e.g. the nvidia-cuda-cuobjdump / -nvdisasm wheels): the
function holds an ACQBULK, and no path of its control-flow graph exits without passing one
(tools/sass_paths.py). The one gap it found (kern_attn_decode_partial_early with num_q_heads <= 0) was closed
in the sixth session.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import pytest

from kern_run.models import qwen3 as gq
from tools import sass_paths
from kern_run_testutil import ROOT
from kern_runtime.sass import find_cuobjdump

MANIFESTS = sorted((ROOT / "manifests").glob("*.json"))


@lru_cache(maxsize=None)
def _sass_functions(cubin: Path) -> dict[str, list[sass_paths.Instr]]:
    """entry name -> its instructions (one cuobjdump -sass run per cubin)."""
    tool = find_cuobjdump()
    assert tool is not None
    try:
        return sass_paths.cubin_functions(cubin, tool)
    except sass_paths.SassPathError as exc:
        pytest.skip(f"cuobjdump -sass failed (nvdisasm missing?): {str(exc)[:200]}")


def test_pdl_entries_are_a_subset_of_the_contract() -> None:
    assert gq.PDL_ENTRIES <= set(gq.KERNEL_SIGNATURES)


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_pdl_launches_wait_for_their_predecessor(path: Path) -> None:
    manifest = json.loads(path.read_text())
    pdl = {(l["module"], l["entry"]) for op in manifest["ops"].values() for l in op["launches"] if l.get("pdl")}
    assert {entry for _, entry in pdl} <= gq.PDL_ENTRIES
    if not pdl:
        return
    if find_cuobjdump() is None:
        pytest.skip("no cuobjdump: cannot read the SASS")
    for module, entry in sorted(pdl):
        cubin = ROOT / "kernels" / f"{module}-{manifest['modules'][module][:12]}.cubin"
        sass = _sass_functions(cubin)
        assert entry in sass, f"{entry} not in {cubin.name}"
        body = sass[entry]
        assert any(i.op.startswith("ACQBULK") for i in body), (
            f"{entry} ({cubin.name}) is launched with pdl but never waits (no ACQBULK)")
        exits = sass_paths.unwaited_exits(body)
        assert not exits, (f"{entry} ({cubin.name}) can exit without griddepcontrol.wait: EXIT at "
                           f"{', '.join(f'{a:#06x}' for a in exits)} (tools/sass_paths.py)")


def test_every_pdl_entry_of_the_built_cubins_waits() -> None:
    """The same check on every PDL_ENTRIES entry of kernels/kernels.json's current cubins, whether or not a
    committed manifest launches it yet (a variant's entry, e.g. kern_attn_decode_partial_wide)."""
    meta = json.loads((ROOT / "kernels" / "kernels.json").read_text())
    built = [(name, mod["file"], entry) for name, mod in sorted(meta["modules"].items())
             for entry in sorted(mod["entries"]) if entry in gq.PDL_ENTRIES]
    assert {entry for *_, entry in built} == gq.PDL_ENTRIES, "a PDL entry is missing from the built cubins"
    if find_cuobjdump() is None:
        pytest.skip("no cuobjdump: cannot read the SASS")
    for _, file, entry in built:
        body = _sass_functions(ROOT / "kernels" / file)[entry]
        assert any(i.op.startswith("ACQBULK") for i in body), f"{entry} ({file}) never waits (no ACQBULK)"
        exits = sass_paths.unwaited_exits(body)
        assert not exits, (f"{entry} ({file}) can exit without griddepcontrol.wait: EXIT at "
                           f"{', '.join(f'{a:#06x}' for a in exits)} (tools/sass_paths.py)")
