"""The greedy loop both sides of the replay check run (torch_step.reference_greedy, replay.HarvestedStep.greedy):
the prompt fed one token a step at positions 0.., then each greedy token fed back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def feed_greedy(prompt: list[int], steps: int, run: Callable[[int, int], tuple[int, Any]]) -> tuple[list[int], list[Any]]:
    """`run(token, position) -> (next token, that step's logits)` over `len(prompt) + steps - 1` steps. Returns
    (the `steps` tokens after the prompt, every step's logits in order). Raises ValueError for an empty prompt or
    `steps < 1`."""
    if not prompt or steps < 1:
        raise ValueError(f"a prompt of {len(prompt)} token(s) and {steps} step(s): need at least one of each")
    tokens: list[int] = []
    rows = []
    token = prompt[0]
    for position in range(len(prompt) + steps - 1):
        nxt, logits = run(token, position)
        rows.append(logits)
        if position + 1 < len(prompt):
            token = prompt[position + 1]
        else:
            tokens.append(nxt)
            token = nxt
    return tokens, rows
