"""What an engine without GPU sampling accepts of a request's `kern_run.sampling.SamplingParams`.

A manifest whose decode program ends with the GPU sampler says so in `meta.caller.sampling` (sampling_io.py),
and its engine serves every parameter. One without it (every manifest built before issue 26, or with the
argmax sampler) decodes by argmax: `greedy_only_fault` is how that engine refuses the rest (penalties and
logprobs included: the argmax applies none and reads back only the token).
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
            return field, (f"{what} needs GPU sampling, which this manifest's decode program lacks (no "
                           f"meta.caller.sampling: it decodes by argmax); send {field} {want} or leave it out, or "
                           "serve a manifest built with the GPU sampler")
    return None
