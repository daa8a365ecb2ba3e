"""Load-time trust check of kernels that touch peer memory: no multicast instruction in their SASS.

Every kernel launch that receives a peer table or an export buffer (or a pooled state, which peers
can map) has its function's SASS read with `cuobjdump -sass` and is refused with a
`KernelArtifactError` when it holds a multicast instruction. Scans are cached by the cubin's sha256
(one cuobjdump run per cubin per process).

What is refused (`MULTICAST_PATTERNS`), and why only this:

- `LDGMC`: the sm_90 SASS of PTX `multimem.ld_reduce` (load-reduce through a multicast address).
- `MULTIMEM` / `multimem`: the spelling of multimem instructions in other architectures' SASS and
  in any embedded PTX text.
- On sm_90, PTX `multimem.st` and `multimem.red` assemble to exactly the encodings of
  `st.relaxed.sys` / `red.relaxed.sys` (`STG.E.STRONG.SYS`, `REDG.E.*.STRONG.SYS`: checked bit for bit
  with nvcc 13.0, see tests/multigpu/fixtures): they are multicast only through the address they
  are given, so SASS cannot tell them apart and they are not refused. A multicast address only exists
  after `cuMulticastCreate`, which kern never calls (and `NCCL_NVLS_ENABLE=0` keeps NCCL from it).
- `.multicast::cluster` (TMA / bulk copies multicast to the CTAs of one cluster) stays within one
  GPU's SMs and is not NVLink multicast; it is not refused.

Without a disassembler the check cannot run, and a peer launch is then refused (never skipped):
set `CUOBJDUMP` (and `NVDISASM_PATH` if nvdisasm is not beside it), or put cuobjdump on PATH.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from ..errors import KernelArtifactError

MULTICAST_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("LDGMC (multimem.ld_reduce)", re.compile(r"\bLDGMC\b")),
    ("MULTIMEM", re.compile(r"\bMULTIMEM\b")),
    ("multimem", re.compile(r"\bmultimem\.")),
)
_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)\s*$")
_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")

_cache: dict[str, dict[str, list[str]]] = {}
_cache_lock = threading.Lock()


def parse_sass_addressed(text: str) -> dict[str, list[tuple[int, str]]]:
    """`cuobjdump -sass` output -> {function name: [(address, instruction text), ...]} (encodings dropped)."""
    out: dict[str, list[tuple[int, str]]] = {}
    current: list[tuple[int, str]] | None = None
    for line in text.splitlines():
        m = _FUNCTION.match(line)
        if m:
            current = out.setdefault(m.group(1), [])
            continue
        if current is None:
            continue
        im = _INSTR.search(line)
        if im:
            current.append((int(im.group(1), 16), im.group(2)))
    return out


def parse_sass(text: str) -> dict[str, list[str]]:
    """`cuobjdump -sass` output -> {function name: [instruction text, ...]} (addresses and encodings dropped)."""
    return {fn: [instr for _, instr in instrs] for fn, instrs in parse_sass_addressed(text).items()}


def multicast_findings(instructions: list[str]) -> list[str]:
    """The instructions of one function that match a multicast pattern, each with the pattern's name."""
    found = []
    for instr in instructions:
        for name, pattern in MULTICAST_PATTERNS:
            if pattern.search(instr):
                found.append(f"{instr} [{name}]")
                break
    return found


def find_cuobjdump() -> str | None:
    """`$CUOBJDUMP`, else cuobjdump on PATH, $CUDA_HOME/bin, /usr/local/cuda/bin, or the
    nvidia-cuda-cuobjdump wheel (nvidia/cu13/bin, nvidia/cuda_cuobjdump/bin) in sys.path."""
    explicit = os.environ.get("CUOBJDUMP")
    if explicit:
        return explicit if Path(explicit).is_file() else None
    found = shutil.which("cuobjdump")
    if found:
        return found
    for base in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if base and (Path(base) / "bin" / "cuobjdump").is_file():
            return str(Path(base) / "bin" / "cuobjdump")
    import sys

    for entry in sys.path:
        for sub in ("nvidia/cu13/bin", "nvidia/cu12/bin", "nvidia/cuda_cuobjdump/bin"):
            cand = Path(entry) / sub / "cuobjdump"
            if cand.is_file():
                return str(cand)
    return None


def _disassembler_env(cuobjdump: str) -> dict[str, str]:
    """cuobjdump -sass runs nvdisasm: make one findable (beside cuobjdump, NVDISASM_PATH, wheels)."""
    env = dict(os.environ)
    dirs = [str(Path(cuobjdump).parent)]
    if env.get("NVDISASM_PATH"):
        dirs.append(str(Path(env["NVDISASM_PATH"]).parent if Path(env["NVDISASM_PATH"]).is_file() else env["NVDISASM_PATH"]))
    import sys

    for entry in sys.path:
        for sub in ("nvidia/cu13/bin", "nvidia/cu12/bin", "nvidia/cuda_nvdisasm/bin"):
            if (Path(entry) / sub / "nvdisasm").is_file():
                dirs.append(str(Path(entry) / sub))
    env["PATH"] = os.pathsep.join(dirs + [env.get("PATH", "")])
    return env


def disassemble(cubin: Path, cuobjdump: str) -> subprocess.CompletedProcess[str]:
    """`cuobjdump -sass cubin` (text), with an nvdisasm made findable; the caller checks the return code."""
    return subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True,
                          env=_disassembler_env(cuobjdump))


def scan_cubin(image: bytes, module: str, cuobjdump: str | None = None) -> dict[str, list[str]]:
    """{function: [multicast findings]} for every function of a cubin; cached by its sha256.

    Raises KernelArtifactError when no cuobjdump is available or it fails (the check never passes
    by default)."""
    digest = hashlib.sha256(image).hexdigest()
    with _cache_lock:
        hit = _cache.get(digest)
    if hit is not None:
        return hit
    tool = cuobjdump or find_cuobjdump()
    if tool is None:
        raise KernelArtifactError(
            f"module {module!r}: a launch receives peer memory, so its SASS must be checked for multicast "
            "instructions, but cuobjdump was not found (set CUOBJDUMP=/path/to/cuobjdump, put it on PATH, or "
            "install the nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels); peer launches are refused")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{module}.cubin"
        path.write_bytes(image)
        proc = disassemble(path, tool)
    if proc.returncode != 0 or "Function" not in proc.stdout:
        raise KernelArtifactError(
            f"module {module!r}: `{tool} -sass` failed (exit {proc.returncode}): "
            f"{(proc.stderr or proc.stdout).strip()[:400]}; the multicast check of peer launches cannot run "
            "(cuobjdump -sass needs nvdisasm beside it or NVDISASM_PATH)")
    result = {fn: multicast_findings(instrs) for fn, instrs in parse_sass(proc.stdout).items()}
    with _cache_lock:
        _cache[digest] = result
    return result


def check_peer_launch(image: bytes, module: str, entry: str, where: str, cuobjdump: str | None = None) -> None:
    """Refuse (KernelArtifactError) launch `entry` of `module` if its SASS holds a multicast instruction
    or the entry is not in the disassembly."""
    functions = scan_cubin(image, module, cuobjdump)
    if entry not in functions:
        raise KernelArtifactError(f"{where}: entry {entry!r} is not in the SASS of module {module!r} "
                                  f"(functions: {sorted(functions)[:8]}); the multicast check cannot pass")
    found = functions[entry]
    if found:
        raise KernelArtifactError(f"{where}: entry {entry!r} of module {module!r} receives peer memory and its SASS "
                                  f"holds multicast instruction(s): {'; '.join(found[:4])}. kern never maps multicast "
                                  "memory; rebuild the kernel without multimem")
