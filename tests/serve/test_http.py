"""The HTTP layer against the fake engine (httpx over the ASGI app, no sockets): every error path, streaming
and not, chat templates, /metrics, the API key, engine faults and client disconnects."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

httpx = pytest.importorskip("httpx")  # the dev group has it; the GPU machines may not (their -m gpu run collects this)
pytest.importorskip("fastapi")

from serve_testutil import served

CHAT = ("{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
        "{{ raise_exception('the system message must come first') }}{% endif %}"
        "<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture
def srv():
    s = served(chat_template=CHAT)
    yield s
    s.loop.stop()


def call(s, method, path, body=None, raw=None, headers=None):
    async def go():
        transport = httpx.ASGITransport(app=s.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://kern") as client:
            if raw is not None:
                return await client.request(method, path, content=raw, headers=headers)
            return await client.request(method, path, json=body, headers=headers)
    return asyncio.run(go())


def sse_events(resp):
    lines = [line for line in resp.text.split("\n") if line]
    assert all(line.startswith("data: ") for line in lines), lines
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_completion_matches_the_engine_alone(srv):
    want, tokens = srv.reference_text("hello world", 12)
    resp = call(srv, "POST", "/v1/completions", {"model": "tiny", "prompt": "hello world", "max_tokens": 12})
    assert resp.status_code == 200
    body = resp.json()
    assert body["object"] == "text_completion" and body["model"] == "tiny"
    assert body["choices"][0]["text"] == want
    assert body["choices"][0]["finish_reason"] == ("stop" if tokens[-1] == 999 else "length")
    assert body["usage"] == {"prompt_tokens": 11, "completion_tokens": len(tokens), "total_tokens": 11 + len(tokens)}


def test_completion_with_token_ids(srv):
    tokens = srv.rig.engine.reference([5, 6, 7], 4, frozenset({999}))
    resp = call(srv, "POST", "/v1/completions", {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 4})
    assert resp.json()["choices"][0]["text"] == srv.codec.decode(tokens)
    assert resp.json()["usage"]["prompt_tokens"] == 3


def test_streaming_completion(srv):
    want, tokens = srv.reference_text("stream me", 10)
    resp = call(srv, "POST", "/v1/completions", {"model": "tiny", "prompt": "stream me", "max_tokens": 10,
                                                 "stream": True})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    events = sse_events(resp)
    text = "".join(c["text"] for e in events for c in e["choices"])
    assert text == want
    finishes = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    assert finishes == ["length"]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 10


def test_chat_renders_the_template(srv):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    prompt = "<system>be brief\n<user>hi\n<assistant>"
    want, tokens = srv.reference_text(prompt, 6)
    resp = call(srv, "POST", "/v1/chat/completions", {"model": "tiny", "messages": msgs, "max_tokens": 6})
    body = resp.json()
    assert resp.status_code == 200, body
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": want}
    assert body["usage"]["prompt_tokens"] == len(prompt)


def test_streaming_chat(srv):
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}]
    want, _ = srv.reference_text("<user>hi there\n<assistant>", 5)
    resp = call(srv, "POST", "/v1/chat/completions", {"model": "tiny", "messages": msgs, "max_completion_tokens": 5,
                                                      "stream": True})
    events = sse_events(resp)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert "".join(c["delta"]["content"] or "" for e in events[1:] for c in e["choices"]) == want
    assert events[-1]["usage"]["completion_tokens"] == 5


def test_stop_string_cuts_the_text_and_cancels(srv):
    want, _ = srv.reference_text("abc", 30)
    stop = want[6:9]
    cut = want.index(stop)
    resp = call(srv, "POST", "/v1/completions", {"model": "tiny", "prompt": "abc", "max_tokens": 30, "stop": stop})
    body = resp.json()
    assert body["choices"][0]["text"] == want[:cut]
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == cut + len(stop)  # one letter per token
    deadline = time.monotonic() + 2
    while srv.loop.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert srv.loop.in_flight == 0


def test_models_health_metrics(srv):
    models = call(srv, "GET", "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"] and models["data"][0]["max_model_len"] == 256
    assert call(srv, "GET", "/health").json()["status"] == "ok"
    call(srv, "POST", "/v1/completions", {"model": "tiny", "prompt": "hello", "max_tokens": 3, "ignore_eos": True})
    call(srv, "POST", "/v1/completions", {"model": "tiny", "prompt": "hello", "max_tokens": 3, "ignore_eos": True})
    text = call(srv, "GET", "/metrics").text
    for line in ('kern_requests_total{finish="length"} 2.0', "kern_ttft_seconds_count 2.0",
                 "kern_tpot_seconds_count 4.0", "kern_prefix_lookup_tokens_total 10.0",
                 "kern_prefix_reused_tokens_total 0.0", "kern_queue_depth 0.0", "kern_running_rows 0.0",
                 "kern_kv_pages_in_use 1.0", "kern_parks_total 0.0", "kern_wakes_total 0.0", "kern_healthy 1.0",
                 "kern_prefix_hit_rate 0.0"):
        assert line in text, line


@pytest.mark.parametrize("body, status, param, code", [
    ({"model": "other", "prompt": "x"}, 404, "model", "model_not_found"),
    ({"model": "tiny", "prompt": "x" * 257}, 400, "prompt", "context_length_exceeded"),
    ({"model": "tiny", "prompt": ""}, 400, "prompt", "empty_prompt"),
    ({"model": "tiny", "prompt": [1, 900]}, 400, "prompt", "invalid_value"),
    ({"model": "tiny", "prompt": "x", "max_tokens": 0}, 400, "max_tokens", "invalid_value"),
    ({"model": "tiny", "prompt": "x", "max_tokens": -3}, 400, "max_tokens", "invalid_value"),
    ({"model": "tiny", "prompt": "x", "temperature": 2.5}, 400, "temperature", "invalid_value"),
    ({"model": "tiny", "prompt": "x", "top_p": 0}, 400, "top_p", "invalid_value"),
    ({"model": "tiny", "prompt": "x", "top_k": -2}, 400, "top_k", "invalid_value"),
    ({"model": "tiny", "prompt": "x", "seed": "abc"}, 400, "seed", "invalid_value"),
    ({"model": "tiny", "prompt": "x", "n": 2}, 400, "n", "invalid_value"),
    ({"model": "tiny", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "invalid_value"),
    ({"model": "tiny", "prompt": "x", "temperature": 0.7}, 400, "temperature", "unsupported_sampling"),
    ({"model": "tiny", "prompt": "x", "top_p": 0.9}, 400, "top_p", "unsupported_sampling"),
    ({"model": "tiny", "prompt": "x", "logprobs": 2}, 400, "logprobs", "unsupported_sampling"),
    ({"model": "tiny"}, 400, "prompt", "invalid_value"),
    ({"model": "tiny", "prompt": "x", "echo": True}, 400, "echo", "unsupported_parameter"),
    ({"model": "tiny", "prompt": "x", "logit_bias": {"5": 100}}, 400, "logit_bias", "unsupported_parameter"),
    ({"model": "tiny", "prompt": "x", "best_of": 3}, 400, "best_of", "unsupported_parameter"),
    # the wrong JSON type is refused, not coerced (lax validation served these as 1 token, a stream, ids [1, 0])
    ({"model": "tiny", "prompt": "x", "max_tokens": True}, 400, "max_tokens", "invalid_value"),
    ({"model": "tiny", "prompt": "x", "max_tokens": 3.0}, 400, "max_tokens", "invalid_value"),
    ({"model": "tiny", "prompt": "x", "stream": "yes"}, 400, "stream", "invalid_value"),
    ({"model": "tiny", "prompt": "x", "ignore_eos": 1}, 400, "ignore_eos", "invalid_value"),
    ({"model": "tiny", "prompt": "x", "seed": "7"}, 400, "seed", "invalid_value"),
    ({"model": "tiny", "prompt": "x", "temperature": "0"}, 400, "temperature", "invalid_value"),
    ({"model": "tiny", "prompt": [True, False]}, 400, "prompt", "invalid_value"),
    ({"model": "tiny", "prompt": [1.0, 2.0]}, 400, "prompt", "invalid_value"),
    # the whole path of a nested field (it was cut to "include_usage": every part starting with "str" was dropped)
    ({"model": "tiny", "prompt": "x", "stream": True, "stream_options": {"include_usage": "x"}}, 400,
     "stream_options.include_usage", "invalid_value"),
])
def test_completion_refusals(srv, body, status, param, code):
    resp = call(srv, "POST", "/v1/completions", body)
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert (err["param"], err["code"]) == (param, code)
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert call(srv, "GET", "/health").status_code == 200  # still serving
    ok = call(srv, "POST", "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 1})
    assert ok.status_code == 200


def test_a_refusal_quotes_at_most_200_characters_of_the_offending_value(srv):
    """A missing `model` made pydantic's "input" the whole body, quoted whole in the message (a 1 MB prompt gave a
    1 MB message)."""
    resp = call(srv, "POST", "/v1/completions", {"prompt": "x" * 100_000})
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["param"] == "model" and len(err["message"]) < 400, len(err["message"])
    assert err["message"].endswith("... (100014 characters))")  # repr of {"prompt": 100000 x}: 100014
    resp = call(srv, "POST", "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": "12"})
    assert resp.json()["error"]["message"].endswith("(got '12')")  # a short value is quoted whole


def test_greedy_parameters_are_accepted_by_a_greedy_engine(srv):
    resp = call(srv, "POST", "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 2, "temperature": 0,
                                                 "top_p": 1, "top_k": -1, "seed": 7, "echo": False, "best_of": 1,
                                                 "user": "someone", "logit_bias": None})
    assert resp.status_code == 200


def test_invalid_json(srv):
    resp = call(srv, "POST", "/v1/completions", raw=b"{not json", headers={"content-type": "application/json"})
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "invalid_json" and resp.json()["error"]["type"] == "invalid_request_error"
    resp = call(srv, "POST", "/v1/completions", raw=b"[1, 2]", headers={"content-type": "application/json"})
    assert resp.status_code == 400 and "JSON object" in resp.json()["error"]["message"]


def test_chat_tools_are_refused_not_ignored(srv):
    resp = call(srv, "POST", "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                                                      "tools": [{"type": "function", "function": {"name": "f"}}]})
    assert resp.status_code == 400
    assert (resp.json()["error"]["param"], resp.json()["error"]["code"]) == ("tools", "unsupported_parameter")


@pytest.mark.parametrize("messages, param, code", [
    ([], "messages", "invalid_value"),
    ([{"role": "robot", "content": "x"}], "messages[0].role", "invalid_value"),
    ([{"role": "user", "content": "x"}, {"role": "system", "content": "late"}], "messages", "chat_template_refused"),
])
def test_chat_refusals(srv, messages, param, code):
    resp = call(srv, "POST", "/v1/chat/completions", {"model": "tiny", "messages": messages})
    assert resp.status_code == 400
    assert (resp.json()["error"]["param"], resp.json()["error"]["code"]) == (param, code)


def test_chat_without_a_template_is_refused():
    s = served()
    try:
        resp = call(s, "POST", "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}]})
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "no_chat_template"
    finally:
        s.loop.stop()


def test_more_requests_than_max_queue_get_429():
    s = served(max_queue=1)
    try:
        assert s.loop.try_reserve(1)  # one request in flight
        resp = call(s, "POST", "/v1/completions", {"model": "tiny", "prompt": "x"})
        assert resp.status_code == 429 and resp.json()["error"]["type"] == "rate_limit_error"
        resp = call(s, "POST", "/v1/completions", {"model": "tiny", "prompt": "x", "stream": True})
        assert resp.status_code == 429
    finally:
        s.loop.stop()


def test_api_key():
    s = served(api_key="sekrit")
    try:
        body = {"model": "tiny", "prompt": "x", "max_tokens": 1}
        for headers in (None, {"authorization": "Bearer nope"}, {"authorization": "sekrit"}):
            resp = call(s, "POST", "/v1/completions", body, headers=headers)
            assert resp.status_code == 401 and resp.json()["error"]["type"] == "authentication_error"
        assert call(s, "GET", "/v1/models").status_code == 401
        assert call(s, "POST", "/v1/completions", body, headers={"authorization": "Bearer sekrit"}).status_code == 200
        assert call(s, "GET", "/health").status_code == 200
    finally:
        s.loop.stop()


def test_an_engine_fault_fails_the_step_with_500_and_turns_health_red():
    s = served(fail_steps=frozenset({2}))
    try:
        resp = call(s, "POST", "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 5})
        assert resp.status_code == 500
        err = resp.json()["error"]
        assert err["type"] == "server_error" and err["code"] == "engine_error"
        assert "EngineFailure" in err["message"]
        health = call(s, "GET", "/health")
        assert health.status_code == 503 and health.json()["status"] == "unhealthy"
        again = call(s, "POST", "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 5})
        assert again.status_code == 503
        assert "kern_healthy 0.0" in call(s, "GET", "/metrics").text
        assert s.rig.pool.held_pages == 0
    finally:
        s.loop.stop()


def test_an_engine_fault_mid_stream_sends_the_error_then_done():
    s = served(fail_steps=frozenset({3}))
    try:
        resp = call(s, "POST", "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 5, "stream": True,
                                                   "ignore_eos": True})
        events = sse_events(resp)
        assert events[-1]["error"]["code"] == "engine_error"
        assert sum(len(e.get("choices", [])) for e in events[:-1]) == 2
    finally:
        s.loop.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_client_disconnect_cancels_and_frees_pages(stream):
    s = served(step_s=0.005)
    try:
        body = json.dumps({"model": "tiny", "prompt": "abcdefgh", "max_tokens": 200, "ignore_eos": True,
                           "stream": stream}).encode()

        async def go():
            sent = []
            leaves = []

            async def receive():  # as uvicorn's: the body, then (once the client left) http.disconnect at once
                if not leaves:
                    leaves.append(time.monotonic() + 0.05)  # the client leaves soon after sending
                    return {"type": "http.request", "body": body, "more_body": False}
                if time.monotonic() < leaves[0]:
                    await asyncio.sleep(leaves[0] - time.monotonic())
                return {"type": "http.disconnect"}

            async def send(message):
                sent.append(message)

            scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                     "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"",
                     "root_path": "", "headers": [(b"content-type", b"application/json")],
                     "client": ("127.0.0.1", 1), "server": ("kern", 80)}
            await asyncio.wait_for(s.app(scope, receive, send), 5)
            return sent

        asyncio.run(go())
        deadline = time.monotonic() + 3
        while (s.loop.in_flight or not s.rig.sched.idle) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert s.loop.in_flight == 0 and s.rig.sched.idle
        assert s.rig.engine.decode_calls < 150
        s.rig.sched.prefix.clear()
        assert s.rig.pool.held_pages == 0
        assert 'kern_requests_total{finish="cancelled"} 1.0' in s.loop.metrics.text().decode()
    finally:
        s.loop.stop()


def test_shutdown_drains_requests_in_flight():
    s = served(step_s=0.002)

    async def go():
        transport = httpx.ASGITransport(app=s.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://kern") as client:
            async with s.app.router.lifespan_context(s.app):
                task = asyncio.create_task(client.post("/v1/completions", json={
                    "model": "tiny", "prompt": "drain me", "max_tokens": 60, "ignore_eos": True}))
                await asyncio.sleep(0.05)
                assert s.loop.in_flight == 1
            return await task  # the lifespan's end waited for it

    resp = asyncio.run(go())
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 60
    assert s.loop.in_flight == 0 and not s.loop._thread.is_alive()


def test_shutdown_past_the_drain_timeout_ends_requests_with_503():
    s = served(step_s=0.01)

    async def go():
        transport = httpx.ASGITransport(app=s.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://kern") as client:
            s.loop.drain = lambda timeout_s: False  # the drain timeout has passed at once
            async with s.app.router.lifespan_context(s.app):
                task = asyncio.create_task(client.post("/v1/completions", json={
                    "model": "tiny", "prompt": "too long", "max_tokens": 250, "ignore_eos": True}))
                await asyncio.sleep(0.05)
            return await task

    resp = asyncio.run(go())
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "unavailable"
    assert s.loop.in_flight == 0 and s.rig.sched.idle


def test_chat_with_an_unknown_model_is_404_before_the_template(srv):
    resp = call(srv, "POST", "/v1/chat/completions", {"model": "gpt-4", "messages": [
        {"role": "user", "content": "x"}, {"role": "system", "content": "late"}]})
    assert resp.status_code == 404 and resp.json()["error"]["param"] == "model"


def test_a_scheduler_bug_fails_requests_with_500_and_the_loop_keeps_answering():
    s = served()
    try:
        def broken():
            raise RuntimeError("kern bug")

        s.rig.sched.schedule = broken
        resp = call(s, "POST", "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 2})
        assert resp.status_code == 500 and resp.json()["error"]["code"] == "scheduler_error"
        assert "RuntimeError: kern bug" in resp.json()["error"]["message"]
        assert call(s, "GET", "/health").status_code == 503
        assert call(s, "POST", "/v1/completions", {"model": "tiny", "prompt": "x"}).status_code == 503
        assert s.loop._thread.is_alive()
    finally:
        s.loop.stop()
