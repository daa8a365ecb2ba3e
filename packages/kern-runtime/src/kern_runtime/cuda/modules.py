"""Pinned cubins: find and hash exactly the files the manifest names, load them, resolve entries.

On disk a module is `<kernels_dir>/<module>-<sha12>.cubin` (sha12: first 12 hex digits of its
sha256). `read_pinned_modules` opens only those paths, hashes each whole file and refuses a missing
or mismatching one with a `KernelArtifactError` naming module, expected hash and path. No other file
of the directory is read (or listed).

Entry resolution: a launch's entry is looked up in its own module only. Every function of that
name is a candidate; its parameter layout from `cuFuncGetParamInfo` must equal the manifest's
`params`, and that picks the instance. Triton writes one cubin (one function) per instance, so
same-named Triton instances are separate modules and the check confirms each launch's module holds
the instance its params describe.

Function attributes: the dynamic shared memory limit and the preferred shared-memory carveout belong to
the function, not to a launch; `function_attributes` aggregates them over every launch of a function.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from kern_manifest import Launch, Manifest

from .driver import call, check, cu
from ..errors import DriverError, KernelArtifactError, ManifestError

Layout = tuple[tuple[int, int], ...]


def module_path(kernels_dir: str | os.PathLike[str], module: str, sha256: str) -> Path:
    """`<kernels_dir>/<module>-<sha12>.cubin`."""
    return Path(kernels_dir) / f"{module}-{sha256[:12].lower()}.cubin"


def read_pinned_modules(kernels_dir: str | os.PathLike[str], modules: Mapping[str, str]) -> dict[str, bytes]:
    """module name -> cubin bytes, each verified against its pinned sha256.

    Raises KernelArtifactError (module, expected sha256, path) for a missing, unreadable or
    mismatching file.
    """
    images: dict[str, bytes] = {}
    for module, expected in modules.items():
        path = module_path(kernels_dir, module, expected)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise KernelArtifactError(f"module {module!r}: {path} is missing (manifest pins sha256 {expected})") from None
        except OSError as exc:
            raise KernelArtifactError(f"module {module!r}: cannot read {path} (pinned sha256 {expected}): {exc}") from exc
        got = hashlib.sha256(data).hexdigest()
        if got != expected.lower():
            raise KernelArtifactError(f"module {module!r}: {path} has sha256 {got}, the manifest pins {expected}")
        images[module] = data
    return images


def choose_instance(candidates: Sequence[tuple[Any, Layout]], expected: Layout, where: str) -> Any:
    """The one candidate function whose parameter layout equals `expected`.

    `candidates`: (function, layout) for every function with the entry's name.
    Raises KernelArtifactError when none matches (listing what the module has) or when several
    match (the manifest cannot tell them apart).
    """
    if not candidates:
        raise KernelArtifactError(f"{where}: no function of that name in the module")
    matches = [fn for fn, layout in candidates if tuple(layout) == tuple(expected)]
    if len(matches) == 1:
        return matches[0]
    found = "; ".join(str([list(p) for p in layout]) for _, layout in candidates)
    if not matches:
        raise KernelArtifactError(
            f"{where}: ABI mismatch: the manifest's params {[list(p) for p in expected]} match none of the "
            f"{len(candidates)} instance(s) in the module: {found}"
        )
    raise KernelArtifactError(f"{where}: {len(matches)} instances have the manifest's params {[list(p) for p in expected]}; ambiguous")


@dataclass
class FunctionAttributes:
    """What the launches of one function ask of it at load (function attributes, not launch attributes)."""

    function: Any
    shared_mem: int = 0  # the largest dynamic shared memory of any launch, bytes
    carveout: int | None = None  # preferred shared-memory carveout, percent; None: no launch gives one
    carveout_path: str = ""  # the launch that gave it


def function_attributes(uses: Iterable[tuple[Any, str, int, int | None]]) -> list[FunctionAttributes]:
    """Aggregate per function, from `(function, launch path, dynamic shared bytes, carveout or None)` per launch.

    Functions are told apart by `int(function)` (the CUfunction handle), so launches of one function from
    several ops meet here. The dynamic shared memory limit is the largest size over them (raising it per
    launch would leave the last op's value and refuse a bigger launch of another op:
    CUDA_ERROR_INVALID_VALUE at launch). The carveout is the one value its launches give; a launch without
    one does not count, and two different values are a `ManifestError` naming both launches.
    """
    out: dict[int, FunctionAttributes] = {}
    for function, path, shared, carveout in uses:
        attrs = out.setdefault(int(function), FunctionAttributes(function))
        attrs.shared_mem = max(attrs.shared_mem, int(shared))
        if carveout is None:
            continue
        if attrs.carveout is None:
            attrs.carveout, attrs.carveout_path = int(carveout), path
        elif attrs.carveout != carveout:
            raise ManifestError(f"{path}.carveout: {carveout} differs from carveout {attrs.carveout} at "
                                f"{attrs.carveout_path}.carveout, a launch of the same function; the preferred "
                                "shared-memory carveout is a property of the function: give every launch of it "
                                "the same value")
    return list(out.values())


# ---------------------------------------------------------------- driver side


def param_layout(function: Any) -> Layout:
    """[(offset, size)] of every parameter of `function`, via cuFuncGetParamInfo until
    CUDA_ERROR_INVALID_VALUE (past the last parameter)."""
    driver = cu()
    out = []
    index = 0
    while True:
        result = driver.cuFuncGetParamInfo(function, index)
        if int(result[0]) == int(driver.CUresult.CUDA_ERROR_INVALID_VALUE):
            break
        offset, size = check("cuFuncGetParamInfo", result)
        out.append((int(offset), int(size)))
        index += 1
    return tuple(out)


def functions_named(module: Any, entry: str) -> list[Any]:
    """Every function of `module` whose name is `entry` (cuModuleEnumerateFunctions + cuFuncGetName);
    falls back to cuModuleGetFunction where enumeration is unavailable."""
    try:
        count = int(call("cuModuleGetFunctionCount", module))
        functions = call("cuModuleEnumerateFunctions", count, module)
    except (DriverError, AttributeError):
        try:
            return [call("cuModuleGetFunction", module, entry.encode())]
        except DriverError:
            return []
    out = []
    for fn in functions:
        name = call("cuFuncGetName", fn)
        name = name.decode() if isinstance(name, (bytes, bytearray)) else str(name)
        if name == entry:
            out.append(fn)
    return out


def load_module(image: bytes, label: str, ledger) -> Any:
    """cuModuleLoadData; the ledger unloads it on close."""
    try:
        module = call("cuModuleLoadData", image)
    except DriverError as exc:
        raise KernelArtifactError(f"module {label!r}: the driver refused the cubin: {exc}") from exc
    ledger.on_close(f"module {label}", lambda: call("cuModuleUnload", module))
    return module


def resolve_function(module: Any, entry: str, expected: Layout, where: str) -> Any:
    """The instance of `entry` in `module` whose layout is `expected` (KernelArtifactError otherwise)."""
    candidates = [(fn, param_layout(fn)) for fn in functions_named(module, entry)]
    return choose_instance(candidates, expected, f"{where}: entry {entry!r}")


def raise_shared_limit(function: Any, shared_mem_bytes: int) -> None:
    """Allow `shared_mem_bytes` of dynamic shared memory (needed above 48 KiB)."""
    driver = cu()
    call("cuFuncSetAttribute", function,
         driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(shared_mem_bytes))


def static_shared_bytes(function: Any) -> int:
    """The function's static shared memory (bytes, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)."""
    driver = cu()
    return int(call("cuFuncGetAttribute", driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function))


def set_shared_carveout(function: Any, percent: int) -> None:
    """Prefer a shared-memory carveout of `percent` (0..100) of the maximum shared memory for `function`
    (100: the most shared memory, the least L1). A hint to the driver, which configures each SM's L1 /
    shared memory split per kernel; kernels that overlap under PDL and prefer the same split never need an SM
    reconfigured between them."""
    driver = cu()
    call("cuFuncSetAttribute", function,
         driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, int(percent))


SHARED_DEFAULT_LIMIT_BYTES = 48 * 1024


def needs_shared_opt_in(dynamic_bytes: int, static_bytes: Callable[[], int]) -> bool:
    """Whether a launch of `dynamic_bytes` of dynamic shared memory needs CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_
    BYTES raised: when it passes SHARED_DEFAULT_LIMIT_BYTES (48 KiB) alone or together with the function's static
    shared memory (`static_bytes()`, asked only then): the default bounds both together (CUDA C++ programming
    guide, "Shared Memory"; a kernel of 9.5 KiB static and 40 KiB dynamic fails to launch without it)."""
    return dynamic_bytes > SHARED_DEFAULT_LIMIT_BYTES or (
        dynamic_bytes > 0 and dynamic_bytes + static_bytes() > SHARED_DEFAULT_LIMIT_BYTES)


def resolve_launches(manifest: Manifest, modules: Mapping[str, Any], max_values: Mapping[str, int],
                     min_values: Mapping[str, int]) -> tuple[dict[tuple[str, int], Any], dict[tuple[str, int], str]]:
    """Every kernel launch's function in its own loaded module (`resolve_function`, by parameter layout), and the
    per-function attributes set once: dynamic shared memory above 48 KiB, preferred carveout. Returns
    ((op, launch index) -> CUfunction, (op, launch index) -> module name). Raises KernelArtifactError (a module
    not pinned, an ABI mismatch), ManifestError (two carveouts for one function)."""
    from ..program.records import launch_path

    functions: dict[tuple[str, int], Any] = {}
    owners: dict[tuple[str, int], str] = {}
    # The dynamic shared memory limit and the preferred carveout are properties of the function, not of a
    # launch: one function launched by several ops gets the largest of their shared sizes and their one
    # carveout (function_attributes).
    uses: list[tuple[Any, str, int, int | None]] = []
    for op in manifest.ops.values():
        for li, launch in enumerate(op.launches):
            if not isinstance(launch, Launch):
                continue
            path = launch_path(op.name, li)
            if launch.module not in modules:
                raise KernelArtifactError(f"{path}: module {launch.module!r} is not pinned")
            fn = resolve_function(modules[launch.module], launch.entry, launch.params,
                                  f"{path} (module {launch.module!r})")
            shared = max(launch.shared_mem.eval(max_values), launch.shared_mem.eval(min_values))
            uses.append((fn, path, shared, launch.carveout))
            functions[(op.name, li)] = fn
            owners[(op.name, li)] = launch.module
    for attrs in function_attributes(uses):
        if attrs.shared_mem and needs_shared_opt_in(attrs.shared_mem, lambda fn=attrs.function: static_shared_bytes(fn)):
            raise_shared_limit(attrs.function, attrs.shared_mem)
        if attrs.carveout is not None:
            set_shared_carveout(attrs.function, attrs.carveout)
    return functions, owners
