"""The OpenAI request and response models (pydantic), after the OpenAI API and vLLM's protocol.py.

Requests validate their ranges here, so every out-of-range value becomes one 400 naming the field
(app.py turns a `ValidationError` into `{"error": {..., "param": "<field path>"}}`). Unknown fields are
ignored, as the OpenAI API allows extra fields. The defaults keep kern's output reproducible: a request that
sends no sampling parameters is decoded greedily (temperature 0), not at OpenAI's temperature 1.
"""

from __future__ import annotations

import time
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .sampling import SamplingParams

INT64_MAX = (1 << 63) - 1


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="ignore")


# OpenAI request fields kern does not implement: refused with a 400 naming the field when given (not null), rather
# than ignored, since ignoring them would change what the client asked for. Other unknown fields are ignored.
UNSUPPORTED_FIELDS = ("echo", "suffix", "best_of", "logit_bias", "response_format", "tools", "tool_choice",
                      "functions", "function_call", "parallel_tool_calls", "prediction", "audio", "modalities")


class StreamOptions(OpenAIModel):
    include_usage: bool = True  # kern always sends the usage chunk; the field is accepted for compatibility


class SamplingFields(OpenAIModel):
    """The request fields both endpoints share: limits, sampling (issue 26's set), stop, seed, n."""

    model_config = ConfigDict(extra="allow")  # kept, so that `unsupported_field` can name what was sent

    model: str
    max_tokens: Optional[int] = Field(None, ge=1)  # None: up to the context
    temperature: Optional[float] = Field(None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(None, ge=-1)  # -1 and 0: off
    min_p: Optional[float] = Field(None, ge=0.0, le=1.0)
    repetition_penalty: Optional[float] = Field(None, gt=0.0, le=2.0)
    presence_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    seed: Optional[int] = Field(None, ge=0, le=INT64_MAX)
    stop: Optional[Union[str, list[str]]] = None
    n: int = Field(1, ge=1, le=1)  # one choice per request
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    ignore_eos: bool = False  # vLLM's extension: do not stop at the model's EOS ids

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value: Optional[Union[str, list[str]]]) -> Optional[Union[str, list[str]]]:
        stops = [value] if isinstance(value, str) else (value or [])
        if len(stops) > 4:
            raise ValueError(f"at most 4 stop strings, got {len(stops)}")
        if any(s == "" for s in stops):
            raise ValueError("a stop string must not be empty")
        return value

    def unsupported_field(self) -> str | None:
        """The first field of UNSUPPORTED_FIELDS the request gives a value (not null, false or 1 for best_of)."""
        extra = self.model_extra or {}
        for name in UNSUPPORTED_FIELDS:
            value = extra.get(name)
            if value is not None and value is not False and not (name == "best_of" and value == 1):
                return name
        return None

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def sampling(self, logprobs: Optional[int]) -> SamplingParams:
        """The engine's per-row parameters (unset fields: greedy / off); `logprobs`: the request's top
        log-probabilities per token (None: none asked)."""
        top_k = self.top_k if self.top_k is not None and self.top_k > 0 else 0
        return SamplingParams(
            temperature=0.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p, top_k=top_k,
            min_p=0.0 if self.min_p is None else self.min_p,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            presence_penalty=0.0 if self.presence_penalty is None else self.presence_penalty,
            frequency_penalty=0.0 if self.frequency_penalty is None else self.frequency_penalty,
            seed=self.seed, logprobs=logprobs is not None, top_logprobs=logprobs or 0)


class CompletionRequest(SamplingFields):
    """POST /v1/completions. `prompt`: text, or token ids; `logprobs`: top log-probabilities per token (0..20)."""

    prompt: Union[str, list[int]]
    logprobs: Optional[int] = Field(None, ge=0, le=20)

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: Union[str, list[int]]) -> Union[str, list[int]]:
        if isinstance(value, list) and (not value or any(t < 0 for t in value)):
            raise ValueError("a token-id prompt must be a non-empty list of ids >= 0")
        return value


class ContentPart(OpenAIModel):
    type: Literal["text"]
    text: str


class ChatMessage(OpenAIModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Optional[Union[str, list[ContentPart]]] = None
    name: Optional[str] = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions. `max_completion_tokens` is the newer name of `max_tokens` (either may be
    given); `logprobs` / `top_logprobs` (0..20) ask for log-probabilities."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)
    add_generation_prompt: bool = True  # vLLM's extension, passed to the template
    chat_template_kwargs: Optional[dict[str, object]] = None

    def token_limit(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def wanted_logprobs(self) -> Optional[int]:
        if not self.logprobs:
            return None
        return self.top_logprobs or 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> "Usage":
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens)


class CompletionLogprobs(BaseModel):
    """A completion choice's `logprobs` (the OpenAI legacy shape): per generated token its text, its logprob,
    the requested number of most probable alternatives (text -> logprob) and its offset in the text."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[str] = None


class _Response(BaseModel):
    """The fields every response body starts with, in this order (a subclass narrows `object` in place)."""

    id: str
    object: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str


class CompletionResponse(_Response):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    """A chat choice's `logprobs`: one entry per generated token (its text, logprob, UTF-8 bytes and the requested
    number of most probable alternatives)."""

    content: list[TokenLogprob] = Field(default_factory=list)
    refusal: None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[str] = None


class ChatCompletionResponse(_Response):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class Delta(BaseModel):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[str] = None


class ChatCompletionChunk(_Response):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: Optional[Usage] = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "kern"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
