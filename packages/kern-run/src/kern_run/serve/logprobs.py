"""Log-probabilities in OpenAI's two response shapes, built token by token as the engine returns them.

The engine gives, per generated token, the sampler's log-probability of it and (when asked) the most probable
tokens with theirs (engine.Sampled). A token's text is `codec.decode([id])` alone. Logprobs that are not finite
(a token outside the sampler's kept set has -inf) are reported as -9999.0, as vLLM does, since JSON has no
infinities. The EOS token that ends a request is not listed (its text is not shown either).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from .protocol import ChatLogprobs, CompletionLogprobs, TokenLogprob, TopLogprob

NOT_FINITE = -9999.0


def _finite(value: float) -> float:
    return value if math.isfinite(value) else NOT_FINITE


class LogprobsBuilder:
    """Collects one request's per-token logprobs; `take()` returns (and forgets) those added since the last take,
    in the request's shape: `CompletionLogprobs` (`chat` False) or `ChatLogprobs`."""

    def __init__(self, codec: Any, chat: bool) -> None:
        self.codec = codec
        self.chat = chat
        self.offset = 0
        self._pending: list[tuple[int, float, Sequence[tuple[int, float]]]] = []

    def add(self, token_id: int, logprob: float | None, top: Sequence[tuple[int, float]]) -> None:
        self._pending.append((token_id, _finite(logprob if logprob is not None else NOT_FINITE), top))

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def _text(self, token_id: int) -> str:
        return self.codec.decode([token_id])

    def take(self) -> CompletionLogprobs | ChatLogprobs:
        entries, self._pending = self._pending, []
        if self.chat:
            content = []
            for token_id, lp, top in entries:
                text = self._text(token_id)
                alts = [TopLogprob(token=(t := self._text(i)), logprob=_finite(v), bytes=list(t.encode()))
                        for i, v in top]
                content.append(TokenLogprob(token=text, logprob=lp, bytes=list(text.encode()), top_logprobs=alts))
            return ChatLogprobs(content=content)
        out = CompletionLogprobs()
        for token_id, lp, top in entries:
            text = self._text(token_id)
            out.tokens.append(text)
            out.token_logprobs.append(lp)
            alts: dict[str, float] = {}
            for i, v in top:
                alts.setdefault(self._text(i), _finite(v))
            out.top_logprobs.append(alts)
            out.text_offset.append(self.offset)
            self.offset += len(text)
        return out
