"""Trace replay: Mooncake-format requests through Pool + Prefix (+ Host) at a given capacity.

Each request is served in file order, one at a time, with no timing (as in the FAST'25 paper's Figure 9 and the
helper baseline in ../shared/traces/README.md, beside the kern checkout): look the prompt up, lease from the hit (or
wake it from the host), evict coldest entries while the pool says `Busy`, then retire the lease at the prompt length
and insert the checkpoint. Tokens are synthesized from `hash_ids` so that prefix sharing is exact: block i of a
request is `(hash_ids[i], 0, 0, ...)` (512 tokens, the last block truncated to `input_length`); two requests share a
token prefix exactly as far as their leading hash ids agree.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import Busy, ExceedsPool, Remapping
from .files import open_regular
from .host import Host
from .pool import Pool
from .prefix import Prefix, Resident
from .sizing import Capacity, Layout, PooledState

TRACE_BLOCK_TOKENS = 512  # tokens per hash id in the Mooncake traces
QWEN3_4B_BYTES_PER_TOKEN = 36 * 8 * 128 * 2 * 2  # layers * kv heads * head_dim * (K, V) * bf16 = 144 KiB

SWEEP_TOKENS = (1e4, 1e5, 1e6, 2e6, 3e6, 5e6, 1e7, 2e7, 5e7, math.inf)
MAX_PAGES = 1 << 22  # device or host pages of one replay: the pool keeps a refcount (8 B) of every page id
# Bounds of a trace file: its size, one line, one request's prompt (synth_tokens makes a tuple of that many ints;
# the Mooncake traces' longest prompt is about 128 K tokens).
MAX_TRACE_BYTES = 4 * 2**30
MAX_TRACE_LINE_BYTES = 2**20
MAX_REQUEST_TOKENS = 2**22  # 32 MiB of token ids


@dataclass(frozen=True, slots=True)
class Request:
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One replay. `capacity_tokens`: device pool tokens (math.inf: everything fits); `host_tokens`:
    host tier tokens (0: none); `page_tokens`: pool page size; `limit`: first N requests only;
    `reserve_output`: lease room for the output tokens too (the checkpoint still keeps the prompt)."""

    capacity_tokens: float
    host_tokens: int = 0
    page_tokens: int = TRACE_BLOCK_TOKENS
    limit: int | None = None
    reserve_output: bool = False
    bytes_per_token: int = QWEN3_4B_BYTES_PER_TOKEN


@dataclass(frozen=True, slots=True)
class SimResult:
    """Counts of one replay; rates are derived properties."""

    trace: str
    capacity_tokens: float
    pool_pages: int
    host_pages: int
    page_tokens: int
    requests: int
    input_tokens: int
    hit_tokens: int
    host_hit_tokens: int
    hit_requests: int
    evictions: int
    parks: int
    wakes: int
    parked_drops: int
    peak_pages: int
    refused_exceeds: int
    refused_busy: int
    dropped_hits: int

    @property
    def hit_rate(self) -> float:
        """Hit tokens / input tokens (the paper's and the helper's measure)."""
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0

    @property
    def request_hit_rate(self) -> float:
        return self.hit_requests / self.requests if self.requests else 0.0

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = asdict(self)
        if math.isinf(self.capacity_tokens):
            out["capacity_tokens"] = "inf"
        out["hit_rate"] = round(self.hit_rate, 6)
        out["request_hit_rate"] = round(self.request_hit_rate, 6)
        return out


class TraceError(ValueError):
    """A trace line that is not a Mooncake request; the message names the file, line and field."""


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # JSON true/false are not counts or hash ids


def _request(d: object, where: str, block_tokens: int) -> Request:
    if not isinstance(d, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(d).__name__}")
    try:
        input_length, output_length, hash_ids = d["input_length"], d.get("output_length", 0), d["hash_ids"]
    except KeyError as e:
        raise TraceError(f"{where}: missing field {e.args[0]!r}") from None
    if not (_int(input_length) and input_length > 0):
        raise TraceError(f"{where}: input_length must be a positive integer, got {input_length!r}")
    if not (_int(output_length) and output_length >= 0):
        raise TraceError(f"{where}: output_length must be an integer >= 0, got {output_length!r}")
    if not (isinstance(hash_ids, list) and all(_int(h) and h >= 0 for h in hash_ids)):
        raise TraceError(f"{where}: hash_ids must be a list of integers >= 0")
    if input_length > MAX_REQUEST_TOKENS:
        raise TraceError(f"{where}: input_length {input_length} is past the {MAX_REQUEST_TOKENS} tokens a replayed "
                         "request may have (its tokens are synthesized, 8 bytes each)")
    if len(hash_ids) != -(-input_length // block_tokens):
        raise TraceError(f"{where}: {len(hash_ids)} hash_ids for input_length {input_length}; a trace has one per "
                         f"{block_tokens}-token block ({-(-input_length // block_tokens)})")
    # The replay keeps file order and ignores the arrival time, but a record without a sane one is not a Mooncake
    # request (every record of the shipped traces has an integer timestamp >= 0, in milliseconds).
    if "timestamp" not in d:
        raise TraceError(f"{where}: missing field 'timestamp' (the arrival time in ms, a number >= 0)")
    timestamp = d["timestamp"]
    if not (isinstance(timestamp, (int, float)) and not isinstance(timestamp, bool)
            and math.isfinite(timestamp) and timestamp >= 0):
        raise TraceError(f"{where}: timestamp must be a finite number >= 0 (ms), got {timestamp!r}")
    return Request(input_length, output_length, tuple(hash_ids))


class _DuplicateKey(ValueError):
    pass


def _object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object of a trace line; a key given twice is refused (json's default keeps the last one silently, so
    `{"input_length": 600, ..., "input_length": 5}` replayed 5 tokens)."""
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def read_trace(path: Path, limit: int | None = None) -> list[Request]:
    """Requests of a Mooncake JSONL trace, in file order (first `limit` lines when given).

    Raises TraceError (file:line and the field) for a line that is not UTF-8, not JSON (a key twice in one object
    included) or not a request (`input_length`, `hash_ids` and `timestamp`, a finite number >= 0, are required;
    `output_length` defaults to 0), or a trace with no requests, and OSError naming the file when it cannot be
    read (missing, not a regular file, over `MAX_TRACE_BYTES`)."""
    out: list[Request] = []
    offset = 0
    with open_regular(path, MAX_TRACE_BYTES, "a trace is a JSONL file") as f:
        # lines read with a bound: a file without newlines (a sparse or binary one) is refused at its first MiB
        for number, raw in enumerate(iter(lambda: f.readline(MAX_TRACE_LINE_BYTES + 1), b""), 1):
            if limit is not None and len(out) >= limit:
                break
            where = f"{path}:{number}"
            if len(raw) > MAX_TRACE_LINE_BYTES:
                raise TraceError(f"{where}: a line longer than {MAX_TRACE_LINE_BYTES} bytes; a Mooncake request "
                                 "line is a few KiB")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise TraceError(f"{where}: not UTF-8 text (byte {offset + e.start} of the file)") from None
            offset += len(raw)
            if not line.strip():
                continue
            try:
                d = json.loads(line, object_pairs_hook=_object)
            except _DuplicateKey as e:
                raise TraceError(f"{where}: duplicate key {e.args[0]!r} in one JSON object") from None
            except json.JSONDecodeError as e:  # some messages end in "at" ("Unterminated string starting at")
                at = "" if e.msg.endswith(" at") else " at"  # the column in the line (one line, one document)
                raise TraceError(f"{where}: not JSON ({e.msg}{at} column {e.pos + 1})") from None
            except RecursionError:
                raise TraceError(f"{where}: not a request (JSON nested too deeply)") from None
            except ValueError:  # an integer literal past Python's int-string limit (4300 digits)
                raise TraceError(f"{where}: not a request (a number too long: an integer of more than "
                                 f"{sys.get_int_max_str_digits()} digits)") from None
            out.append(_request(d, where, TRACE_BLOCK_TOKENS))
    if not out:
        raise TraceError(f"no requests in {path}: a trace has one JSON request per line")
    return out


def synth_tokens(req: Request, block_tokens: int = TRACE_BLOCK_TOKENS) -> tuple[int, ...]:
    """Token ids for a request: block i is (hash_ids[i], 0, ..., 0), cut to `input_length` tokens. Raises
    TraceError past MAX_REQUEST_TOKENS tokens (a Request built by hand; read_trace refuses such a line)."""
    if req.input_length > MAX_REQUEST_TOKENS or len(req.hash_ids) * block_tokens > MAX_REQUEST_TOKENS + block_tokens:
        raise TraceError(f"a request of {req.input_length} tokens ({len(req.hash_ids)} hash ids): past the "
                         f"{MAX_REQUEST_TOKENS} tokens a replayed request may have")
    pad = (0,) * (block_tokens - 1)
    toks: list[int] = []
    for h in req.hash_ids:
        toks.append(h)
        toks.extend(pad)
    del toks[req.input_length:]
    return tuple(toks)


def _build(cfg: SimConfig, requests: list[Request]) -> tuple[Pool, Host | None]:
    cap = cfg.capacity_tokens
    if math.isinf(cap):
        cap = sum(r.input_length + (r.output_length if cfg.reserve_output else 0) for r in requests) + cfg.page_tokens
    for what, tokens in (("capacity" if cap == cfg.capacity_tokens else "capacity inf (the trace's tokens)", cap),
                         ("host tier", cfg.host_tokens)):
        if tokens // cfg.page_tokens > MAX_PAGES:
            raise ExceedsPool(f"{what}: {tokens:g} tokens at {cfg.page_tokens} tokens per page is "
                              f"{int(tokens // cfg.page_tokens)} pages, over the {MAX_PAGES} a replay allocates: "
                              "use larger pages or fewer tokens")
    state = PooledState("kv", bytes_per_token=cfg.bytes_per_token, page_tokens=cfg.page_tokens)
    layout = Layout.from_capacity([state], Capacity(tokens=int(cap), seqs=1))
    pool = Pool(layout)
    host = Host(pool, cfg.host_tokens // cfg.page_tokens) if cfg.host_tokens else None
    return pool, host


def simulate(path: Path, cfg: SimConfig, requests: list[Request] | None = None) -> SimResult:
    """Replay the trace at `path` (or the given `requests`) under `cfg`. Deterministic."""
    reqs = requests if requests is not None else read_trace(path, cfg.limit)
    pool, host = _build(cfg, reqs)
    prefix: Prefix = Prefix()
    c = dict(hit_tokens=0, host_hit_tokens=0, hit_requests=0, evictions=0, parks=0, wakes=0, parked_drops=0,
             peak_pages=0, refused_exceeds=0, refused_busy=0, dropped_hits=0, input_tokens=0)

    def park(cp):  # type: ignore[no-untyped-def]
        assert host is not None
        while True:
            try:
                parked = host.park_now(cp)
            except Busy:
                if not prefix.evict_parked():
                    return None
                c["parked_drops"] += 1
                continue
            except ExceedsPool:
                return None
            c["parks"] += 1
            return parked

    park_fn = park if host is not None else None
    for req in reqs:
        toks = synth_tokens(req)
        n = len(toks)
        c["input_tokens"] += n
        want = n + (req.output_length if cfg.reserve_output else 0)
        hit = prefix.lookup(toks)
        got = hit.num_tokens if hit is not None else 0
        lease = None
        while True:
            try:
                if hit is None:
                    lease = pool.lease(want)
                elif hit.tier is Resident:
                    lease = pool.lease_from(hit.kept, want, prefix_tokens=got, hold=hit)
                else:
                    assert host is not None
                    waking = host.wake(hit.kept, got, want, hold=hit)
                    waking.land()
                    lease = waking.lease
                    c["wakes"] += 1
                break
            except Remapping as r:
                pool.land(r.plan)
            except Busy:
                if prefix.evict(park_fn) is not None:
                    c["evictions"] += 1
                elif hit is not None:  # only the held hit blocks: serve without it
                    hit.close()
                    hit = None
                    c["dropped_hits"] += got
                    got = 0
                else:
                    c["refused_busy"] += 1
                    break
            except ExceedsPool:
                c["refused_exceeds"] += 1
                break
        if got:
            c["hit_tokens"] += got
            c["hit_requests"] += 1
            if hit is not None and hit.tier is not Resident:
                c["host_hit_tokens"] += got
        if lease is None:
            if hit is not None:
                hit.close()
            continue
        c["peak_pages"] = max(c["peak_pages"], pool.held_pages)
        cp = pool.retire(lease, n)
        assert cp is not None
        prefix.insert(toks, cp)
    return SimResult(
        trace=path.name,
        capacity_tokens=cfg.capacity_tokens,
        pool_pages=pool.leasable_pages,
        host_pages=host.num_pages if host else 0,
        page_tokens=cfg.page_tokens,
        requests=len(reqs),
        **c,
    )


def sweep(path: Path, cfg: SimConfig, capacities: tuple[float, ...] = SWEEP_TOKENS) -> Iterator[SimResult]:
    """`simulate` at each capacity (the trace is read once)."""
    reqs = read_trace(path, cfg.limit)
    for cap in capacities:
        yield simulate(path, SimConfig(cap, cfg.host_tokens, cfg.page_tokens, cfg.limit, cfg.reserve_output,
                                       cfg.bytes_per_token), reqs)
