"""kern-runtime's error types: one base class, variants named by who must act.

| class                  | who acts          | raised for                                                      |
|------------------------|-------------------|-----------------------------------------------------------------|
| `ManifestParseError`   | manifest provider | the manifest is not valid JSON / not the kern-manifest/1 shape   |
| `ManifestVerifyError`  | manifest provider | the verifier rejected it (the message carries the JSON path)     |
| `ManifestError`        | manifest provider | a manifest fact only the runtime can check (fix the generator)   |
| `KernelArtifactError`  | kernel builder    | missing/mismatched cubin, ABI mismatch, inapplicable algo pin    |
| `CoResidencyError`     | kernel builder    | a cooperative launch's grid does not fit the device at once      |
| `WeightArtifactError`  | checkpoint owner  | the checkpoint does not match the manifest's binds               |
| `ApiError`             | caller            | unknown program/buffer, wrong kind, var out of range, bad input  |
| `CallError`            | depends on cause  | a failure at a position in a call table; wraps the cause         |
| `CudaError`            | operator          | execution failure not tied to one driver call                    |
| `DriverError`          | operator          | a CUDA driver call failed (carries call and result name)         |
| `BlasError`            | operator          | a cuBLASLt call failed (carries call and status name)            |
| `PinSearchError`       | operator          | no cuBLASLt algorithm passes a pin search (gemm_pins)            |
| `DeviceFaultError`     | manifest provider | a kernel wrote a nonzero code into an error word (a step failed) |

kern-manifest is stdlib-only and sits below kern-runtime, so its exceptions cannot inherit from
`KernError`. The runtime therefore re-raises manifest failures as its own `ManifestParseError` /
`ManifestVerifyError`, which subclass *both* `KernError` and the matching kern_manifest class:
`except KernError` and `except kern_manifest.ManifestVerifyError` both catch what `Runtime.load`
raises. The pool API raises kern_pool's own errors (`Misuse`, `Closed`, `Busy`, `ExceedsPool`,
`Remapping`, `NotLanded`: subclasses of `kern_pool.PoolError`, not of `KernError`). Code that calls kern_manifest
directly (the CLI's `inspect`) or uses the pool API can catch everything the kern packages raise with
`except KERN_ERRORS`.
"""

from __future__ import annotations

import operator


class KernError(Exception):
    """Base of every error kern-runtime raises on purpose."""


def _manifest_base(name: str) -> type[BaseException]:
    """The kern_manifest exception class `name`, or `Exception` if kern_manifest lacks it.

    Resolved at import time of this module only (no mutable state); kern_manifest is pure Python.
    """
    try:
        import kern_manifest
    except ImportError:  # pragma: no cover - kern_manifest is a hard dependency
        return Exception
    base = getattr(kern_manifest, name, None)
    if isinstance(base, type) and issubclass(base, BaseException):
        return base
    errors_mod = getattr(kern_manifest, "errors", None)
    base = getattr(errors_mod, name, None) if errors_mod is not None else None
    if isinstance(base, type) and issubclass(base, BaseException):
        return base
    return Exception


_ManifestParseBase = _manifest_base("ManifestParseError")
_ManifestVerifyBase = _manifest_base("ManifestVerifyError")


def _mro_bases(*bases: type) -> tuple[type, ...]:
    """`bases` without duplicates and without plain `Exception` when a more specific base is present."""
    out: list[type] = []
    for base in bases:
        if base is Exception and len(bases) > 1:
            continue
        if base not in out:
            out.append(base)
    return tuple(out)


class ManifestParseError(*_mro_bases(KernError, _ManifestParseBase)):  # type: ignore[misc]
    """The manifest could not be parsed (JSON or shape). Subclasses kern_manifest's parse error."""


class ManifestVerifyError(*_mro_bases(KernError, _ManifestVerifyBase)):  # type: ignore[misc]
    """The manifest verifier rejected the manifest; the message names the JSON path."""


class ManifestError(KernError):
    """A manifest fact only the runtime can check is wrong (e.g. an unknown extern name)."""


class KernelArtifactError(KernError):
    """A pinned cubin is missing or does not match, a kernel's ABI does not match the manifest, or a
    pinned cuBLASLt algorithm does not apply."""


class CoResidencyError(KernelArtifactError):
    """A cooperative launch (`"cooperative": true`) asks for more blocks than the device can hold resident at once.

    Attributes: `path` (the launch's JSON path), `blocks` (the grid's block count), `capacity` (blocks per SM from
    cuOccupancyMaxActiveBlocksPerMultiprocessor x the SM count)."""

    def __init__(self, path: str, blocks: int, capacity: int, detail: str = "") -> None:
        self.path, self.blocks, self.capacity, self.detail = path, blocks, capacity, detail
        super().__init__(f"{path}: a cooperative launch of {blocks} blocks, but this device holds {capacity} at once"
                         f"{' (' + detail + ')' if detail else ''}; its blocks wait on each other, so all must be "
                         "resident: build the manifest for this device's SM count or use less shared memory")

    def __reduce__(self):
        return (type(self), (self.path, self.blocks, self.capacity, self.detail))


class WeightArtifactError(KernError):
    """The checkpoint does not match the manifest (missing tensor, dtype/shape mismatch, duplicate)."""


class ApiError(KernError):
    """The caller misused the API: unknown program/buffer, wrong kind, var out of range, bad array."""


class CallError(KernError):
    """A failure at a position in a program's call table.

    Attributes: `program` (name), `call_index` (0-based position in the flattened call table),
    `op` (op name), `cause` (the underlying exception, also chained as `__cause__`).
    """

    def __init__(self, program: str, call_index: int, op: str, cause: BaseException) -> None:
        self.program = program
        self.call_index = call_index
        self.op = op
        self.cause = cause
        super().__init__(f"program {program!r} call #{call_index} (op {op!r}): {type(cause).__name__}: {cause}")

    def __reduce__(self):  # pickling keeps the structured fields
        return (type(self), (self.program, self.call_index, self.op, self.cause))


class CudaError(KernError):
    """A CUDA execution failure not tied to a single driver call (e.g. no device)."""


class DriverError(CudaError):
    """A CUDA driver call failed. Attributes: `call` (e.g. "cuMemAlloc"), `result` (e.g.
    "CUDA_ERROR_OUT_OF_MEMORY"), `code` (int), `explanation` (the driver's error string)."""

    def __init__(self, call: str, result: str, code: int, explanation: str = "") -> None:
        self.call = call
        self.result = result
        self.code = code
        self.explanation = explanation
        tail = f": {explanation}" if explanation else ""
        super().__init__(f"{call} failed with {result} ({code}){tail}")

    def __reduce__(self):
        return (type(self), (self.call, self.result, self.code, self.explanation))


class BlasError(CudaError):
    """A cuBLASLt call failed. Attributes: `call`, `result` (status name), `code` (int)."""

    def __init__(self, call: str, result: str, code: int) -> None:
        self.call = call
        self.result = result
        self.code = code
        super().__init__(f"{call} failed with {result} ({code})")

    def __reduce__(self):
        return (type(self), (self.call, self.result, self.code))


class PinSearchError(KernError):
    """No cuBLASLt configuration passes a pin search for a GEMM shape on this GPU (none batch-invariant for a
    prefill pin, none applicable at M = 1 for a decode pin); the message names the shape and the counts."""


class DeviceFaultError(KernError):
    """A kernel reported a fault through an error word (a buffer with `error`, docs/manifest.md): a bounded wait
    that timed out, an instruction it could not execute. The work enqueued with it is suspect; the word has been
    cleared, so the runtime can run again.

    Attributes: `buffer` (the error word's name), `code` (word 0, nonzero), `meaning` (the manifest's description
    of the code, or None), `programs` (the programs that pass the buffer, one of which ran the kernel), `detail`
    (words 1.., as written by the kernel)."""

    def __init__(self, buffer: str, code: int, meaning: str | None, programs: tuple[str, ...],
                 detail: tuple[int, ...]) -> None:
        self.buffer, self.code, self.meaning, self.programs, self.detail = buffer, code, meaning, programs, detail
        what = f" ({meaning})" if meaning else " (the manifest gives no meaning for it)"
        where = ("program " + repr(programs[0])) if len(programs) == 1 else f"one of programs {list(programs)}"
        super().__init__(f"{where} failed on the device: error word {buffer!r} holds code {code}{what}; "
                         f"detail {list(detail)}")

    def __reduce__(self):
        return (type(self), (self.buffer, self.code, self.meaning, self.programs, self.detail))


def with_article(noun: str) -> str:
    """`noun` after its indefinite article, for messages: "an input", "an int", "a str"."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def as_integer(value: object) -> int | None:
    """`value` as an `int` when it is an integer (anything `operator.index` accepts: int, numpy integers;
    never a bool), else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def int_arg(value: object, what: str, minimum: int | None = None) -> int:
    """`value` as an `int` when it is an integer (`as_integer`) of at least `minimum`; else ApiError naming
    `what`."""
    number = as_integer(value)
    if number is None:
        raise ApiError(f"{what} must be an integer, got {value!r} ({type(value).__name__})")
    if minimum is not None and number < minimum:
        raise ApiError(f"{what} must be >= {minimum}, got {number}")
    return number


def _pool_error_base() -> type[BaseException]:
    """kern_pool's `PoolError` (base of Misuse, Closed, Busy, ExceedsPool, Remapping, NotLanded), or
    `Exception` if kern_pool lacks it. kern_pool is pure Python and a hard dependency of the runtime."""
    try:
        from kern_pool.errors import PoolError
    except ImportError:  # pragma: no cover - kern_pool is a hard dependency
        return Exception
    return PoolError


def _kern_error_bases() -> tuple[type[BaseException], ...]:
    bases: list[type[BaseException]] = [KernError]
    for base in (_ManifestParseBase, _ManifestVerifyBase, _manifest_base("ManifestError"), _pool_error_base()):
        if base is not Exception and base not in bases:
            bases.append(base)
    return tuple(bases)


KERN_ERRORS: tuple[type[BaseException], ...] = _kern_error_bases()
"""Every error class the kern packages raise on purpose (kern-runtime's `KernError`, kern_manifest's
errors, kern_pool's `PoolError`): `except KERN_ERRORS:`."""

__all__ = [
    "KERN_ERRORS",
    "ApiError",
    "BlasError",
    "CallError",
    "CoResidencyError",
    "CudaError",
    "DeviceFaultError",
    "DriverError",
    "KernError",
    "KernelArtifactError",
    "ManifestError",
    "ManifestParseError",
    "ManifestVerifyError",
    "PinSearchError",
    "WeightArtifactError",
]
