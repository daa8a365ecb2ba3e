"""Build kern's own kernels: kernels-src/*.cu -> kernels/<module>-<sha12>.cubin + kernels/kernels.json.

Usage (from anywhere):
    python tools/build_kernels.py            # build, add new cubins, rewrite kernels/kernels.json
    python tools/build_kernels.py --check    # rebuild into a temp dir; fail unless hashes and ABI
                                             # equal the committed kernels/kernels.json

Each `kernels-src/<module>.cu` (headers `*.cuh` are included, not built) becomes one module compiled with
`nvcc` FLAGS. A cubin already in `kernels/` is never rewritten (its name is its hash); one that neither
kernels.json nor a committed manifest names any more is removed with `tools/kernels_dir.py prune` (git
keeps it: `tools/kernels_dir.py restore REV` brings an older commit's back for an A/B). Each entry's parameter layout is read from the cubin itself
(`cuobjdump -elf`, EIATTR_KPARAM_INFO), registers / shared / local bytes from `cuobjdump -res-usage`.
Format: docs/kernels.md. Builds are reproducible: the same sources and toolchain give the same bytes
(checked by --check; nvcc embeds no paths or timestamps in a -cubin without -G/-lineinfo).

Tools: NVCC / CUOBJDUMP environment variables, else PATH, else $CUDA_HOME/bin and /usr/local/cuda/bin.
(`cuobjdump` also comes as the `nvidia-cuda-cuobjdump` wheel: nvidia/cu13/bin/cuobjdump.)

Options: --src (kernel sources), --out (cubins + kernels.json), --check, --modules a,b (build only these).
Errors (exit 2, one line on stderr naming the tool, module or file; a failed compile adds the compiler's
output): a tool that is missing, cannot be run or prints no version; a compile that fails; a cubin whose
`cuobjdump` dump is not a consistent ABI; a committed kernels.json (--check, --modules) that is missing or
not JSON; an --out that cannot be written. Every module is compiled and described before anything is copied
into --out, cubins and kernels.json go through temporary files renamed into place, so a failed build leaves
--out as it was. --check exits 1 on a difference.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kern_manifest import json_text_fault  # why a JSON file is unusable, worded as everywhere in kern
from kern_run.files import write_files
from tools.kernel_abi import KernelAbiError, parse_kparam_info, parse_res_usage

REPO_ROOT = Path(__file__).resolve().parent.parent
FORMAT = "kern-kernels/1"
ARCH = "sm_90"
# -cubin for one machine-code target; no -G / -lineinfo (they embed paths); fixed language standard.
FLAGS = ("-cubin", f"-arch={ARCH}", "-O3", "-std=c++17")
# Modules that use architecture-specific instructions (wgmma) build for sm_90a: such a cubin runs only on
# compute capability 9.0 (H100 / H200), which is kern's one target anyway.
MODULE_ARCH = {"attention_wg": "sm_90a", "gemm_skinny": "sm_90a"}


def module_flags(module: str) -> tuple[str, ...]:
    """nvcc flags of one module: FLAGS, with the module's own -arch where MODULE_ARCH names one."""
    arch = MODULE_ARCH.get(module)
    return FLAGS if arch is None else tuple(f"-arch={arch}" if f == f"-arch={ARCH}" else f for f in FLAGS)


class BuildError(RuntimeError):
    """A tool is missing, a compile failed, or a rebuild differs from what is committed."""


@dataclass(frozen=True)
class Toolchain:
    nvcc: str
    cuobjdump: str
    version: str  # e.g. "Cuda compilation tools, release 13.0, V13.0.88"


def compile_probe(module: str, defines: tuple[str, ...] | list[str], out_dir: Path) -> Path:
    """kernels-src/<module>.cu compiled with the build's flags (module_flags) and -D for each of `defines` into
    out_dir/<module>[-defines].cubin (a timing or test variant, never committed); returns the path. Raises
    subprocess.CalledProcessError (its stderr: nvcc's messages) when the compile fails."""
    tag = "".join("-" + re.sub(r"[^A-Za-z0-9_]", "", d) for d in defines)
    out = Path(out_dir) / f"{module}{tag}.cubin"
    cmd = ["nvcc", *module_flags(module), *(f"-D{d}" for d in defines), "-o", str(out),
           str(REPO_ROOT / "kernels-src" / f"{module}.cu")]
    subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO_ROOT / "kernels-src")
    return out


def _find_tool(name: str, env_var: str) -> str | None:
    explicit = os.environ.get(env_var)
    if explicit:
        return explicit if Path(explicit).is_file() else None
    found = shutil.which(name)
    if found:
        return found
    for base in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if base and (Path(base) / "bin" / name).is_file():
            return str(Path(base) / "bin" / name)
    return None


def find_toolchain() -> Toolchain:
    """Locate nvcc and cuobjdump; raise BuildError naming what is missing."""
    nvcc = _find_tool("nvcc", "NVCC")
    cuobjdump = _find_tool("cuobjdump", "CUOBJDUMP")
    if nvcc is None:
        raise BuildError("nvcc not found (set NVCC=/path/to/nvcc or put it on PATH)")
    if cuobjdump is None:
        raise BuildError(
            "cuobjdump not found (set CUOBJDUMP=/path/to/cuobjdump, put it on PATH, or install the "
            "nvidia-cuda-cuobjdump wheel: nvidia/cu13/bin/cuobjdump)"
        )
    out = _run([nvcc, "--version"])
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    if not lines:
        raise BuildError(f"{nvcc} --version printed nothing (is NVCC a CUDA compiler?)")
    version = next((line for line in lines if "release" in line), lines[-1])
    return Toolchain(nvcc=nvcc, cuobjdump=cuobjdump, version=version)


def _run(cmd: list[str], cwd: Path | None = None) -> str:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    except OSError as exc:  # not executable, not a program, vanished
        raise BuildError(f"{cmd[0]} cannot be run: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def compile_module(tc: Toolchain, source: Path, out_cubin: Path) -> None:
    """nvcc module_flags(source's module) source -o out_cubin, run from the source's directory with a relative
    source name."""
    _run([tc.nvcc, *module_flags(source.stem), "-o", str(out_cubin), source.name], cwd=source.parent)


def describe_cubin(tc: Toolchain, cubin: Path) -> dict[str, dict]:
    """Entries of a cubin: {entry: {"params": [[offset, size], ...], "registers", "shared", "local",
    "constants": {}}} from cuobjdump. Raises BuildError if an entry lacks resource usage."""
    try:
        params = parse_kparam_info(_run([tc.cuobjdump, "-elf", str(cubin)]))
    except KernelAbiError as exc:
        raise BuildError(f"{cubin.name}: {tc.cuobjdump} -elf: {exc}") from None
    usage = parse_res_usage(_run([tc.cuobjdump, "-res-usage", str(cubin)]))
    entries: dict[str, dict] = {}
    for entry in sorted(set(params) | set(usage)):
        if entry not in usage:
            raise BuildError(f"{cubin.name}: entry {entry} has no resource usage line")
        res = usage[entry]
        entries[entry] = {
            "params": params.get(entry, []),
            "registers": res.get("REG", 0),
            "shared": res.get("SHARED", 0),
            "local": res.get("LOCAL", 0) + res.get("STACK", 0),
            "constants": {},
        }
    return entries


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_all(src_dir: Path, out_dir: Path, tc: Toolchain, work_dir: Path, modules: list[str] | None = None) -> dict:
    """Compile every src_dir/*.cu (or only the named modules) into work_dir, copy new cubins into
    out_dir (never overwriting or deleting), and return the kernels.json document (not written).
    Every module is compiled and described first: on any error nothing is copied."""
    sources = sorted(src_dir.glob("*.cu"))
    if modules is not None:
        missing = sorted(set(modules) - {s.stem for s in sources})
        if missing:
            raise BuildError(f"no source for module(s) {missing} in {src_dir}")
        sources = [s for s in sources if s.stem in modules]
    if not sources:
        raise BuildError(f"no *.cu sources in {src_dir}")

    def one(source: Path) -> tuple[str, dict]:
        module = source.stem
        tmp_cubin = work_dir / f"{module}.cubin"
        compile_module(tc, source, tmp_cubin)
        digest = sha256_file(tmp_cubin)
        try:
            rel_source = source.resolve().relative_to(REPO_ROOT).as_posix()
        except ValueError:
            rel_source = source.as_posix()
        return module, {
            "file": f"{module}-{digest[:12]}.cubin",
            "sha256": digest,
            "source": rel_source,
            "flags": list(module_flags(module)),
            "entries": describe_cubin(tc, tmp_cubin),
        }

    with ThreadPoolExecutor(max_workers=min(8, len(sources))) as pool:
        modules = dict(pool.map(one, sources))
    new: list[tuple[Path, Path]] = []  # (built cubin, its place in out_dir)
    for module, info in modules.items():
        final = out_dir / info["file"]
        if final.exists():
            if sha256_file(final) != info["sha256"]:
                raise BuildError(f"{final} exists with different contents (sha12 collision or tampering)")
        else:
            new.append((work_dir / f"{module}.cubin", final))
    if out_dir.exists() and not out_dir.is_dir():
        raise BuildError(f"--out {out_dir} exists and is not a directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_files({final: built.read_bytes() for built, final in new})  # all new cubins whole, or none
    return {"format": FORMAT, "toolchain": tc.version, "arch": ARCH, "modules": dict(sorted(modules.items()))}


def _read_json(path: Path, what: str) -> dict:
    """A committed kernels.json. Raises BuildError naming the file when it is missing, unreadable, not UTF-8 or
    not (usable) JSON (the reason is kern_manifest.json_text_fault's)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BuildError(f"{path}: {what}: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:  # not UTF-8, invalid JSON, too deep, past the digit limit
        reason = json_text_fault(exc)
        if reason is None:
            raise
        raise BuildError(f"{path}: {what}: {reason}") from None
    if not isinstance(doc, dict):
        raise BuildError(f"{path}: {what}: a JSON {type(doc).__name__}, expected an object")
    return doc


def write_json(doc: dict, path: Path) -> None:
    """Indented JSON with each [offset, size] pair and each flag list kept on one line."""
    text = json.dumps(doc, indent=2)
    text = re.sub(r"\[\s*(-?\d+),\s*(-?\d+)\s*\]", r"[\1, \2]", text)
    text = re.sub(r'"flags": \[[^\]]*\]', lambda m: '"flags": ' + json.dumps(json.loads(m.group(0)[9:])), text)
    write_files({path: text + "\n"})


def merge_partial(metadata_path: Path, partial: dict) -> dict:
    """A `--modules` build rebuilt only some modules: keep every other module's committed entry.

    Raises BuildError when the committed metadata was made by another toolchain (mixing toolchains in one
    kernels.json would break the reproducibility check)."""
    if not metadata_path.exists():
        return partial
    committed = _read_json(metadata_path, "the committed kernels.json (kept for the modules not rebuilt)")
    if committed.get("toolchain") != partial["toolchain"]:
        raise BuildError(
            f"{metadata_path} was built with {committed.get('toolchain')!r}, this toolchain is "
            f"{partial['toolchain']!r}: rebuild every module (omit --modules)"
        )
    if not isinstance(committed.get("modules", {}), dict):
        raise BuildError(f"{metadata_path}: modules is not an object")
    merged = dict(committed.get("modules", {}))
    merged.update(partial["modules"])
    return {**partial, "modules": dict(sorted(merged.items()))}


def check(src_dir: Path, kernels_dir: Path, tc: Toolchain, modules: list[str] | None = None) -> list[str]:
    """Rebuild into a temp dir and compare with the committed kernels.json; return the differences."""
    committed = _read_json(kernels_dir / "kernels.json", "the committed kernels.json --check compares with")
    if modules is not None and isinstance(committed.get("modules"), dict):
        committed["modules"] = {k: v for k, v in committed["modules"].items() if k in modules}
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "out").mkdir()
        (tmp_path / "work").mkdir()
        fresh = build_all(src_dir, tmp_path / "out", tc, tmp_path / "work", modules)
    if committed.get("toolchain") != fresh["toolchain"]:
        problems.append(f"toolchain: committed {committed.get('toolchain')!r}, here {fresh['toolchain']!r}")
    old_modules, new_modules = committed.get("modules", {}), fresh["modules"]
    if not isinstance(old_modules, dict):
        raise BuildError(f"{kernels_dir / 'kernels.json'}: modules is not an object")
    for name in sorted(set(old_modules) | set(new_modules)):
        old, new = old_modules.get(name), new_modules.get(name)
        if old is None or new is None:
            problems.append(f"module {name}: {'not committed' if old is None else 'no source any more'}")
            continue
        if not isinstance(old, dict) or not isinstance(old.get("sha256"), str) or not isinstance(old.get("file"), str):
            problems.append(f"module {name}: the committed record has no sha256 / file strings")
            continue
        if old["sha256"] != new["sha256"]:
            problems.append(f"module {name}: committed sha256 {old['sha256'][:12]}, rebuilt {new['sha256'][:12]}")
        if old.get("entries") != new["entries"]:
            problems.append(f"module {name}: entry metadata differs from the rebuild")
        cubin = kernels_dir / old["file"]
        if not cubin.exists():
            problems.append(f"module {name}: {cubin} missing")
        elif sha256_file(cubin) != old["sha256"]:
            problems.append(f"module {name}: {cubin} does not hash to the committed sha256")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=REPO_ROOT / "kernels-src", help="kernel sources (*.cu)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "kernels", help="cubins + kernels.json")
    parser.add_argument("--check", action="store_true", help="verify the committed build is reproducible")
    parser.add_argument("--modules", help="comma-separated module names to build (default: every *.cu)")
    args = parser.parse_args(argv)
    modules = [m for m in args.modules.split(",") if m] if args.modules else None
    try:
        tc = find_toolchain()
        if args.check:
            problems = check(args.src, args.out, tc, modules)
            for problem in problems:
                print(f"MISMATCH {problem}", file=sys.stderr)
            print("kernels: check " + ("FAILED" if problems else "ok") + f" ({tc.version})")
            return 1 if problems else 0
        if modules is not None:  # the committed kernels.json it merges into is checked before anything is built
            merge_partial(args.out / "kernels.json", {"toolchain": tc.version, "modules": {}})
        with tempfile.TemporaryDirectory() as work:
            doc = build_all(args.src, args.out, tc, Path(work), modules)
        if modules is not None:
            doc = merge_partial(args.out / "kernels.json", doc)
        write_json(doc, args.out / "kernels.json")
        for name, module in doc["modules"].items():
            print(f"{name:10s} {module['file']}  entries: {', '.join(module['entries'])}")
        return 0
    except BuildError as exc:
        print(f"build_kernels: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # writing --out
        print(f"build_kernels: {exc.filename or args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
