"""FakePoolRuntime plus what kern serve's engine and scheduler use beyond kern_run.prefix_cache's: `checkpoint`,
`read_output(name, rows)` (the engine reads back the rows of its bucket), all-padding decode steps (the
engine's warm-up at load: every row on the scratch page, nothing to predict), and the decode program's
decode_advance (the next step's inputs written "on the device", as the tiny manifest's decode ends), which the
engine relies on when a step continues the last one. The GPU sampler's inputs (the tiny manifest has the
sampler) are kept in `sampler_inputs`; the fake's tokens stay its greedy prediction, and the top-logprobs program
writes nothing."""

from __future__ import annotations

import numpy as np
from fake_pool_runtime import FakePoolRuntime


class ServedFakeRuntime(FakePoolRuntime):
    """`checkpoint`, its plan executed on the fake KV (`kern_pool`, the Pool, is FakeRuntime's already)."""

    warm_steps = 0

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.sampler_inputs: dict[str, np.ndarray] = {}

    def write_input(self, name: str, array: np.ndarray) -> None:
        if name in ("sample_params", "hist_tokens", "hist_counts"):
            self.sampler_inputs[name] = np.array(array)
            return
        super().write_input(name, array)

    def checkpoint(self, lease, num_tokens: int):  # type: ignore[no-untyped-def]
        cp = self.kern_pool.checkpoint(lease, num_tokens)
        self._run(cp.plan)
        return cp

    def issue(self, program: str, values: dict[str, int], eager: bool = False) -> None:
        if program == "top_logprobs":
            return
        padding = (program == "decode" and not self.inputs["block_table"][0].any()
                   and not self.inputs["positions"][:values["tokens"]].any())
        if padding:  # the warm-up: writes only the scratch slot, reads nothing
            self.warm_steps += 1
            return
        super().issue(program, values, eager)
        if program == "decode":  # kern_decode_advance, one row
            P = self.page_tokens
            p = int(self.inputs["positions"][0]) + 1
            table = self.inputs["block_table"][0]
            slot = int(table[p // P]) * P + p % P if p // P < table.size else -1
            for name, value in (("token_ids", int(self.next_token[0])), ("positions", p), ("seq_lens", p + 1),
                                ("slot_mapping", slot)):
                self.inputs[name] = np.asarray([value], dtype=np.int32)

    def read_output(self, name: str, rows: int | None = None):  # type: ignore[no-untyped-def]
        assert rows in (None, 1), (name, rows)  # one row: the manifest's seqs max is 1
        if name in ("top_ids", "top_logprobs"):
            return np.zeros((1, 20), dtype=np.int32 if name == "top_ids" else np.float32)
        assert name == "next_token", name
        return self.next_token.copy()
