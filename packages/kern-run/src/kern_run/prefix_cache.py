"""Several prompts in one `kern run`, sharing cached prefixes through kern_pool's `Prefix`.

After each prompt its prefill KV (positions 0..n-2: what chunked prefill wrote) is retired into a
pure-KV checkpoint and filed in a `Prefix` tree under those tokens. The next prompt looks up the
longest cached strict prefix, resumes it with `Runtime.lease_from` (whole pages shared, a mid-page
resume copies that page on the device) and prefills only the rest.

Outputs are identical to running each prompt alone because the reused positions hold the bits the
prompt's own prefill would write. With a batch-invariant manifest (`meta.caller.prefill_batch_invariant`:
every prefill GEMM pinned to one cuBLASLt algorithm for all M, tools/pick_algos.py) a token's K/V do not
depend on the chunk that computed them, so the whole hit is reused and only the new tokens are prefilled.
Otherwise the cached length is rounded down to a multiple of the prefill chunk: the prompt's own prefill
then runs exactly the chunks it would run alone ([k*chunk, (k+1)*chunk) ...), and the reused positions
were written by chunks with the same boundaries and the same tokens in the earlier prompt. KV written by
decode steps (generated tokens) is not cached: decode computes K/V with other kernels (m=1 GEMVs) than
prefill, so its bits may differ.
When the pool is full the coldest unlocked entry is evicted (dropped) and the lease asked again.

Prefix reuse plugs into the `Generator` through its page source (contract.PageSource): `PrefixPages` is the
source, and its reservation tells the Generator how many prompt positions already hold their K/V, so its
prefill starts after them. `PrefixSession` runs a Generator over the same runtime with that source
(`Generator.with_pages`); the runtime must be a `contract.PrefixRuntime` (`lease_from`, `retire`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from kern_manifest import json_text_fault, read_regular_file
from kern_pool import Prefix

from .contract import PrefixRuntime, Reserved, SeqLease
from .errors import InputError
from .generate import GenerateOptions, GenerateResult, Generator, pool_tokens
from .jsonfile import MAX_PROMPTS_BYTES
from .text import text_fault


def read_prompts(path: str | Path) -> list[str]:
    """Prompts from a file: JSONL of objects with a "prompt" string (when any non-empty line starts with
    `{` or `[`, every non-empty line must be one), else one prompt per non-empty line (text, with `\\n`
    written as the two characters backslash-n kept as is).

    Raises InputError for an unreadable or non-UTF-8 file, no prompts, or a JSON line that is not an
    object with a "prompt" string or whose string is not UTF-8 text (a lone surrogate escape such as
    `"\\ud800"`), naming the line number in the file.
    """
    try:
        data = read_regular_file(path, MAX_PROMPTS_BYTES, "a prompts file is a text or JSONL file", "a prompts file")
        all_lines = data.decode("utf-8").splitlines()
    except OSError as exc:
        raise InputError(f"--prompts {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"--prompts {path}: {json_text_fault(exc)}") from None
    numbered = [(i, line) for i, line in enumerate(all_lines, 1) if line.strip()]
    lines = [line for _, line in numbered]
    if not lines:
        what = f"its {len(all_lines)} line(s) are all blank" if all_lines else "the file is empty"
        raise InputError(f"--prompts {path}: no prompts ({what}): write one prompt per line")
    if any(line.lstrip().startswith(("{", "[")) for line in lines):
        prompts = []
        for i, line in numbered:
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError) as exc:  # JSONDecodeError, too deep, an integer past the digit limit
                reason = json_text_fault(exc)
                if reason is None:
                    raise
                raise InputError(f"--prompts {path}:{i}: {reason} (a file with any line starting with "
                                 "'{' or '[' is read as JSONL)") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
                raise InputError(f"--prompts {path}:{i}: expected an object with a \"prompt\" string (a file "
                                 "with any line starting with '{' or '[' is read as JSONL)")
            fault = text_fault(obj["prompt"])
            if fault is not None:
                raise InputError(f"--prompts {path}:{i}: the \"prompt\" string is not UTF-8 text ({fault})")
            prompts.append(obj["prompt"])
        return prompts
    return lines


def aligned_prefix(hit_tokens: int, chunk: int, batch_invariant: bool = False) -> int:
    """Cached tokens actually reused: all `hit_tokens` when prefill is batch-invariant (module docstring),
    else `hit_tokens` rounded down to a multiple of the prefill chunk."""
    if batch_invariant:
        return max(hit_tokens, 0)
    return hit_tokens // chunk * chunk if chunk > 0 else 0


def lease_prefixed(rt: PrefixRuntime, prefix: Prefix[Any, Any], prompt_ids: Sequence[int], num_tokens: int,
                   chunk: int, batch_invariant: bool) -> tuple[SeqLease, int]:
    """A lease of `num_tokens` tokens resuming the longest cached strict prefix of `prompt_ids` (aligned_prefix of
    the hit; a fresh lease without one), and the positions it resumed. When the pool is full the coldest unlocked
    prefix is evicted and the lease asked again; with nothing left to evict the hit is given up for a fresh lease.
    Raises kern_pool `Busy` when even that cannot be had (the pool holds other leases), InputError when the
    tokens can never fit the pool (`ExceedsPool`)."""
    from kern_pool import Busy, ExceedsPool

    prompt = list(prompt_ids)
    hit = prefix.lookup(prompt) if len(prompt) > 1 else None
    cached = aligned_prefix(hit.num_tokens, chunk, batch_invariant) if hit is not None else 0
    if hit is not None and cached == 0:
        hit.close()
        hit = None
    while True:
        try:
            if hit is not None:
                return rt.lease_from(hit.kept, num_tokens, prefix_tokens=cached, hold=hit), cached
            return rt.lease(num_tokens), 0
        except Busy:
            if prefix.evict() is not None:
                continue
            if hit is None:
                raise
            hit.close()  # the entry we resume is the only thing left: start from scratch
            hit, cached = None, 0
        except ExceedsPool as exc:
            if hit is not None:
                hit.close()
            raise InputError(f"{num_tokens} tokens do not fit the KV pool: {exc}") from None


class PrefixPages:
    """The `PageSource` of a multi-prompt run: leases from the runtime's pool, resumed from the longest cached
    prefix of the prompt being reserved for (`reserve(num_tokens, prompt_ids)`).

    `max_tokens`: as `generate.SeqPages`. After `reserve`, `prompt` and `cached` are the prompt reserved for and
    the positions resumed from the cache; `keep` files the sequence's prefill KV under the prompt."""

    source = "runtime pool + prefix cache"

    def __init__(self, runtime: PrefixRuntime, prefix: Prefix[Any, Any], chunk: int, page_tokens: int,
                 batch_invariant: bool = False) -> None:
        self.rt = runtime
        self.prefix = prefix
        self.chunk = chunk
        self.batch_invariant = batch_invariant
        self.max_tokens = pool_tokens(runtime, page_tokens)
        self.prompt: list[int] = []
        self.cached = 0
        self._lease: SeqLease | None = None

    def reserve(self, num_tokens: int, prompt_ids: Sequence[int] = ()) -> Reserved:
        """Pages for `num_tokens` tokens, the first `cached_tokens` of them reused from the longest cached prefix
        of `prompt_ids` (aligned_prefix; none for `()`). Raises InputError when the pool cannot hold them even
        after evicting every unlocked cached prefix."""
        from kern_pool import Busy

        self.release()
        self.prompt, self.cached = list(prompt_ids), 0
        try:
            lease, cached = lease_prefixed(self.rt, self.prefix, self.prompt, num_tokens, self.chunk,
                                           self.batch_invariant)
        except Busy:
            raise InputError(f"{num_tokens} tokens do not fit the KV pool even with no prefix cached") from None
        self._lease, self.cached = lease, cached
        return Reserved(tuple(lease.page_ids()), cached)

    def keep(self, num_tokens: int) -> bool:
        """Retire the current lease keeping its first `num_tokens` tokens in the prefix tree (keyed by
        the prompt's first `num_tokens` ids). False when there is nothing to keep."""
        lease, self._lease = self._lease, None
        if lease is None:
            return False
        if num_tokens < 1:
            lease.close()
            return False
        cp = self.rt.retire(lease, num_tokens)
        if cp is None:
            return False
        return self.prefix.insert(tuple(self.prompt[:num_tokens]), cp)

    def release(self) -> None:
        if self._lease is not None:
            self._lease.close()
            self._lease = None


@dataclass(frozen=True)
class PromptResult:
    result: GenerateResult
    cached_tokens: int


class PrefixSession:
    """Runs prompts one after another on a Generator over `gen`'s runtime, reusing cached prefixes (module
    docstring): `gen.with_pages(PrefixPages(...))` (`gen`'s own pages are released; `gen` stays usable).

    Needs a `contract.PrefixRuntime` (the pool API: `lease`, `lease_from`, `retire`): raises InputError for
    another runtime. `close()` drops the cache.
    """

    def __init__(self, gen: Generator, chunk: int) -> None:
        rt = gen.rt
        if not isinstance(rt, PrefixRuntime):
            raise InputError(f"this runtime ({type(rt).__name__}) has no pool API (lease / lease_from / retire): "
                             "no prefix reuse")
        self.prefix: Prefix[Any, Any] = Prefix()
        self.pages = PrefixPages(rt, self.prefix, chunk, gen.page_tokens, gen.facts.prefill_batch_invariant)
        self.gen = gen.with_pages(self.pages)

    def generate(self, prompt_ids: list[int], opts: GenerateOptions,
                 on_token: Callable[[int], None] | None = None) -> PromptResult:
        """`Generator.generate` with the prompt's cached prefix reused; then its prefill KV is cached."""
        if opts.chunk != self.pages.chunk:
            raise InputError(f"chunk {opts.chunk} differs from the session's {self.pages.chunk}")
        try:
            result = self.gen.generate(prompt_ids, opts, on_token)
        except BaseException:
            self.pages.release()
            raise
        cached = self.pages.cached
        if result.tokens or len(prompt_ids) - 1 <= cached:  # the prefill KV was written (or all of it resumed)
            self.pages.keep(len(prompt_ids) - 1)
        else:
            self.pages.release()
        return PromptResult(result, cached)

    def close(self) -> None:
        self.pages.release()
        self.prefix.clear()
