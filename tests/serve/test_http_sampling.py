"""The HTTP layer with an engine that samples (the fake engine's samples mode): sampling parameters pass, a
seeded request gives the same text alone and among others, logprobs in both response shapes, streaming and
not, and the refusals that remain."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from kern_run.serve.logprobs import NOT_FINITE, LogprobsBuilder
from kern_run.serve.sampling import SamplingParams
from serve_testutil import CharCodec, served

CHAT = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}<assistant>"


@pytest.fixture
def srv():
    s = served(chat_template=CHAT, samples=True, max_queue=64, max_seqs=16, pages=400)
    yield s
    s.loop.stop()


def call(s, method, path, body=None):
    async def go():
        transport = httpx.ASGITransport(app=s.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://kern") as client:
            return await client.request(method, path, json=body)
    return asyncio.run(go())


def sse_events(resp):
    lines = [line for line in resp.text.split("\n") if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_a_seeded_sampled_completion_equals_the_engine_alone(srv):
    sp = SamplingParams(temperature=0.9, top_p=0.8, top_k=50, min_p=0.05, repetition_penalty=1.1, seed=99)
    want, tokens = srv.reference_text("sample me", 16, sp)
    body = {"model": "tiny", "prompt": "sample me", "max_tokens": 16, "temperature": 0.9, "top_p": 0.8, "top_k": 50,
            "min_p": 0.05, "repetition_penalty": 1.1, "seed": 99}
    resp = call(srv, "POST", "/v1/completions", body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["text"] == want
    assert want != srv.reference_text("sample me", 16)[0]  # not the greedy text


def test_a_seeded_request_gives_the_same_text_under_load(srv):
    seeded = {"model": "tiny", "prompt": "the same", "max_tokens": 20, "temperature": 1.0, "seed": 5,
              "ignore_eos": True}

    async def go():
        transport = httpx.ASGITransport(app=srv.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://kern") as client:
            alone = await client.post("/v1/completions", json=seeded)
            # decode steps of 20 ms from here: the 21 requests below are all admitted while the first ones still
            # run, however slow the machine (an instant fake step let each finish before the next arrived on CI)
            srv.rig.engine.step_s = 0.02
            others = [client.post("/v1/completions", json={"model": "tiny", "prompt": f"other {i}", "max_tokens": 15,
                                                           "temperature": 0.7, "seed": i, "ignore_eos": True})
                      for i in range(20)]
            loaded = await asyncio.gather(*others[:10], client.post("/v1/completions", json=seeded), *others[10:])
            return alone, loaded

    alone, loaded = asyncio.run(go())
    assert alone.status_code == 200 and all(r.status_code == 200 for r in loaded)
    assert loaded[10].json()["choices"][0]["text"] == alone.json()["choices"][0]["text"]
    assert max(srv.rig.engine.rows_seen) > 1  # it did share steps


def test_completion_logprobs(srv):
    sp = SamplingParams(logprobs=True, top_logprobs=3)
    ref = srv.rig.engine.reference_sampled(CharCodec().encode("lp"), 6, frozenset(), sp)
    resp = call(srv, "POST", "/v1/completions", {"model": "tiny", "prompt": "lp", "max_tokens": 6, "logprobs": 3,
                                                 "ignore_eos": True})
    lp = resp.json()["choices"][0]["logprobs"]
    codec = CharCodec()
    assert lp["tokens"] == [codec.decode([s.token_id]) for s in ref]
    assert lp["token_logprobs"] == [s.logprob for s in ref]
    assert lp["top_logprobs"] == [{codec.decode([t]): v for t, v in s.top_logprobs} for s in ref]
    assert lp["text_offset"] == list(range(6))  # one letter per token
    assert all(len(d) == 3 for d in lp["top_logprobs"])


def test_chat_logprobs_streaming_and_not(srv):
    msgs = [{"role": "user", "content": "hi"}]
    body = {"model": "tiny", "messages": msgs, "max_tokens": 5, "logprobs": True, "top_logprobs": 2,
            "ignore_eos": True}
    whole = call(srv, "POST", "/v1/chat/completions", body).json()
    content = whole["choices"][0]["logprobs"]["content"]
    assert len(content) == 5 and all(len(c["top_logprobs"]) == 2 for c in content)
    assert "".join(c["token"] for c in content) == whole["choices"][0]["message"]["content"]
    assert content[0]["bytes"] == list(content[0]["token"].encode())
    events = sse_events(call(srv, "POST", "/v1/chat/completions", {**body, "stream": True}))
    streamed = [c for e in events for ch in e["choices"] if ch.get("logprobs") for c in ch["logprobs"]["content"]]
    assert streamed == content  # every token's entry, each in the chunk of its token
    plain = call(srv, "POST", "/v1/chat/completions", {**body, "logprobs": False}).json()
    assert plain["choices"][0]["logprobs"] is None


def test_top_logprobs_beyond_the_engine_are_refused():
    s = served(samples=True, max_top_logprobs=2, chat_template=CHAT)
    try:
        resp = call(s, "POST", "/v1/completions", {"model": "tiny", "prompt": "x", "logprobs": 3})
        assert resp.status_code == 400
        assert (resp.json()["error"]["param"], resp.json()["error"]["code"]) == ("logprobs", "unsupported_sampling")
        resp = call(s, "POST", "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                                                        "logprobs": True, "top_logprobs": 5})
        assert resp.json()["error"]["param"] == "top_logprobs"
        ok = call(s, "POST", "/v1/completions", {"model": "tiny", "prompt": "x", "logprobs": 2, "max_tokens": 2})
        assert ok.status_code == 200 and len(ok.json()["choices"][0]["logprobs"]["tokens"]) == 2
    finally:
        s.loop.stop()


@pytest.mark.parametrize("body, param", [
    ({"temperature": 2.5}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_k": -2}, "top_k"),
    ({"min_p": 1.5}, "min_p"), ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"presence_penalty": 3}, "presence_penalty"), ({"seed": -1}, "seed"), ({"logprobs": 21}, "logprobs"),
])
def test_out_of_range_sampling_values_are_still_refused(srv, body, param):
    resp = call(srv, "POST", "/v1/completions", {"model": "tiny", "prompt": "x", **body})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == param
    assert resp.json()["error"]["code"] == "invalid_value"


def test_logprobs_that_are_not_finite_become_minus_9999():
    b = LogprobsBuilder(CharCodec(), chat=False)
    b.add(1, -math.inf, [(1, -0.5), (2, -math.inf)])
    out = b.take()
    assert out.token_logprobs == [NOT_FINITE] and out.top_logprobs == [{"B": -0.5, "C": NOT_FINITE}]
    assert json.loads(out.model_dump_json())["token_logprobs"] == [-9999.0]
