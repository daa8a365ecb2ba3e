"""`SafetensorsTensors`: a Hugging Face checkpoint read by headers up front, bytes on demand.

Two constructors, one kind of object (the loader binds from either):

- `SafetensorsTensors.open(path)` takes files:
  - a directory with `model.safetensors.index.json` (its `weight_map` names the shards),
  - a directory of `*.safetensors` files (no index),
  - one `.safetensors` file, or a list of files.
  Only the headers are read at open (8-byte little-endian header length + JSON). Tensor bytes are
  `FileBlob`s the loader reads with `os.pread`.
- `SafetensorsTensors.parse(data)` takes bytes already in this process's memory: one bytes-like object
  (`bytes`, `bytearray`, `memoryview`, `mmap`, a C-contiguous numpy array, anything with the buffer
  protocol) holding a whole safetensors file, or a list / tuple of them (the shards). Nothing is copied
  but the headers: tensor bytes are `HostBlob`s, read-only uint8 views of the caller's buffers. The object
  keeps a reference to each buffer, so they stay alive (and a `bytearray` cannot be resized) while it or
  any of its blobs lives; the caller must not write into a mutable buffer before the load that reads it
  has returned. Shards are named `bytes #i` (their position in the list) in messages.

The header checks are the same for both: a tensor name present in two shards is a `WeightArtifactError`
naming both shards; so is a header length past the end or past `MAX_HEADER_BYTES`, a header that is not
UTF-8 JSON or has a key twice, an unknown dtype, a byte range that disagrees with dtype x shape or lies past
the end of the data, or two tensors overlapping byte ranges. An argument to `parse` that is not bytes-like
(a `str` path, an int, ...) or not contiguous is an `ApiError`.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from pathlib import Path, PurePosixPath
from typing import Iterable, Sequence

import numpy as np
from kern_manifest import json_text_fault, read_regular_file

from ..cuda.dtypes import SAFETENSORS_DTYPE, item_bytes
from ..errors import ApiError, WeightArtifactError, with_article
from .tensors import Blob, FileBlob, HostBlob, TensorMeta

INDEX_NAME = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024
MAX_INDEX_BYTES = 64 * 2**20  # model.safetensors.index.json (a few hundred KiB for the largest checkpoints)


class _DuplicateKey(Exception):
    pass


def _unique_object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _loads(data: str | bytes, what: str) -> object:
    """json.loads of `data` (bytes must be UTF-8: the safetensors format's header encoding, and json.loads
    would otherwise also take UTF-16 / UTF-32); every way it can fail (invalid JSON or UTF-8, a key twice in
    one object, nesting past Python's recursion limit, an integer literal past its digit limit) is a
    WeightArtifactError starting with `what` (`what is <kern_manifest.json_text_fault's reason>`)."""
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
        return json.loads(text, object_pairs_hook=_unique_object)
    except _DuplicateKey as exc:
        raise WeightArtifactError(f"{what} has the key {exc.args[0]!r} twice in one object") from None
    except (ValueError, RecursionError) as exc:  # invalid JSON or UTF-8, too deep, past the digit limit
        reason = json_text_fault(exc)
        if reason is None:
            raise
        raise WeightArtifactError(f"{what} is {reason}") from None


def read_safetensors_header(path: str | os.PathLike[str]) -> dict[str, tuple[TensorMeta, int, int]]:
    """Parse one file's header: name -> (meta, absolute byte offset, nbytes).

    Raises WeightArtifactError for a truncated/invalid header (not UTF-8 JSON, a key twice), an unknown
    dtype, a byte range that disagrees with dtype x shape or lies past the end of the file, or two
    tensors whose byte ranges overlap.
    """
    path = os.fspath(path)
    try:
        # O_NONBLOCK: a FIFO named *.safetensors opens at once (and is refused below) instead of waiting forever
        with open(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            if not stat.S_ISREG(mode):
                kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device"
                raise WeightArtifactError(f"{path}: not a regular file ({kind}); a safetensors shard is a file")
            head = fh.read(8)
            if len(head) != 8:
                raise WeightArtifactError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (header_bytes,) = struct.unpack("<Q", head)
            if header_bytes > MAX_HEADER_BYTES:
                raise WeightArtifactError(f"{path}: header length {header_bytes} exceeds {MAX_HEADER_BYTES} bytes")
            raw = fh.read(header_bytes)
            file_bytes = os.fstat(fh.fileno()).st_size
    except OSError as exc:
        raise WeightArtifactError(f"{path}: cannot read: {exc}") from exc
    if len(raw) != header_bytes:
        raise WeightArtifactError(f"{path}: header truncated ({len(raw)} of {header_bytes} bytes)")
    return _header_entries(raw, file_bytes, path, "file")


def parse_safetensors_header(data: object, where: str = "bytes") -> dict[str, tuple[TensorMeta, int, int]]:
    """`read_safetensors_header` of a whole safetensors file held in memory (`data`, a bytes-like object;
    only the header is copied): name -> (meta, byte offset into `data`, nbytes). The same checks, the same
    WeightArtifactErrors, each message starting with `where` (e.g. "bytes #1") instead of a file name;
    ApiError when `data` is not a contiguous bytes-like object."""
    view = _byte_view(data, where)
    size = len(view)
    if size < 8:
        raise WeightArtifactError(f"{where}: not safetensors data (shorter than 8 bytes)")
    (header_bytes,) = struct.unpack("<Q", view[:8])
    if header_bytes > MAX_HEADER_BYTES:
        raise WeightArtifactError(f"{where}: header length {header_bytes} exceeds {MAX_HEADER_BYTES} bytes")
    raw = bytes(view[8 : 8 + header_bytes])
    if len(raw) != header_bytes:
        raise WeightArtifactError(f"{where}: header truncated ({len(raw)} of {header_bytes} bytes)")
    return _header_entries(raw, size, where, "buffer")


def _header_entries(raw: bytes, total_bytes: int, where: str, container: str) -> dict[str, tuple[TensorMeta, int, int]]:
    """The checks of a header (`raw`, the JSON bytes after the 8-byte length) of a safetensors `container`
    ("file" or "buffer") of `total_bytes` bytes; messages start with `where`."""
    header = _loads(raw, f"{where}: header")
    if not isinstance(header, dict):
        raise WeightArtifactError(f"{where}: header is JSON {type(header).__name__}, not an object")
    data_start = 8 + len(raw)
    out: dict[str, tuple[TensorMeta, int, int]] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            st_dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            if not all(type(v) is int and v >= 0 for v in (*shape, begin, end)) or begin > end:
                raise ValueError(name)
        except (KeyError, TypeError, ValueError):
            raise WeightArtifactError(f"{where}: tensor {name!r} has a malformed header entry {entry!r}") from None
        dtype = SAFETENSORS_DTYPE.get(st_dtype) if isinstance(st_dtype, str) else None
        if dtype is None:
            raise WeightArtifactError(f"{where}: tensor {name!r} has unsupported dtype {st_dtype!r}")
        meta = TensorMeta(dtype, tuple(int(d) for d in shape))
        nbytes = int(end) - int(begin)
        if nbytes != math.prod(meta.shape) * item_bytes(dtype):
            raise WeightArtifactError(
                f"{where}: tensor {name!r} {st_dtype}{list(meta.shape)} spans {nbytes} bytes, expected {meta.nbytes}"
            )
        if data_start + int(end) > total_bytes:
            raise WeightArtifactError(f"{where}: tensor {name!r} ends at byte {data_start + int(end)}, "
                                      f"past the {container} end {total_bytes}")
        out[name] = (meta, data_start + int(begin), nbytes)
    # no two tensors share bytes (as the safetensors format requires; empty tensors take none)
    spans = sorted((offset, offset + nbytes, name) for name, (_, offset, nbytes) in out.items() if nbytes)
    for (_, end_a, name_a), (begin_b, _, name_b) in zip(spans, spans[1:]):
        if begin_b < end_a:
            raise WeightArtifactError(f"{where}: tensors {name_a!r} and {name_b!r} overlap in the {container} (bytes "
                                      f"{begin_b - data_start}..{end_a - data_start} of the data section)")
    return out


def _byte_view(data: object, where: str) -> np.ndarray:
    """A read-only 1-D uint8 numpy view of the bytes-like `data` (no copy; the view references `data`).
    ApiError for anything that is not a contiguous buffer."""
    if isinstance(data, (str, os.PathLike)):
        raise ApiError(f"{where} is {with_article(type(data).__name__)}, not bytes: SafetensorsTensors.parse takes the "
                       "bytes of a safetensors file (SafetensorsTensors.open takes a path)")
    try:
        view = memoryview(data)  # type: ignore[arg-type]
    except TypeError:
        raise ApiError(f"{where} is {with_article(type(data).__name__)}, not a bytes-like object (bytes, bytearray, memoryview, "
                       "a contiguous numpy array)") from None
    if not view.c_contiguous:
        raise ApiError(f"{where} is a non-contiguous {type(data).__name__}; pass contiguous bytes "
                       "(e.g. numpy.ascontiguousarray)")
    if isinstance(data, np.ndarray) and data.dtype.hasobject:
        raise ApiError(f"{where}: a numpy array of {data.dtype} holds Python object pointers, not file bytes")
    try:
        array = np.frombuffer(view, dtype=np.uint8)  # the raw bytes whatever the buffer's format and shape
    except (ValueError, TypeError, BufferError) as exc:
        raise ApiError(f"{where}: a {type(data).__name__} numpy cannot view as bytes: {exc}") from None
    array.flags.writeable = False  # the loader only reads; a blob must not write into the caller's buffer
    return array


def index_shards(index: Path) -> list[str]:
    """Shard file names (sorted, distinct) of a `model.safetensors.index.json`: a JSON object whose
    `weight_map` maps tensor names to file names inside the checkpoint directory. Raises WeightArtifactError
    naming the index (and the entry) for an unreadable file, no `weight_map` object, or a shard path that
    is absolute or leaves the directory."""
    try:
        text = read_regular_file(index, MAX_INDEX_BYTES, "an index is a JSON file", "an index").decode("utf-8")
    except OSError as exc:
        raise WeightArtifactError(f"{index}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise WeightArtifactError(f"{index} is {json_text_fault(exc)}") from None
    raw = _loads(text, str(index))
    if not isinstance(raw, dict) or "weight_map" not in raw:
        raise WeightArtifactError(f"{index}: expected an object with a \"weight_map\" object (tensor name -> shard file)")
    weight_map = raw["weight_map"]
    if not isinstance(weight_map, dict):
        raise WeightArtifactError(f"{index}: weight_map is a JSON {type(weight_map).__name__}, not an object of "
                                  "tensor name -> shard file")
    for name, shard in weight_map.items():
        parts = PurePosixPath(shard).parts if isinstance(shard, str) else ()
        if not parts or PurePosixPath(shard).is_absolute() or ".." in parts:
            raise WeightArtifactError(f"{index}: weight_map[{name!r}] = {shard!r} is not a file name inside the "
                                      "checkpoint directory")
    # "./a.safetensors" and "a.safetensors" name one file: normalised, it is one shard (read once)
    return sorted({str(PurePosixPath(shard)) for shard in weight_map.values()})


class SafetensorsTensors:
    """Tensors of a safetensors checkpoint. Construct with `SafetensorsTensors.open(path)` (files) or
    `SafetensorsTensors.parse(data)` (bytes in memory). `files` lists the opened files (empty for parsed
    bytes); `buffers` the parsed buffers as read-only uint8 views (empty for files)."""

    def __init__(self, files: Sequence[str | os.PathLike[str]]) -> None:
        # normalised ("dir/./a" is "dir/a") and each file once: one file under two spellings is not two shards
        self.files: tuple[str, ...] = tuple(dict.fromkeys(os.path.normpath(os.fspath(f)) for f in files))
        self.buffers: tuple[np.ndarray, ...] = ()
        if not self.files:
            raise WeightArtifactError("no safetensors files given")
        # name -> (meta, shard: file path or "bytes #i", byte offset in the shard, nbytes, shard bytes or None)
        self._entries: dict[str, tuple[TensorMeta, str, int, int, np.ndarray | None]] = {}
        for path in self.files:
            self._add_shard(path, read_safetensors_header(path), None)

    def _add_shard(self, where: str, header: dict[str, tuple[TensorMeta, int, int]], data: np.ndarray | None) -> None:
        for name, (meta, offset, nbytes) in header.items():
            seen = self._entries.get(name)
            if seen is not None:
                raise WeightArtifactError(f"tensor {name!r} is present in two shards: {seen[1]} and {where}")
            self._entries[name] = (meta, where, offset, nbytes, data)

    @classmethod
    def parse(cls, data: object) -> "SafetensorsTensors":
        """Tensors of safetensors files held in memory: `data` is one bytes-like object (bytes, bytearray,
        memoryview, mmap, a C-contiguous numpy array) holding a whole file, or a list / tuple of them (the
        shards; shard i is "bytes #i" in messages). Same header checks and errors as `open`; a tensor in two
        shards is refused.

        Zero copy: blobs are `HostBlob`s viewing the caller's bytes (read-only). The returned object keeps a
        reference to every buffer, so they need not be kept alive separately, but a mutable buffer must not be
        written while a load reads it.

        Raises ApiError when `data` (or a list item) is not a contiguous bytes-like object (a str path, an
        int, ...), WeightArtifactError for an empty list or a malformed shard.
        """
        items = list(data) if isinstance(data, (list, tuple)) else [data]
        if not items:
            raise WeightArtifactError("no safetensors bytes given")
        views = [_byte_view(item, f"bytes #{i}") for i, item in enumerate(items)]
        self = cls.__new__(cls)
        self.files = ()
        self.buffers = tuple(views)
        self._entries = {}
        for i, view in enumerate(views):
            where = f"bytes #{i}"
            self._add_shard(where, parse_safetensors_header(view, where), view)
        return self

    @classmethod
    def open(cls, path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> "SafetensorsTensors":
        """Open a checkpoint directory (with or without index json), one file, or a list of files.

        Raises WeightArtifactError when nothing is found, a shard named by the index is missing, or a file is
        not a regular file (a FIFO named `*.safetensors` is refused, never waited on); ApiError when `path` (or
        a list item) is not a str or os.PathLike.
        """
        items = list(path) if isinstance(path, (list, tuple)) else [path]
        for i, item in enumerate(items):
            if not isinstance(item, (str, os.PathLike)):
                where = "path" if not isinstance(path, (list, tuple)) else f"path #{i}"
                raise ApiError(f"SafetensorsTensors.open: {where} is {repr(item)[:60]} ({type(item).__name__}), not a "
                               "str or os.PathLike (a checkpoint directory or .safetensors file; bytes go to parse)")
        if isinstance(path, (list, tuple)):
            return cls(items)
        root = Path(path)
        if root.is_file() or (root.exists() and not root.is_dir()):  # a FIFO or device: refused by its header read
            return cls([root])
        if not root.is_dir():
            raise WeightArtifactError(f"{root}: no such checkpoint file or directory")
        index = root / INDEX_NAME
        if index.is_file():
            shards = index_shards(index)
            missing = [s for s in shards if not (root / s).is_file()]
            if missing:
                raise WeightArtifactError(f"{index}: shards named by the index are missing: {missing}")
            return cls([root / s for s in shards])
        files = sorted(root.glob("*.safetensors"))
        if not files:
            raise WeightArtifactError(f"{root}: no {INDEX_NAME} and no *.safetensors files")
        return cls(files)

    def names(self) -> Iterable[str]:
        return list(self._entries)

    def meta(self, name: str) -> TensorMeta | None:
        entry = self._entries.get(name)
        return entry[0] if entry else None

    def blob(self, name: str) -> Blob:
        entry = self._entries.get(name)
        if entry is None:
            raise WeightArtifactError(f"checkpoint has no tensor {name!r}")
        _, where, offset, nbytes, data = entry
        if data is not None:
            return HostBlob(data[offset : offset + nbytes])
        return FileBlob(where, offset, nbytes)

    @property
    def total_bytes(self) -> int:
        return sum(e[3] for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)
