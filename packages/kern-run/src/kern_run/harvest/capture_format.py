"""The capture directory (`kern-harvest-capture/1`): what `kern harvest capture` writes and the miner reads.

    <capture>/meta.json        {"format", "var": "tokens", "runs": [{"tokens": 1}, {"tokens": 2}], "source": {...}}
    <capture>/tensors.json     {"runs": [[tensor, ...], ...]}: the named tensors alive in each run
    <capture>/launches.jsonl   one event a line, in the order they happened within each run
    <capture>/cubins/<sha256>.cubin   every module a recorded launch ran, named by its sha256

A run is one step of the model at one token count. A tensor is `{"name", "kind", "address", "bytes",
"dtype", "shape"}` with kind `weight` (name: its checkpoint / state_dict key), `state` (kept across steps, e.g.
a KV cache; zero before the first step), `input` or `output`. An event is `{"run", "event", ...}`:

- `launch`: `function`, `module` (sha256 of the cubin it lives in, or null when the capture could not tell),
  `grid`, `block` (3 ints each), `shared_mem` (dynamic, bytes), `params` (`[[offset, size], ...]` from
  `cuFuncGetParamInfo`) and `bytes` (hex of the parameter buffer: parameter i at its offset, gaps zero);
- `alloc` (`address`, `bytes`) and `free` (`address`): device memory the step allocated and freed (with
  PYTORCH_NO_CUDA_MEMORY_CACHING every torch allocation is one `cuMemAlloc`);
- `api` (`name`): any other driver call the step made that moves or sets memory (a `cuMemcpy*` or `cuMemset*`),
  which a manifest cannot express; the miner reports it.

`read_capture` is strict: every object is closed (an unknown key is refused), every value has its type and
range, every file is a regular file read with a bound (kern_manifest.read_regular_file), and each cubin's
sha256 must equal its name. A fault raises CaptureFormatError naming the file, the line (launches.jsonl) or the
key. `write_capture` writes the directory whole (outdir.write_directory).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from kern_manifest import DTYPE_BYTES, json_text_fault, read_regular_file

from .errors import CaptureFormatError
from .outdir import write_directory

FORMAT = "kern-harvest-capture/1"
TENSOR_KINDS = ("weight", "state", "input", "output")
MAX_META_BYTES = 1 << 20
MAX_TENSORS_BYTES = 64 << 20
MAX_LAUNCHES_BYTES = 256 << 20
MAX_LINE_BYTES = 1 << 20
MAX_CUBIN_BYTES = 64 << 20
MAX_CUBINS = 65536
MAX_CUBINS_BYTES = 1 << 30  # all cubins together
MAX_RUNS = 16
MAX_EVENTS = 1_000_000
MAX_PARAM_BYTES = 32764  # the driver's kernel parameter limit (CUDA 12.1+)
MAX_NAME_CHARS = 4096
U64 = 1 << 64
_SHA = re.compile(r"[0-9a-f]{64}\Z")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*\Z")  # a kern manifest name (docs/manifest.md)
_SYMBOL = re.compile(r"[!-~]+\Z")  # a kernel symbol: printable ASCII without spaces
_API = re.compile(r"cu[A-Za-z0-9_]+\Z")

Layout = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Tensor:
    """A named tensor alive during a run: `address` .. `address + nbytes` on the device."""

    name: str
    kind: str  # weight | state | input | output
    address: int
    nbytes: int
    dtype: str  # a kern dtype (bf16, f32, i64, ...)
    shape: tuple[int, ...]

    @property
    def end(self) -> int:
        return self.address + self.nbytes


@dataclass(frozen=True)
class Launch:
    """One kernel launch. `data`: the parameter buffer (parameter i is `data[offset:offset + size]`)."""

    function: str
    module: str | None
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    params: Layout
    data: bytes

    def param(self, i: int) -> bytes:
        offset, size = self.params[i]
        return self.data[offset:offset + size]


@dataclass(frozen=True)
class Alloc:
    address: int
    nbytes: int


@dataclass(frozen=True)
class Free:
    address: int


@dataclass(frozen=True)
class Api:
    """A driver call a manifest cannot express (a memcpy or memset inside the step)."""

    name: str


Event = Union[Launch, Alloc, Free, Api]


@dataclass(frozen=True)
class Run:
    tokens: int
    events: tuple[Event, ...]
    tensors: tuple[Tensor, ...]

    @property
    def launches(self) -> list[Launch]:
        return [e for e in self.events if isinstance(e, Launch)]


@dataclass(frozen=True)
class Capture:
    """A capture directory in memory. `cubins`: sha256 -> cubin bytes; `source`: free-form facts (model, torch
    and triton versions, device) that the miner copies into the manifest's meta."""

    runs: tuple[Run, ...]
    cubins: dict[str, bytes]
    var: str = "tokens"
    source: dict[str, Any] = field(default_factory=dict)


def pack_params(params: Layout, values: list[bytes]) -> bytes:
    """The parameter buffer of `values` laid out at `params` (gaps zero). Asserts each value has its size."""
    end = max((o + s for o, s in params), default=0)
    buf = bytearray(end)
    for (offset, size), value in zip(params, values, strict=True):
        assert len(value) == size, (offset, size, value)
        buf[offset:offset + size] = value
    return bytes(buf)


# ---------------------------------------------------------------- writing


def _tensor_json(t: Tensor) -> dict[str, Any]:
    return {"name": t.name, "kind": t.kind, "address": t.address, "bytes": t.nbytes, "dtype": t.dtype,
            "shape": list(t.shape)}


def _event_json(run: int, e: Event) -> dict[str, Any]:
    if isinstance(e, Launch):
        return {"run": run, "event": "launch", "function": e.function, "module": e.module, "grid": list(e.grid),
                "block": list(e.block), "shared_mem": e.shared_mem, "params": [list(p) for p in e.params],
                "bytes": e.data.hex()}
    if isinstance(e, Alloc):
        return {"run": run, "event": "alloc", "address": e.address, "bytes": e.nbytes}
    if isinstance(e, Free):
        return {"run": run, "event": "free", "address": e.address}
    return {"run": run, "event": "api", "name": e.name}


def capture_files(capture: Capture) -> dict[str, bytes]:
    """The files of `capture`'s directory (relative path -> bytes), as `write_capture` writes them."""
    meta = {"format": FORMAT, "var": capture.var, "runs": [{"tokens": r.tokens} for r in capture.runs],
            "source": capture.source}
    tensors = {"runs": [[_tensor_json(t) for t in r.tensors] for r in capture.runs]}
    lines = [json.dumps(_event_json(i, e), separators=(",", ":")) for i, r in enumerate(capture.runs) for e in r.events]
    files = {"meta.json": (json.dumps(meta, indent=1, sort_keys=True) + "\n").encode(),
             "tensors.json": (json.dumps(tensors, indent=1) + "\n").encode(),
             "launches.jsonl": "".join(line + "\n" for line in lines).encode()}
    for sha, data in capture.cubins.items():
        files[f"cubins/{sha}.cubin"] = data
    return files


def write_capture(target: Path, capture: Capture) -> None:
    """Write `capture` as the directory `target` (which must not exist), whole or not at all. Raises OSError
    (FileExistsError for an existing target)."""
    write_directory(Path(target), capture_files(capture))


# ---------------------------------------------------------------- reading


class _Check:
    """Typed access to one JSON object of a capture file; every fault names `where` (file, line, key)."""

    def __init__(self, obj: Any, where: str, keys: tuple[str, ...]) -> None:
        if not isinstance(obj, dict):
            raise CaptureFormatError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        unknown = sorted(set(obj) - set(keys))
        if unknown:
            raise CaptureFormatError(f"{where}: unknown key {unknown[0]!r} (expected {', '.join(keys)})")
        missing = [k for k in keys if k not in obj]
        if missing:
            raise CaptureFormatError(f"{where}: missing key {missing[0]!r}")
        self.obj, self.where = obj, where

    def int(self, key: str, lo: int, hi: int) -> int:
        value = self.obj[key]
        if type(value) is not int or not lo <= value <= hi:
            raise CaptureFormatError(f"{self.where}.{key}: {_short(value)} is not an integer in [{lo}, {hi}]")
        return value

    def ints(self, key: str, count: int | None, lo: int, hi: int) -> tuple[int, ...]:
        value = self.obj[key]
        if not isinstance(value, list) or (count is not None and len(value) != count) or \
                any(type(v) is not int or not lo <= v <= hi for v in value):
            n = f"{count} " if count is not None else ""
            raise CaptureFormatError(f"{self.where}.{key}: {_short(value)} is not a list of {n}integers in [{lo}, {hi}]")
        return tuple(value)

    def str(self, key: str, pattern: re.Pattern[str], what: str) -> str:
        value = self.obj[key]
        if not isinstance(value, str) or len(value) > MAX_NAME_CHARS or not pattern.match(value):
            raise CaptureFormatError(f"{self.where}.{key}: {_short(value)} is not {what}")
        return value


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, (bytes, bytearray)) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {key!r}")
        obj[key] = value
    return obj


def _loads(text: bytes, where: str) -> Any:
    try:
        return json.loads(text.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as exc:
        reason = json_text_fault(exc) or f"not usable JSON ({exc})"
        raise CaptureFormatError(f"{where}: {reason}") from None


def _read(path: Path, limit: int) -> bytes:
    try:
        return read_regular_file(path, limit, "expected a regular file", "a capture file")
    except OSError as exc:
        raise CaptureFormatError(f"{path}: {exc.strerror or exc}") from None


def _tensor(obj: Any, where: str) -> Tensor:
    c = _Check(obj, where, ("name", "kind", "address", "bytes", "dtype", "shape"))
    kind = c.obj["kind"]
    if kind not in TENSOR_KINDS:
        raise CaptureFormatError(f"{where}.kind: {_short(kind)} is not one of {', '.join(TENSOR_KINDS)}")
    dtype = c.obj["dtype"]
    if dtype not in DTYPE_BYTES:
        raise CaptureFormatError(f"{where}.dtype: {_short(dtype)} is not a kern dtype ({', '.join(DTYPE_BYTES)})")
    address, nbytes = c.int("address", 1, U64 - 1), c.int("bytes", 0, (1 << 62))
    shape = c.ints("shape", None, 0, 1 << 62)
    if len(shape) > 8:
        raise CaptureFormatError(f"{where}.shape: {len(shape)} dims (at most 8)")
    if address + nbytes > U64:
        raise CaptureFormatError(f"{where}: {nbytes} bytes at 0x{address:x} run past the 64-bit address space")
    elements = 1
    for d in shape:
        elements *= d
    if elements * DTYPE_BYTES[dtype] != nbytes:
        raise CaptureFormatError(f"{where}: shape {list(shape)} of {dtype} is {elements * DTYPE_BYTES[dtype]} bytes, "
                                 f"not the {nbytes} recorded")
    return Tensor(c.str("name", _NAME, "a kern name ([A-Za-z_][A-Za-z0-9_.-]*)"), kind, address, nbytes, dtype, shape)


def _layout(c: _Check) -> Layout:
    raw = c.obj["params"]
    if not isinstance(raw, list) or len(raw) > MAX_PARAM_BYTES:
        raise CaptureFormatError(f"{c.where}.params: not a list of at most {MAX_PARAM_BYTES} [offset, size] pairs")
    params, end = [], 0
    for i, pair in enumerate(raw):
        if not isinstance(pair, list) or len(pair) != 2 or any(type(v) is not int for v in pair) or \
                pair[0] < end or pair[1] < 1 or pair[0] + pair[1] > MAX_PARAM_BYTES:
            raise CaptureFormatError(f"{c.where}.params[{i}]: {_short(pair)} is not an [offset, size] pair after the "
                                     f"previous parameter (ascending, disjoint, size >= 1, inside "
                                     f"{MAX_PARAM_BYTES} bytes)")
        params.append((pair[0], pair[1]))
        end = pair[0] + pair[1]
    return tuple(params)


def _event(obj: Any, where: str, runs: int) -> tuple[int, Event]:
    if not isinstance(obj, dict):
        raise CaptureFormatError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    kind = obj.get("event")
    keys = {"launch": ("run", "event", "function", "module", "grid", "block", "shared_mem", "params", "bytes"),
            "alloc": ("run", "event", "address", "bytes"), "free": ("run", "event", "address"),
            "api": ("run", "event", "name")}
    if kind not in keys:
        raise CaptureFormatError(f"{where}.event: {_short(kind)} is not one of {', '.join(keys)}")
    c = _Check(obj, where, keys[kind])
    run = c.int("run", 0, runs - 1)
    if kind == "alloc":
        return run, Alloc(c.int("address", 1, U64 - 1), c.int("bytes", 0, 1 << 62))
    if kind == "free":
        return run, Free(c.int("address", 1, U64 - 1))
    if kind == "api":
        return run, Api(c.str("name", _API, "a driver API name (cu...)"))
    module = obj["module"]
    if module is not None and (not isinstance(module, str) or not _SHA.match(module)):
        raise CaptureFormatError(f"{where}.module: {_short(module)} is not a sha256 (64 lowercase hex digits) or null")
    params = _layout(c)
    raw = obj["bytes"]
    end = max((o + s for o, s in params), default=0)
    if not isinstance(raw, str) or len(raw) != 2 * end or not re.fullmatch(r"[0-9a-f]*", raw):
        raise CaptureFormatError(f"{where}.bytes: not {end} bytes in lowercase hex (the parameter buffer's size)")
    grid, block = c.ints("grid", 3, 1, (1 << 31) - 1), c.ints("block", 3, 1, 1024)
    return run, Launch(c.str("function", _SYMBOL, "a kernel symbol (printable ASCII, no spaces)"), module,
                       grid, block, c.int("shared_mem", 0, (1 << 31) - 1), params, bytes.fromhex(raw))  # type: ignore[arg-type]


def _meta(directory: Path) -> tuple[str, list[int], dict[str, Any]]:
    where = str(directory / "meta.json")
    c = _Check(_loads(_read(directory / "meta.json", MAX_META_BYTES), where), where, ("format", "var", "runs", "source"))
    if c.obj["format"] != FORMAT:
        raise CaptureFormatError(f"{where}.format: {_short(c.obj['format'])}, expected {FORMAT!r}")
    var = c.str("var", re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z"), "a var name")
    runs = c.obj["runs"]
    if not isinstance(runs, list) or not 1 <= len(runs) <= MAX_RUNS:
        raise CaptureFormatError(f"{where}.runs: expected a list of 1..{MAX_RUNS} runs")
    tokens = [_Check(r, f"{where}.runs[{i}]", ("tokens",)).int("tokens", 1, 1 << 30) for i, r in enumerate(runs)]
    if len(set(tokens)) != len(tokens):
        raise CaptureFormatError(f"{where}.runs: token counts {tokens} repeat (each run needs its own)")
    if not isinstance(c.obj["source"], dict):
        raise CaptureFormatError(f"{where}.source: expected a JSON object")
    return var, tokens, c.obj["source"]


def _cubins(directory: Path) -> dict[str, bytes]:
    folder = directory / "cubins"
    if not folder.is_dir():
        raise CaptureFormatError(f"{folder}: missing (the cubins of the capture)")
    found = sorted(folder.iterdir())
    if len(found) > MAX_CUBINS:
        raise CaptureFormatError(f"{folder}: {len(found)} files, at most {MAX_CUBINS}")
    cubins, total = {}, 0
    for path in found:
        sha = path.name.removesuffix(".cubin")
        if not path.name.endswith(".cubin") or not _SHA.match(sha):
            raise CaptureFormatError(f"{path}: not named <sha256>.cubin")
        data = _read(path, MAX_CUBIN_BYTES)
        total += len(data)
        if total > MAX_CUBINS_BYTES:
            raise CaptureFormatError(f"{folder}: the cubins hold more than {MAX_CUBINS_BYTES >> 20} MiB together")
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha:
            raise CaptureFormatError(f"{path}: has sha256 {actual}, not the one its name gives")
        cubins[sha] = data
    return cubins


def read_capture(directory: str | Path) -> Capture:
    """The capture in `directory`. Raises CaptureFormatError naming the file and the line or key of the first
    fault: a missing or non-regular file, a file past its bound (meta.json 1 MiB, tensors.json 64 MiB,
    launches.jsonl 256 MiB and 1 MiB a line, a cubin 64 MiB, all cubins 1 GiB), text that is not UTF-8 JSON (or repeats a key), an
    unknown or missing key, a value of the wrong type or range, a tensor whose shape and dtype do not make its
    byte count, a parameter buffer that is not its layout's size, more than 1,000,000 events, or a cubin whose
    sha256 is not its name."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CaptureFormatError(f"{directory}: not a directory (a capture is a directory; docs/harvest.md)")
    var, tokens, source = _meta(directory)
    where = str(directory / "tensors.json")
    c = _Check(_loads(_read(directory / "tensors.json", MAX_TENSORS_BYTES), where), where, ("runs",))
    per_run = c.obj["runs"]
    if not isinstance(per_run, list) or len(per_run) != len(tokens):
        raise CaptureFormatError(f"{where}.runs: expected {len(tokens)} lists of tensors (one per run of meta.json)")
    tensors = []
    for r, listed in enumerate(per_run):
        if not isinstance(listed, list) or len(listed) > MAX_EVENTS:
            raise CaptureFormatError(f"{where}.runs[{r}]: expected a list of at most {MAX_EVENTS} tensors")
        tensors.append(tuple(_tensor(t, f"{where}.runs[{r}][{i}]") for i, t in enumerate(listed)))
    events: list[list[Event]] = [[] for _ in tokens]
    path = directory / "launches.jsonl"
    lines = _read(path, MAX_LAUNCHES_BYTES).split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if len(lines) > MAX_EVENTS:
        raise CaptureFormatError(f"{path}: {len(lines)} events, at most {MAX_EVENTS}")
    for number, line in enumerate(lines, 1):
        where = f"{path}:{number}"
        if len(line) > MAX_LINE_BYTES:
            raise CaptureFormatError(f"{where}: a line of {len(line)} bytes (at most {MAX_LINE_BYTES})")
        run, event = _event(_loads(line, where), where, len(tokens))
        events[run].append(event)
    runs = tuple(Run(t, tuple(e), ts) for t, e, ts in zip(tokens, events, tensors))
    return Capture(runs=runs, cubins=_cubins(directory), var=var, source=source)
