"""Host-only KV scheduling with kern_pool: a Pool of pages, a Prefix tree of kept prompts, a Host tier.

    uv run python examples/pool_simulation.py --trace tests/pool/data/tiny.jsonl --capacity 2048 --host 2048
    uv run python examples/pool_simulation.py --synthetic 20 --capacity 4096

No GPU and no kern_runtime: kern_pool only plans (which pages, which copies); an executor carries the plans
out. Each request, in order: look its prompt up in the Prefix; lease from the hit (a resident checkpoint),
or wake it from the host tier, or lease fresh; while the Pool says Busy, evict the coldest Prefix entry
(parking it on the host when there is one); then retire the lease at the prompt length and insert the
checkpoint, so later requests sharing the prompt's start reuse its pages. Prints one line per request and
the hit rate, evictions, parks and wakes. Exit status 0, 2 on a bad argument (one line on stderr).

A trace line is a Mooncake request: {"input_length": N, "output_length": M, "hash_ids": [...]}, one hash id
per 512-token block; two requests share a prefix as far as their leading hash ids agree.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import NoReturn

from kern_pool import (
    Busy,
    Capacity,
    ExceedsPool,
    Host,
    Layout,
    Pool,
    PooledState,
    Prefix,
    Remapping,
    Resident,
)

BLOCK = 512  # tokens per hash id, as in the Mooncake traces
BYTES_PER_TOKEN = 36 * 8 * 128 * 2 * 2  # Qwen3-4B K/V: layers * kv heads * head_dim * (K, V) * bf16


def tokens_of(input_length: int, hash_ids: list[int]) -> tuple[int, ...]:
    """Token ids standing for the prompt: block i is (hash_ids[i], 0, ..., 0), cut to input_length."""
    out: list[int] = []
    for h in hash_ids:
        out += [h] + [0] * (BLOCK - 1)
    return tuple(out[:input_length])


def read_requests(path: Path, limit: int) -> list[tuple[int, ...]]:
    """The prompts of the first `limit` requests of a JSONL trace. Raises ValueError naming file:line."""
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip() and len(prompts) < limit:
            try:
                d = json.loads(line)
                prompts.append(tokens_of(int(d["input_length"]), [int(h) for h in d["hash_ids"]]))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not a request ({exc!r})") from None
    return prompts


def synthetic(count: int, seed: int) -> list[tuple[int, ...]]:
    """`count` prompts over a few shared system prompts (hash ids 1..4), each with its own tail."""
    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        shared = list(range(1, rng.randint(1, 4) + 1))
        own = [1000 + i] * rng.randint(0, 2)
        ids = shared + own
        prompts.append(tokens_of(len(ids) * BLOCK - rng.randint(0, BLOCK - 1), ids))
    return prompts


def replay(prompts: list[tuple[int, ...]], capacity: int, host_tokens: int, page_tokens: int) -> dict[str, int]:
    """Serve `prompts` one at a time; the counts (printing one line per request)."""
    # One pooled state (the KV cache) of BYTES_PER_TOKEN per token, in pages of page_tokens tokens.
    state = PooledState("kv", bytes_per_token=BYTES_PER_TOKEN, page_tokens=page_tokens)
    pool = Pool(Layout.from_capacity([state], Capacity(tokens=capacity, seqs=1)))
    host = Host(pool, host_tokens // page_tokens) if host_tokens else None  # host pages for parked prefixes
    prefix: Prefix = Prefix()  # token sequence -> kept checkpoint (resident or parked)
    counts = {k: 0 for k in ("requests", "input_tokens", "hit_tokens", "evictions", "parks", "wakes", "refused")}

    def park(checkpoint):  # type: ignore[no-untyped-def] - called by evict: move the entry to the host tier
        try:
            parked = host.park_now(checkpoint)  # copies its pages to host pages (plan), frees device pages
        except (Busy, ExceedsPool):
            return None  # the host is full too: the entry is dropped
        counts["parks"] += 1
        return parked

    for number, tokens in enumerate(prompts, 1):
        counts["requests"] += 1
        counts["input_tokens"] += len(tokens)
        hit = prefix.lookup(tokens)  # the longest kept prefix of `tokens`, held until the lease takes it
        reused = hit.num_tokens if hit is not None else 0
        lease, how = None, "fresh"
        while lease is None:
            try:
                if hit is None:
                    lease = pool.lease(len(tokens))
                elif hit.tier is Resident:  # pages still on the device: share them
                    lease, how = pool.lease_from(hit.kept, len(tokens), prefix_tokens=reused, hold=hit), "hit"
                else:  # parked on the host: copy back (the plan an executor would run), then lease
                    waking = host.wake(hit.kept, reused, len(tokens), hold=hit)
                    waking.land()  # the executor reports the copies done
                    lease, how = waking.lease, "woken"
                    counts["wakes"] += 1
            except Remapping as remap:  # the pool moved blocks: the executor lands the remap first
                pool.land(remap.plan)
            except Busy:  # no free pages: evict the coldest prefix entry (parking it if there is a host)
                if prefix.evict(park if host is not None else None) is not None:
                    counts["evictions"] += 1
                elif hit is not None:  # only the held hit is left: serve without it
                    hit.close()
                    hit, reused, how = None, 0, "fresh"
                else:
                    break
            except ExceedsPool:  # larger than the whole pool
                break
        if lease is None:
            counts["refused"] += 1
            print(f"request {number:3}: {len(tokens):6} tokens  refused (the pool cannot hold it)")
            continue
        counts["hit_tokens"] += reused
        prefix.insert(tokens, pool.retire(lease, len(tokens)))  # keep the prompt's pages for later requests
        print(f"request {number:3}: {len(tokens):6} tokens  {how:5} reused {reused:6}  "
              f"pool pages held {pool.held_pages}/{pool.leasable_pages}")
    return counts


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # a bad argument: one line on stderr, exit status 2 (no usage block)
        self.exit(2, f"{self.prog}: {message}\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(prog=Path(__file__).name, description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--trace", type=Path, help="a Mooncake JSONL trace (default: --synthetic 12)")
    source.add_argument("--synthetic", type=int, metavar="N", help="N synthetic requests over shared prefixes")
    parser.add_argument("--limit", type=int, default=50, help="first N requests of --trace (default 50)")
    parser.add_argument("--capacity", type=int, default=4096, help="device pool size in tokens (default 4096)")
    parser.add_argument("--host", type=int, default=0, help="host tier size in tokens (default 0: none)")
    parser.add_argument("--page-tokens", type=int, default=BLOCK, help=f"tokens per page (default {BLOCK})")
    parser.add_argument("--seed", type=int, default=0, help="seed of --synthetic")
    args = parser.parse_args(argv)
    for flag, value, low in (("--synthetic", args.synthetic, 1), ("--limit", args.limit, 1),
                             ("--capacity", args.capacity, args.page_tokens), ("--host", args.host, 0),
                             ("--page-tokens", args.page_tokens, 1)):
        if value is not None and value < low:
            parser.error(f"{flag} {value}: expected an integer >= {low}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.trace is not None:
        try:
            prompts = read_requests(args.trace, args.limit)
        except (OSError, ValueError) as exc:
            print(f"pool_simulation.py: --trace {args.trace}: {exc}", file=sys.stderr)
            return 2
    else:
        prompts = synthetic(args.synthetic or 12, args.seed)
    c = replay(prompts, args.capacity, args.host, args.page_tokens)
    rate = c["hit_tokens"] / c["input_tokens"] if c["input_tokens"] else 0.0
    print(f"{c['requests']} requests, {c['input_tokens']} prompt tokens, {c['hit_tokens']} reused: hit rate "
          f"{rate:.1%}; evictions {c['evictions']}, parks {c['parks']}, wakes {c['wakes']}, refused {c['refused']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
