"""Per-request sampling parameters (issue 26's set) and what an engine without GPU sampling accepts.

Batched GPU sampling (issue 26) does not exist yet: today's runtime samples greedily (argmax in the
manifest). The parameters travel with every decode row anyway, so the batched engine drops in without a
change to the scheduler or the HTTP layer; `greedy_only_fault` is how a greedy-only engine refuses the rest.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """One row's sampling. `temperature` 0 is greedy (argmax); `top_k` 0 is off; `top_p` / `min_p` are
    probabilities; penalties as in the OpenAI / vLLM APIs (repetition 1.0 and presence / frequency 0.0 are off);
    `seed`: the request's RNG seed (None: unseeded); `logprobs`: top log-probabilities per token to return
    (None: none). Ranges are checked by the request models (protocol.py), not here."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    logprobs: int | None = None

    @property
    def greedy(self) -> bool:
        """Whether these parameters pick the argmax token (so a greedy-only engine serves them exactly)."""
        return (self.temperature == 0.0 and self.top_p == 1.0 and self.top_k in (0, 1) and self.min_p == 0.0
                and self.repetition_penalty == 1.0 and self.presence_penalty == 0.0
                and self.frequency_penalty == 0.0)


GREEDY = SamplingParams()


def greedy_only_fault(params: SamplingParams) -> tuple[str, str] | None:
    """(field, message) when a greedy-only engine cannot serve `params`, else None. The message says why and
    what to send instead (the 400 body of the request)."""
    checks = (
        ("temperature", params.temperature != 0.0, f"temperature {params.temperature}", "0"),
        ("top_p", params.top_p != 1.0, f"top_p {params.top_p}", "1"),
        ("top_k", params.top_k not in (0, 1), f"top_k {params.top_k}", "0 (or -1)"),
        ("min_p", params.min_p != 0.0, f"min_p {params.min_p}", "0"),
        ("repetition_penalty", params.repetition_penalty != 1.0,
         f"repetition_penalty {params.repetition_penalty}", "1"),
        ("presence_penalty", params.presence_penalty != 0.0, f"presence_penalty {params.presence_penalty}", "0"),
        ("frequency_penalty", params.frequency_penalty != 0.0,
         f"frequency_penalty {params.frequency_penalty}", "0"),
        ("logprobs", params.logprobs is not None, f"logprobs {params.logprobs}", "none"),
    )
    for field, bad, what, want in checks:
        if bad:
            return field, (f"{what} needs GPU sampling, which this engine does not have yet (issue 26: batched "
                           f"decode and sampling); it decodes greedily: send {field} {want} or leave it out")
    return None
