"""What an engine without GPU sampling accepts of a request's `kern_run.sampling.SamplingParams`.

Batched GPU sampling (issue 26) is not wired into a decode program yet: today's runtime samples greedily
(argmax in the manifest). The parameters travel with every decode row anyway, so the batched engine drops in
without a change to the scheduler or the HTTP layer; `greedy_only_fault` is how a greedy-only engine refuses
the rest (penalties included: the manifest's argmax applies none).
"""

from __future__ import annotations

from ..sampling import SamplingParams  # the one per-request type (validated; kern_run/sampling.py)

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
        ("logprobs", params.logprobs, f"logprobs {params.top_logprobs}", "none"),
    )
    for field, bad, what, want in checks:
        if bad:
            return field, (f"{what} needs GPU sampling, which this engine does not have yet (issue 26: batched "
                           f"decode and sampling); it decodes greedily: send {field} {want} or leave it out")
    return None
