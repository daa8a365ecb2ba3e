"""A fake runtime with the pool API (lease / lease_from / retire over a kern_pool Pool) whose "model"
reads its KV through the block table, so wrong or missing cached pages change the generated tokens."""

from __future__ import annotations

import numpy as np
from kern_run_testutil import FakeRuntime


class FakePoolRuntime(FakeRuntime):
    """KV is stored per slot (page_id * page_tokens + offset) -> (position, token); page copies of a
    lease's plan are executed on that store. Decode predicts from the token, its position and a hash
    of every earlier position's token read through the block table (-1 where a slot holds another
    position: a wrong page shows)."""

    def __init__(self, page_tokens: int = 16, num_pages: int = 64, vocab: int = 300) -> None:
        super().__init__(page_tokens, num_pages, vocab)
        self.slot_kv: dict[int, tuple[int, int]] = {}
        self.copied_pages = 0

    # ---- pool API (contract.PrefixRuntime: what kern_run.prefix_cache uses)
    def _run(self, plan) -> None:  # type: ignore[no-untyped-def]
        P = self.page_tokens
        for c in plan.page_copies:
            self.copied_pages += 1
            for k in range(P):
                src = c.src_page_id * P + k
                if src in self.slot_kv:
                    self.slot_kv[c.dst_page_id * P + k] = self.slot_kv[src]
                else:
                    self.slot_kv.pop(c.dst_page_id * P + k, None)

    def lease(self, num_tokens: int, *, wait: bool = True):  # type: ignore[no-untyped-def]
        lease = self.kern_pool.lease(num_tokens)
        self._run(lease.plan)
        return lease

    def lease_from(self, checkpoint, num_tokens: int, *, prefix_tokens=None, hold=None, wait=True):  # type: ignore[no-untyped-def]
        lease = self.kern_pool.lease_from(checkpoint, num_tokens, prefix_tokens=prefix_tokens, hold=hold)
        self._run(lease.plan)
        return lease

    def retire(self, lease, num_tokens: int):  # type: ignore[no-untyped-def]
        return self.kern_pool.retire(lease, num_tokens)

    def checkpoint(self, lease, num_tokens: int, *, wait: bool = True):  # type: ignore[no-untyped-def]
        cp = self.kern_pool.checkpoint(lease, num_tokens)
        self._run(cp.plan)
        return cp

    # ---- the model
    def issue(self, program: str, values: dict[str, int], eager: bool = False) -> None:
        if self.scratch_only(values):
            super().issue(program, values, eager)
            return
        n = values["tokens"]
        ids, pos, slots = (self.inputs[k][:n] for k in ("token_ids", "positions", "slot_mapping"))
        for t, p, s in zip(ids, pos, slots):
            self.slot_kv[int(s)] = (int(p), int(t))
        super().issue(program, values, eager)
        if program == "decode":
            p = int(pos[0])
            pages = self.inputs["block_table"][0]
            h = 0
            for q in range(p):
                slot = int(pages[q // self.page_tokens]) * self.page_tokens + q % self.page_tokens
                at, tok = self.slot_kv.get(slot, (-1, -1))
                h = (h * 31 + (tok if at == q else -1) + 7) % 1_000_003
            nxt = (self.predict(int(ids[0]), p) + h) % 250 + 3
            self.next_token[0] = nxt
            self.logits[:] = 0
            self.logits[0, nxt] = 1.0

    @staticmethod
    def expected(prompt: list[int], steps: int) -> list[int]:
        """Tokens a correct KV cache gives (the same hash over the true sequence)."""
        seq = list(prompt)
        out: list[int] = []
        for _ in range(steps):
            p = len(seq) - 1
            h = 0
            for q in range(p):
                h = (h * 31 + seq[q] + 7) % 1_000_003
            nxt = (FakeRuntime.predict(seq[-1], p) + h) % 250 + 3
            out.append(nxt)
            seq.append(nxt)
        return out


__all__ = ["FakePoolRuntime", "np"]
