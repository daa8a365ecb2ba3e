"""KV pages of a batch's rows: one lease per row, held together while the batch decodes.

With a prefix cache (`prefix`, needs a `contract.PrefixRuntime`) each row resumes the longest cached prefix of
its prompt (`prefix_cache.lease_prefixed`: whole pages shared, a mid-page resume copies that page, the reuse
rounded down to the chunk unless prefill is batch-invariant), and once its prefill is done its prompt's KV
(positions 0..n-2) is filed in the cache while the row keeps running (`rt.checkpoint`): a later row of the same
wave, or of a later wave, shares it. Without one, every row gets a fresh lease.

`reserve` answers None when the pool is full but other rows hold pages (the caller ends the wave there and
admits the row in the next), and raises InputError when the row cannot fit even alone.
"""

from __future__ import annotations

from typing import Any, Sequence

from kern_pool import Prefix

from .contract import CallerRuntime, PrefixRuntime, SeqLease
from .errors import InputError
from .generate import pool_tokens


class BatchPages:
    """Leases for a batch's rows. `max_tokens`: tokens one row can hold ((num_pages - 1) * page_tokens).
    `prefix`: a kern_pool `Prefix` to resume and file prompt prefixes in (then `runtime` must be a
    `PrefixRuntime`; InputError otherwise), or None. `held`: rows holding a lease now."""

    def __init__(self, runtime: CallerRuntime, page_tokens: int, prefix: Prefix[Any, Any] | None = None,
                 chunk: int = 512, batch_invariant: bool = False) -> None:
        if prefix is not None and not isinstance(runtime, PrefixRuntime):
            raise InputError(f"this runtime ({type(runtime).__name__}) has no pool API (lease / lease_from / retire "
                             "/ checkpoint): no prefix reuse")
        self.rt = runtime
        self.prefix = prefix
        self.chunk = chunk
        self.batch_invariant = batch_invariant
        self.max_tokens = pool_tokens(runtime, page_tokens)
        self.held = 0

    def reserve(self, num_tokens: int, prompt_ids: Sequence[int]) -> tuple[SeqLease, int] | None:
        """(a lease for `num_tokens` tokens, the prompt positions it already holds) for a row whose prompt is
        `prompt_ids`; None when the pool is full while other rows hold leases. Raises InputError when the
        tokens cannot fit even with no other row (and every unlocked cached prefix evicted)."""
        from kern_pool import Busy, ExceedsPool

        from .prefix_cache import lease_prefixed

        try:
            if self.prefix is not None:
                assert isinstance(self.rt, PrefixRuntime)
                lease, cached = lease_prefixed(self.rt, self.prefix, prompt_ids, num_tokens, self.chunk,
                                               self.batch_invariant)
            else:
                lease, cached = self.rt.lease(num_tokens), 0
        except Busy:
            if self.held:
                return None
            raise InputError(f"{num_tokens} tokens do not fit the KV pool even with no prefix cached: shorten the "
                             "prompt or --max-tokens, or raise --capacity") from None
        except ExceedsPool as exc:
            raise InputError(f"{num_tokens} tokens do not fit the KV pool: {exc}") from None
        self.held += 1
        return lease, cached

    def keep(self, lease: SeqLease, prompt_ids: Sequence[int], num_tokens: int) -> bool:
        """File the first `num_tokens` tokens of the running `lease` (its prompt's prefill KV) in the prefix cache,
        keyed by `prompt_ids[:num_tokens]`. False when there is no cache, nothing to keep, or the pool has no room
        for the checkpoint's bookkeeping (the row is unaffected)."""
        from kern_pool import PoolError

        if self.prefix is None or num_tokens < 1:
            return False
        assert isinstance(self.rt, PrefixRuntime)
        try:
            cp = self.rt.checkpoint(lease, num_tokens)
        except PoolError:
            return False
        return self.prefix.insert(tuple(prompt_ids[:num_tokens]), cp)

    def release(self, lease: SeqLease) -> None:
        """Return a row's lease (its filed prefix stays in the cache)."""
        if lease.close():
            self.held -= 1

    def close(self) -> None:
        """Drop the cache's unlocked entries."""
        if self.prefix is not None:
            self.prefix.clear()
