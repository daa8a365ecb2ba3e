"""Host-side pool operation costs: median microseconds per call (kern-pool, pure Python).

Prefix lookup / insert of 1k / 8k / 32k / 128k-token prompts (tree already holding the prompt's
neighbours: 8 siblings sharing half the prompt), and lease / checkpoint / fork / lease_from at
16-token pages. Bar (ARCHITECTURE.md section 9): a 32k-token lookup / insert well under 1 ms.
Run: uv run python bench/pool_ops.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from kern_pool import Layout, Pool, Prefix

PAGE_TOKENS = 16


class _Kept:
    def __init__(self, n: int) -> None:
        self.num_tokens = n
        self.has_slot = False

    def close(self) -> None:
        pass


def median_us(fn: Callable[[], object], setup: Callable[[], object] | None = None, repeat: int = 31) -> float:
    samples = []
    for _ in range(repeat):
        if setup is not None:
            setup()
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1e3)
    return statistics.median(samples)


def prefix_rows() -> list[tuple[str, float]]:
    rows = []
    for n in (1024, 8192, 32768, 131072):
        prompt = tuple(range(n))
        prefix: Prefix = Prefix()
        for s in range(8):  # neighbours: share the first half, then diverge
            prefix.insert(prompt[: n // 2] + tuple(range(10**7 + s * n, 10**7 + s * n + n // 2)), _Kept(n))
        prefix.insert(prompt, _Kept(n))
        query = list(prompt) + [1]  # a list, as a caller would hand it over

        def lookup() -> None:
            hit = prefix.lookup(query)
            assert hit is not None and hit.num_tokens == n
            hit.close()

        rows.append((f"lookup {n // 1024}k tokens", median_us(lookup)))
        other = list(prompt[: n // 2]) + list(range(-n // 2, 0))
        holder: dict[str, Prefix] = {}

        def fresh() -> None:
            p: Prefix = Prefix()
            for s in range(8):
                p.insert(prompt[: n // 2] + tuple(range(10**7 + s * n, 10**7 + s * n + n // 2)), _Kept(n))
            holder["p"] = p

        rows.append((f"insert {n // 1024}k tokens (splits an edge)", median_us(lambda: holder["p"].insert(other, _Kept(n)), fresh)))
    return rows


def pool_rows() -> list[tuple[str, float]]:
    rows = []
    for n in (1024, 32768):
        pages = 4 * n // PAGE_TOKENS
        pool = Pool(Layout.simple(page_tokens=PAGE_TOKENS, pages=pages, slots=8))
        rows.append((f"lease {n // 1024}k tokens + close", median_us(lambda: pool.lease(n).close())))
        lease = pool.lease(n)
        lease.advance_to(n - 5)  # with a slot, cuts only at the position reached

        def ckpt() -> None:
            pool.checkpoint(lease, n - 5).close()

        rows.append((f"checkpoint {n // 1024}k (first: seals) + close", median_us(ckpt, repeat=1)))
        rows.append((f"checkpoint {n // 1024}k (sealed) + close", median_us(ckpt)))
        rows.append((f"fork {n // 1024}k mid-page + close", median_us(lambda: pool.fork(lease, n - 5, n + 16).close())))
        cp = pool.checkpoint(lease, n - 5)
        rows.append((f"lease_from {n // 1024}k mid-page + close", median_us(lambda: pool.lease_from(cp, n + 16).close())))
        def retire() -> None:
            fresh = pool.lease(n)
            fresh.advance_to(n)
            pool.retire(fresh, n).close()  # type: ignore[union-attr]

        rows.append((f"retire {n // 1024}k + close", median_us(retire)))
    return rows


def main() -> None:
    print(f"{'operation':<44} {'median us':>10}")
    for name, us in prefix_rows() + pool_rows():
        print(f"{name:<44} {us:>10.1f}")


if __name__ == "__main__":
    main()
