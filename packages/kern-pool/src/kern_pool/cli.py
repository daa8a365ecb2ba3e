"""`kern-pool` command line: `kern-pool simulate TRACE [options]`. Parses options, calls simulate.

Every refusal is one stderr line before any replay runs; a sweep shows its progress on stderr when that is a
terminal; a closed stdout (`| head -1`) ends the command quietly with exit 1.
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import io
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Callable, TextIO

from . import __version__
from .errors import PoolError
from .simulate import MAX_PAGES, SWEEP_TOKENS, SimConfig, SimResult, TraceError, simulate, sweep
from .sweep_plot import Reference, check_png_path, plot_sweep, reference_for


MAX_TOKENS = 1e9  # above any trace's total (the largest here has 1.45e8 input tokens): 'inf' replays with
# everything fitting instead. Also the upper bound of --host-tokens, --page-tokens and --limit (stated when refused).


def _tokens(text: str) -> float:
    """--capacity: a whole token count > 0 (float syntax such as 3e6 allowed), or inf / all."""
    if text.lower() in ("inf", "infinity", "all"):
        return math.inf
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a token count: {text!r}") from None
    if not (0 < value <= MAX_TOKENS):  # also refuses nan
        raise argparse.ArgumentTypeError(f"capacity must be in (0, {MAX_TOKENS:.0e}] tokens, or 'inf' for a pool "
                                         f"that never evicts; got {text}")
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"capacity must be a whole number of tokens, got {text}")
    return value


def _count(low: int, what: str, unit: str):
    """A whole number in [`low`, MAX_TOKENS], float syntax (3e6) allowed when it is whole; the refusal states that
    range (argparse names the option)."""
    def parse(text: str) -> int:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (value.is_integer() and low <= value <= MAX_TOKENS):
            raise argparse.ArgumentTypeError(f"{what} must be a whole number in [{low}, {MAX_TOKENS:.0e}] {unit}, "
                                             f"got {text}")
        return int(value)
    return parse


class _OneLineParser(argparse.ArgumentParser):
    """argparse's refusal of an option or argument as one stderr line (`kern-pool simulate: error: argument
    --capacity: ...`, exit 2), without the usage lines argparse prints first (`--help` still shows them).
    `add_subparsers` makes the subcommands' parsers of this class too."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _OneLineParser(prog="kern-pool", description="kern-pool: host-side KV pool tools")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("simulate", help="replay a Mooncake-format trace through Pool + Prefix")
    s.add_argument("trace", type=Path, help="JSONL trace (timestamp, input_length, output_length, hash_ids)")
    s.add_argument("--capacity", type=_tokens, default=None, help="device pool tokens (default 3e6; 'inf' = all fit)")
    s.add_argument("--host-tokens", type=_count(0, "host tokens", "tokens"), default=0,
                   help="host tier tokens (default 0: no host tier)")
    s.add_argument("--page-tokens", type=_count(1, "page tokens", "tokens"), default=512,
                   help="tokens per page (default 512 = trace blocks)")
    s.add_argument("--limit", type=_count(1, "limit", "requests"), default=None,
                   help="replay only the first N requests")
    s.add_argument("--reserve-output", action="store_true", help="lease room for output tokens as well")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.add_argument("--sweep", action="store_true", help="sweep capacities 1e4..5e7 and inf")
    s.add_argument("--png", type=Path, default=None, help="with --sweep: write the curve here (needs [plot])")
    return p


def tokens_text(tokens: float) -> str:
    """A token count as the table prints it, exactly: `1e4`, `1.5e6`, `1536`, `inf` (never rounded)."""
    if math.isinf(tokens):
        return "inf"
    digits = str(int(tokens))
    mantissa = digits.rstrip("0")
    if len(digits) - len(mantissa) < 3:  # fewer than three trailing zeros: the digits are shorter
        return digits
    return f"{mantissa[0]}{'.' + mantissa[1:] if len(mantissa) > 1 else ''}e{len(digits) - 1}"


def _line(r: SimResult) -> str:
    cap = tokens_text(r.capacity_tokens)
    return (f"{cap:>6} {r.pool_pages:>8} {r.hit_rate:>8.3f} {r.request_hit_rate:>8.3f} {r.evictions:>9} "
            f"{r.parks:>6} {r.wakes:>6} {r.peak_pages:>8} {r.refused_exceeds + r.refused_busy:>8}")


HEADER = f"{'tokens':>6} {'pages':>8} {'hit_tok':>8} {'hit_req':>8} {'evictions':>9} {'parks':>6} {'wakes':>6} {'peak_pg':>8} {'refused':>8}"


def main(argv: list[str] | None = None) -> int:
    """`kern-pool` with `argv` (default: sys.argv); the exit code."""
    return _quiet_on_closed_pipe(lambda: _main(argv))


class _ClosedStream(io.TextIOBase):
    """Stands in for `sys.stdout` / `sys.stderr` when the descriptor is closed (kern_manifest.pipes.ClosedStream):
    writing text raises `BrokenPipeError` (errno EPIPE), flushing does nothing, and it has no file descriptor."""

    encoding = "utf-8"

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text:
            raise BrokenPipeError(errno.EPIPE, "the standard stream's file descriptor is closed")
        return 0


def _quiet_on_closed_pipe(main: Callable[[], int]) -> int:
    """`main()`'s exit code, output flushed; 1 (as click and the Python docs' recipe), printing nothing more, when the reader of stdout
    or stderr has gone (`| head -1`): stdout and stderr then point at /dev/null, so the interpreter's exit flush
    cannot fail either (the recipe of the Python docs' "Note on SIGPIPE"; kern_manifest.pipes is the same for
    kern-manifest and kern, which kern-pool does not import). A closed descriptor (`>&-`: Python sets the stream to
    None) becomes a `_ClosedStream`, whose writes raise the same BrokenPipeError."""
    if sys.stdout is None:
        sys.stdout = _ClosedStream()
    if sys.stderr is None:
        sys.stderr = _ClosedStream()
    try:
        try:
            return main()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            try:
                os.dup2(devnull, stream.fileno())
            except (AttributeError, OSError, ValueError):  # not a file descriptor (a test's capture buffer)
                pass
        os.close(devnull)
        return 1


def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    if not args.trace.is_file():
        what = ("is a directory, not a trace file" if args.trace.is_dir() else
                "is not a regular file (a device, pipe or socket)" if args.trace.exists() else "not found")
        print(f"kern-pool: trace {args.trace} {what}", file=sys.stderr)
        return 2
    if args.png is not None and not args.sweep:
        print("kern-pool: --png needs --sweep", file=sys.stderr)
        return 2
    if args.sweep and args.capacity is not None:
        print(f"kern-pool: --capacity with --sweep: the sweep replays its own capacities "
              f"({', '.join(f'{c:g}' for c in SWEEP_TOKENS)}); "
              "pass one or the other", file=sys.stderr)
        return 2
    capacity = 3e6 if args.capacity is None else args.capacity
    if capacity < args.page_tokens:
        print(f"kern-pool: --capacity {capacity:g} tokens holds no page of --page-tokens {args.page_tokens}: "
              f"pass --capacity >= {args.page_tokens}", file=sys.stderr)
        return 2
    if 0 < args.host_tokens < args.page_tokens:
        print(f"kern-pool: --host-tokens {args.host_tokens} holds no page of --page-tokens {args.page_tokens}: "
              f"pass 0 (no host tier) or >= {args.page_tokens}", file=sys.stderr)
        return 2
    finite = [c for c in (SWEEP_TOKENS if args.sweep else (capacity,)) if not math.isinf(c)]
    largest = "the sweep's largest capacity," if args.sweep else "--capacity"
    for flag, tokens in ((largest, max(finite, default=0)), ("--host-tokens", args.host_tokens)):
        if tokens // args.page_tokens > MAX_PAGES:  # before any replay (a sweep would fail after minutes)
            print(f"kern-pool: {flag} {tokens:g} tokens at --page-tokens {args.page_tokens} is "
                  f"{int(tokens // args.page_tokens)} pages, over the {MAX_PAGES} a replay allocates: raise "
                  "--page-tokens" + ("" if args.sweep and flag == largest else " or lower the tokens"),
                  file=sys.stderr)
            return 2
    if args.png is not None:
        fault = check_png_path(args.png)
        if fault is not None:
            print(f"kern-pool: {fault}", file=sys.stderr)
            return 2
        if importlib.util.find_spec("matplotlib") is None:  # checked before a sweep of minutes, not after
            print("kern-pool: --png needs matplotlib: pip install 'kern-pool[plot]'", file=sys.stderr)
            return 3
    cfg = SimConfig(capacity, args.host_tokens, args.page_tokens, args.limit, args.reserve_output)
    try:
        return _run(args, cfg)
    except BrokenPipeError:  # the reader of stdout has gone: _quiet_on_closed_pipe's, not a trace error
        raise
    except (TraceError, PoolError, OSError) as e:
        print(f"kern-pool: {e}", file=sys.stderr)
        return 2


def sweep_progress(results: Iterator[SimResult], capacities: tuple[float, ...], err: TextIO) -> Iterator[SimResult]:
    """`results` (one replay per capacity, in order) passed through, with a progress line on `err` rewritten before
    each replay (`sweep 3/10: capacity 1e6, 8 s so far`) and cleared at the end; nothing when `err` is not a
    terminal (a log file or pipe gets no carriage returns)."""
    if not err.isatty():
        yield from results
        return
    t0 = time.monotonic()
    try:
        for i, cap in enumerate(capacities, 1):
            err.write(f"\r\x1b[Ksweep {i}/{len(capacities)}: capacity {tokens_text(cap)}, "
                      f"{time.monotonic() - t0:.0f} s so far")
            err.flush()
            result = next(results, None)
            if result is None:
                return
            err.write("\r\x1b[K")  # the table row, if any, lands on a clean line
            err.flush()
            yield result
    finally:
        err.write("\r\x1b[K")
        err.flush()


def _run(args: argparse.Namespace, cfg: SimConfig) -> int:
    if args.sweep:
        reference: Reference | None = None
        if args.png is not None:
            reference, which = reference_for(args.trace, cfg)
            print(f"kern-pool: {which}", file=sys.stderr)
        results = []
        if not args.json:
            print(HEADER, flush=True)
        for r in sweep_progress(sweep(args.trace, cfg, SWEEP_TOKENS), SWEEP_TOKENS, sys.stderr):
            results.append(r)
            if not args.json:
                print(_line(r), flush=True)
        if args.json:
            print(json.dumps([r.to_json() for r in results], indent=1))
        if args.png is not None:
            try:
                plot_sweep(results, reference, args.png)
            except RuntimeError as e:
                print(f"kern-pool: {e}", file=sys.stderr)
                return 3
            print(f"wrote {args.png}", file=sys.stderr)
        return 0
    r = simulate(args.trace, cfg)
    if args.json:
        print(json.dumps(r.to_json(), indent=1))
    else:
        print(HEADER)
        print(_line(r))
        print(f"requests {r.requests}, input tokens {r.input_tokens}, hit tokens {r.hit_tokens} "
              f"(host {r.host_hit_tokens}), parked drops {r.parked_drops}, hits dropped under pressure "
              f"{r.dropped_hits} tokens")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
