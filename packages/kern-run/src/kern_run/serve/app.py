"""The FastAPI application: OpenAI endpoints over a `ServeLoop`, thin (parse, check, submit, stream).

Endpoints: `POST /v1/completions`, `POST /v1/chat/completions` (streaming as SSE ending in `data: [DONE]`, or
one JSON body), `GET /v1/models`, `GET /health`, `GET /metrics`. With an API key, the `/v1/` routes need
`Authorization: Bearer KEY` (401 otherwise); /health and /metrics stay open, as vLLM's do.

Every refusal is an OpenAI error body `{"error": {"message", "type", "param", "code"}}` with a 4xx status,
and the server keeps serving: invalid JSON, a body that does not validate (the field path in `param`), an
unknown model (404), a prompt longer than the context, sampling values the engine cannot honour, more requests
in flight than `max_queue` (429). An engine fault answers the requests of its step with a 500 and turns
/health to 503. A client that disconnects cancels its request (its pages return at the next step boundary).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from .chat_template import ChatTemplate
from .logprobs import LogprobsBuilder
from .errors import BadRequest, NotFound, Overloaded, ServeError, Unauthorized, Unavailable
from .loop import Failed, ServeLoop, Submission, Token
from .metrics import CONTENT_TYPE
from .protocol import (
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse,
    CompletionChoice, CompletionRequest, CompletionResponse, Delta, ModelCard, ModelList, SamplingFields, Usage,
)
from .sampling import greedy_only_fault
from .stops import StopMatcher

DISCONNECT_POLL_S = 0.25  # how often a non-streaming request checks whether its client left (seconds)


class Codec(Protocol):
    """Text <-> token ids (kern_run.text.TextCodec)."""

    eos_ids: frozenset[int]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass(frozen=True)
class AppConfig:
    """`model`: the served model's name (requests must name it); `max_context`: positions one sequence holds;
    `max_queue`: requests in flight at most (waiting or running); `api_key`: None for no authentication;
    `vocab_size`: token ids of a token-id prompt must be below it (None: unchecked); `samples`: whether the
    engine honours non-greedy sampling and logprobs; `max_top_logprobs`: the most top logprobs per token it gives
    (with `samples`); `drain_s`: seconds shutdown waits for requests in flight."""

    model: str
    max_context: int
    max_queue: int = 256
    api_key: str | None = None
    vocab_size: int | None = None
    samples: bool = False
    max_top_logprobs: int = 20
    drain_s: float = 30.0


@dataclass(frozen=True)
class Prepared:
    ids: list[int]
    max_tokens: int
    stops: tuple[str, ...]
    stop_ids: frozenset[int]


def error_response(exc: ServeError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list"})  # a union member's tag in a pydantic loc


def _param(loc: tuple[Any, ...]) -> str:
    """The field path of a pydantic error location (`messages[0].role`, `stream_options.include_usage`), without
    the tags pydantic adds for union members and validators (`str`, `list[int]`, `function-after[...]`). A field
    whose name merely starts like a tag (`stream`) is kept."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not (part in _TYPE_TAGS or "[" in str(part) or str(part).startswith("function-")):
            out += f".{part}" if out else str(part)
    return out


async def _parse(request: Request, model: type[SamplingFields]) -> Any:
    raw = await request.body()
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(obj, dict):
        raise BadRequest(f"the request body must be a JSON object, got {type(obj).__name__}", code="invalid_json")
    try:
        # strict: a value of the wrong JSON type is refused, not coerced (lax pydantic took `"max_tokens": true` as
        # 1, `"stream": "yes"` as true and a prompt `[true, false]` as the token ids [1, 0]); an int is still a float
        return model.model_validate(obj, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = _param(tuple(first["loc"]))
        raise BadRequest(f"{param or 'body'}: {first['msg']} (got {_shown(first.get('input'))})", param=param or None,
                         code="invalid_value") from None


SHOWN_CHARS = 200  # of an offending value in an error message (a missing field's "input" is the whole body)


def _shown(value: object) -> str:
    """repr(value), cut to SHOWN_CHARS characters with the length said, so an error message stays small whatever
    the request held."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text)} characters)"


def create_app(loop: ServeLoop, cfg: AppConfig, codec: Codec, chat_template: ChatTemplate | None,
               on_shutdown: Callable[[], None] | None = None) -> FastAPI:
    """The application over a started (or to-be-started) `loop`. Shutdown (lifespan end, e.g. uvicorn's after
    SIGTERM) drains the requests in flight for up to `cfg.drain_s`, then stops the loop and calls `on_shutdown`."""
    req_ids = itertools.count(1)
    metrics = loop.metrics

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(loop.drain, cfg.drain_s)
        loop.stop()
        if on_shutdown is not None:
            on_shutdown()

    app = FastAPI(title="kern serve", lifespan=lifespan)

    @app.exception_handler(ServeError)
    async def _serve_error(request: Request, exc: ServeError) -> JSONResponse:
        return error_response(exc)

    def authorize(request: Request) -> None:
        if cfg.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or key.strip() != cfg.api_key:
            raise Unauthorized("missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                               code="invalid_api_key")

    def check_model(req: SamplingFields) -> None:
        field = req.unsupported_field()
        if field is not None:
            raise BadRequest(f"{field} is not supported by kern serve: leave it out", param=field,
                             code="unsupported_parameter")
        if req.model != cfg.model:
            raise NotFound(f"the model {req.model!r} does not exist: this server serves {cfg.model!r}",
                           param="model", code="model_not_found")

    def check_common(req: SamplingFields, ids: list[int], limit: int | None, param: str,
                     logprobs: int | None, top_param: str) -> Prepared:
        n = len(ids)
        if n == 0:
            raise BadRequest("the prompt is empty (0 tokens)", param=param, code="empty_prompt")
        if n > cfg.max_context:
            raise BadRequest(f"the prompt is {n} tokens; this model's context holds {cfg.max_context}",
                             param=param, code="context_length_exceeded")
        if not cfg.samples:
            fault = greedy_only_fault(req.sampling(logprobs))
            if fault is not None:
                raise BadRequest(fault[1], param=fault[0], code="unsupported_sampling")
        elif logprobs is not None and logprobs > cfg.max_top_logprobs:
            raise BadRequest(f"{top_param} {logprobs}: this engine gives at most {cfg.max_top_logprobs} top logprobs "
                             "per token (the manifest's top-logprobs program)", param=top_param,
                             code="unsupported_sampling")
        room = cfg.max_context - n + 1
        max_tokens = room if limit is None else min(limit, room)
        stop_ids = frozenset() if req.ignore_eos else codec.eos_ids
        return Prepared(ids, max_tokens, req.stop_strings(), stop_ids)

    def open_request(prep: Prepared, req: SamplingFields, logprobs: int | None) -> tuple[int, asyncio.Queue[Any]]:
        """Submit a checked request to the loop: (its id, the queue its events arrive on). Raises Unavailable
        (unhealthy or shutting down) or Overloaded (`max_queue` in flight), the last checks before it runs."""
        if not loop.healthy:
            raise Unavailable(loop.fault or "the server is unhealthy", code="unavailable")
        if not loop.try_reserve(cfg.max_queue):
            raise Overloaded(f"{loop.in_flight} requests are in flight, the most this server takes "
                             f"(--max-queue {cfg.max_queue}): retry later", code="too_many_requests")
        queue: asyncio.Queue[Token | Failed] = asyncio.Queue()
        aio = asyncio.get_running_loop()
        req_id = next(req_ids)

        def deliver(ev: Token | Failed) -> None:  # on the scheduler thread
            try:
                aio.call_soon_threadsafe(queue.put_nowait, ev)
            except RuntimeError:  # the event loop is closed: nobody is listening any more
                pass

        loop.submit(Submission(req_id, prep.ids, prep.max_tokens, req.sampling(logprobs), prep.stop_ids, deliver))
        return req_id, queue

    async def events(request: Request, req_id: int, queue: asyncio.Queue[Any],
                     streaming: bool) -> AsyncIterator[Token | Failed]:
        """The request's tokens (then its end) from the loop; cancels it when the consumer stops early (a stop
        string, a client gone: a streaming response is cancelled by Starlette, a non-streaming one polls)."""
        done = False
        checked = time.monotonic()
        try:
            while True:
                if streaming:
                    ev = await queue.get()
                else:
                    try:
                        ev = await asyncio.wait_for(queue.get(), DISCONNECT_POLL_S)
                    except asyncio.TimeoutError:
                        ev = None
                    if time.monotonic() - checked >= DISCONNECT_POLL_S:
                        checked = time.monotonic()
                        if await request.is_disconnected():
                            return
                    if ev is None:
                        continue
                if isinstance(ev, Failed) or ev.finish is not None:
                    done = True
                yield ev
                if done:
                    return
        finally:
            if not done:
                loop.cancel(req_id)

    def advance(matcher: StopMatcher, ev: Token) -> tuple[str, str | None]:
        """(text to emit, finish reason or None) after token `ev`."""
        text, stopped = matcher.push(ev.token_id, eos=ev.finish == "stop")
        if not stopped and ev.finish is not None:
            tail, stopped = matcher.flush()
            text += tail
        return text, "stop" if stopped else ev.finish

    async def collect(request: Request, prep: Prepared, req: SamplingFields, logprobs: int | None,
                      chat: bool) -> tuple[str, str, int, Any]:
        """(text, finish_reason, completion tokens, logprobs or None) of a non-streaming request."""
        req_id, queue = open_request(prep, req, logprobs)
        matcher = StopMatcher(codec, prep.stops)
        lps = LogprobsBuilder(codec, chat) if logprobs is not None else None
        parts: list[str] = []
        count = 0
        finish: str | None = None
        gen = events(request, req_id, queue, streaming=False)
        try:
            async for ev in gen:
                if isinstance(ev, Failed):
                    raise ev.error
                count += 1
                if lps is not None and not (ev.finish == "stop" and ev.token_id in prep.stop_ids):
                    lps.add(ev.token_id, ev.logprob, ev.top_logprobs)
                text, finish = advance(matcher, ev)
                parts.append(text)
                if finish is not None:
                    break
        finally:
            await gen.aclose()
        return "".join(parts), finish or "length", count, lps.take() if lps is not None else None

    def sse(obj: Any) -> str:
        data = obj if isinstance(obj, str) else obj.model_dump_json()
        return f"data: {data}\n\n"

    def stream(request: Request, prep: Prepared, req: SamplingFields, logprobs: int | None, chat: bool,
               chunk: Callable[[str, str | None, Usage | None, Any], Any], first: Any | None) -> StreamingResponse:
        """An SSE response: `first` (if any), a chunk per piece of text (or per token, when logprobs are asked:
        each chunk carries the logprobs of the tokens since the last), the finish chunk, a usage chunk (no
        choices), `data: [DONE]`. An engine fault mid-stream sends the error body as an event, then [DONE]."""
        req_id, queue = open_request(prep, req, logprobs)

        async def body() -> AsyncIterator[str]:
            matcher = StopMatcher(codec, prep.stops)
            lps = LogprobsBuilder(codec, chat) if logprobs is not None else None
            count = 0
            gen = events(request, req_id, queue, streaming=True)
            if first is not None:
                yield sse(first)
            try:
                async for ev in gen:
                    if isinstance(ev, Failed):
                        yield sse(json.dumps(ev.error.body()))
                        break
                    count += 1
                    if lps is not None and not (ev.finish == "stop" and ev.token_id in prep.stop_ids):
                        lps.add(ev.token_id, ev.logprob, ev.top_logprobs)
                    text, finish = advance(matcher, ev)
                    if text or finish is not None or (lps is not None and lps.pending):
                        yield sse(chunk(text, finish, None, lps.take() if lps is not None else None))
                    if finish is not None:
                        yield sse(chunk("", None, Usage.of(len(prep.ids), count), None))
                        break
            finally:
                await gen.aclose()
            yield "data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        authorize(request)
        req = await _parse(request, CompletionRequest)
        check_model(req)
        ids = list(req.prompt) if isinstance(req.prompt, list) else codec.encode(req.prompt)
        if isinstance(req.prompt, list) and cfg.vocab_size is not None and max(ids) >= cfg.vocab_size:
            raise BadRequest(f"token id {max(ids)} in the prompt is outside the vocabulary (0..{cfg.vocab_size - 1})",
                             param="prompt", code="invalid_value")
        prep = check_common(req, ids, req.max_tokens, "prompt", req.logprobs, "logprobs")
        rid = f"cmpl-{next(req_ids)}"
        if req.stream:
            def chunk(text: str, finish: str | None, usage: Usage | None, lps: Any) -> CompletionResponse:
                choices = [] if usage is not None else [CompletionChoice(text=text, finish_reason=finish,
                                                                         logprobs=lps)]
                return CompletionResponse(id=rid, model=cfg.model, choices=choices, usage=usage)

            return stream(request, prep, req, req.logprobs, False, chunk, None)
        text, finish, count, lps = await collect(request, prep, req, req.logprobs, False)
        return JSONResponse(CompletionResponse(id=rid, model=cfg.model,
                                               choices=[CompletionChoice(text=text, finish_reason=finish,
                                                                         logprobs=lps)],
                                               usage=Usage.of(len(ids), count)).model_dump())

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        authorize(request)
        req = await _parse(request, ChatCompletionRequest)
        check_model(req)
        if chat_template is None:
            raise BadRequest(f"the model {cfg.model!r} has no chat template (tokenizer_config.json chat_template): "
                             "use /v1/completions", param="messages", code="no_chat_template")
        messages = [{"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})}
                    for m in req.messages]
        text = chat_template.render(messages, req.add_generation_prompt, **(req.chat_template_kwargs or {}))
        ids = codec.encode(text)
        prep = check_common(req, ids, req.token_limit(), "messages", req.wanted_logprobs(), "top_logprobs")
        rid = f"chatcmpl-{next(req_ids)}"
        if req.stream:
            def chunk(text: str, finish: str | None, usage: Usage | None, lps: Any) -> ChatCompletionChunk:
                choices = [] if usage is not None else [ChatChunkChoice(delta=Delta(content=text),
                                                                        finish_reason=finish, logprobs=lps)]
                return ChatCompletionChunk(id=rid, model=cfg.model, choices=choices, usage=usage)

            first = ChatCompletionChunk(id=rid, model=cfg.model,
                                        choices=[ChatChunkChoice(delta=Delta(role="assistant", content=""))])
            return stream(request, prep, req, req.wanted_logprobs(), True, chunk, first)
        out, finish, count, lps = await collect(request, prep, req, req.wanted_logprobs(), True)
        return JSONResponse(ChatCompletionResponse(
            id=rid, model=cfg.model, choices=[ChatChoice(message=AssistantMessage(content=out), finish_reason=finish,
                                                         logprobs=lps)],
            usage=Usage.of(len(ids), count)).model_dump())

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        authorize(request)
        return JSONResponse(ModelList(data=[ModelCard(id=cfg.model, max_model_len=cfg.max_context)]).model_dump())

    @app.get("/health")
    async def health() -> Response:
        if loop.healthy:
            return JSONResponse({"status": "ok", "in_flight": loop.in_flight})
        return JSONResponse({"status": "unhealthy", "error": loop.fault}, status_code=503)

    @app.get("/metrics")
    async def metrics_text() -> Response:
        return Response(metrics.text(), media_type=CONTENT_TYPE)

    app.state.started = time.time()
    return app
