"""FakePoolRuntime plus the runtime call kern serve's scheduler uses beyond kern_run.prefix_cache's."""

from __future__ import annotations

from fake_pool_runtime import FakePoolRuntime


class ServedFakeRuntime(FakePoolRuntime):
    """`checkpoint`, its plan executed on the fake KV (`kern_pool`, the Pool, is FakeRuntime's already)."""

    def checkpoint(self, lease, num_tokens: int):  # type: ignore[no-untyped-def]
        cp = self.kern_pool.checkpoint(lease, num_tokens)
        self._run(cp.plan)
        return cp
