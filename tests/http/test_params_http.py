"""Every request parameter, over HTTP: parsed, refused when bad, carried to the engine;
``n`` choices (plain and streamed) and the OpenAI logprobs shapes."""

from __future__ import annotations

import json
import math

import httpx
import pytest
import trio

from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.core.params import SamplingParams
from vllm_mlx_trio.errors import ExecutorCrashedError, InvalidRequestError
from vllm_mlx_trio.http.model_names import ServedNames
from vllm_mlx_trio.http.openai.choices_sse import ChoicesSseBody
from vllm_mlx_trio.http.openai.requests import parse_chat, parse_completion
from vllm_mlx_trio.http.openai.responses import ChoiceResult, ResponseBuilder
from vllm_mlx_trio.http.openai.routes import choice_params
from vllm_mlx_trio.messages import Accepted, RequestFailed, RequestId, RequestOutput, TokenLogprob
from vllm_mlx_trio.stream import RequestStream, Usage
from vllm_mlx_trio.testing.fake_executor import FakeExecutor, FakeTokenizer
from vllm_mlx_trio.testing.harness import FAKE_TEXT, fake_server
from vllm_mlx_trio.testing.polling import engine_idle, wait_until
from vllm_mlx_trio.testing.requests import chat_body

MODEL = "demo:tiny"
CHAT = [{"role": "user", "content": "hi"}]
TEXT = FAKE_TEXT  # what fake_server generates
TOKENIZER = FakeTokenizer()


def completion_body(**fields):
    return {"model": MODEL, "prompt": "Say:", **fields}


def sse_events(raw: str) -> list:
    """The JSON events of an SSE body, ``"[DONE]"`` kept as the string."""
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events), raw
    return [e[6:] if e == "data: [DONE]" else json.loads(e[6:]) for e in events]


async def post_stream(http, url, route, body) -> list:
    async with http.stream("POST", f"{url}/v1/{route}", json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        return sse_events((await resp.aread()).decode())


# -- parsing -------------------------------------------------------------------------------


def chat_params(**fields) -> SamplingParams:
    return parse_chat(chat_body(**fields), model_names=ServedNames((MODEL,)), max_n=8).params


def test_new_fields_are_parsed_into_sampling_params():
    params = chat_params(
        presence_penalty=0.5,
        frequency_penalty=-1,
        logit_bias={"7": 10, "300": -100.0},
        min_tokens=3,
        ignore_eos=True,
        stream_interval=4,
    )
    assert params.presence_penalty == 0.5 and params.frequency_penalty == -1.0
    assert params.logit_bias == ((7, 10.0), (300, -100.0))
    assert (params.min_tokens, params.ignore_eos, params.stream_interval) == (3, True, 4)
    assert params.logprobs is None
    defaults = chat_params()
    off = (defaults.logit_bias, defaults.min_tokens, defaults.ignore_eos, defaults.stream_interval)
    assert off == ((), 0, False, None)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [({}, None), ({"logprobs": False}, None), ({"logprobs": True}, 0), ({"logprobs": True, "top_logprobs": 5}, 5)],
)
def test_chat_logprobs_and_top_logprobs(fields, expected):
    assert chat_params(**fields).logprobs == expected


@pytest.mark.parametrize(("logprobs", "expected"), [(None, None), (0, 0), (5, 5)])
def test_completion_logprobs_is_the_number_of_alternatives(logprobs, expected):
    parsed = parse_completion(completion_body(logprobs=logprobs), model_names=ServedNames((MODEL,)), max_n=8)
    assert parsed.params.logprobs == expected


def test_n_goes_into_the_parsed_request_bounded_by_max_n():
    assert parse_chat(chat_body(), model_names=ServedNames((MODEL,)), max_n=8).n == 1
    assert parse_chat(chat_body(n=3), model_names=ServedNames((MODEL,)), max_n=8).n == 3
    assert parse_completion(completion_body(n=2), model_names=ServedNames((MODEL,)), max_n=2).n == 2
    with pytest.raises(InvalidRequestError) as caught:
        parse_completion(completion_body(n=3), model_names=ServedNames((MODEL,)), max_n=2)
    assert caught.value.param == "n"


def test_choice_seeds_are_seed_plus_index_wrapped_to_64_bits():
    params = SamplingParams(seed=41)
    assert [choice_params(params, i).seed for i in range(3)] == [41, 42, 43]
    assert choice_params(SamplingParams(), 2).seed is None
    top = SamplingParams(seed=2**63 - 1)
    assert choice_params(top, 1).seed == -(2**63)
    choice_params(top, 1).check(max_stop_sequences=4)  # still a valid seed


BAD_FIELDS = [
    # (route, extra fields, expected param); parse errors and admission's range errors alike
    ("chat", {"presence_penalty": "x"}, "presence_penalty"),
    ("chat", {"presence_penalty": 2.5}, "presence_penalty"),
    ("chat", {"frequency_penalty": -3}, "frequency_penalty"),
    ("chat", {"logit_bias": [1, 2]}, "logit_bias"),
    ("chat", {"logit_bias": {"abc": 1}}, "logit_bias"),
    ("chat", {"logit_bias": {"-1": 1}}, "logit_bias"),
    ("chat", {"logit_bias": {"1.5": 1}}, "logit_bias"),
    ("chat", {"logit_bias": {"5": "high"}}, "logit_bias"),
    ("chat", {"logit_bias": {"5": None}}, "logit_bias"),
    ("chat", {"logit_bias": {"5": 1, "05": 2}}, "logit_bias"),
    ("chat", {"logit_bias": {"5": 101}}, "logit_bias"),
    ("chat", {"logit_bias": {"999999": 1}}, "logit_bias"),  # outside the vocabulary
    ("chat", {"logit_bias": {str(i): 1 for i in range(2000)}}, "logit_bias"),
    ("chat", {"logprobs": 1}, "logprobs"),
    ("chat", {"top_logprobs": 2}, "top_logprobs"),
    ("chat", {"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("chat", {"min_tokens": -1}, "min_tokens"),
    ("chat", {"min_tokens": 10, "max_tokens": 5}, "min_tokens"),
    ("chat", {"min_tokens": 1.5}, "min_tokens"),
    ("chat", {"ignore_eos": "yes"}, "ignore_eos"),
    ("chat", {"stream_interval": 0}, "stream_interval"),
    ("chat", {"stream_interval": "2"}, "stream_interval"),
    ("chat", {"n": 0}, "n"),
    ("chat", {"n": 9}, "n"),
    ("chat", {"n": "2"}, "n"),
    (
        "chat",
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
        "response_format.json_schema",
    ),
    ("chat", {"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex"),
    ("completions", {"logprobs": 6}, "logprobs"),
    ("completions", {"logprobs": -1}, "logprobs"),
    ("completions", {"logprobs": True}, "logprobs"),
    ("completions", {"top_logprobs": 2}, "top_logprobs"),
    ("completions", {"n": 9}, "n"),
    ("completions", {"presence_penalty": 3}, "presence_penalty"),
]


async def test_bad_values_get_400_naming_the_param(fake_cfg):
    wrong = []
    with trio.fail_after(60):
        async with fake_server(fake_cfg) as srv, httpx.AsyncClient() as http:
            for route, fields, param in BAD_FIELDS:
                chat = route == "chat"
                body = chat_body(**fields) if chat else completion_body(**fields)
                resp = await http.post(f"{srv.url}/v1/{'chat/completions' if chat else 'completions'}", json=body)
                error = resp.json().get("error", {})
                if resp.status_code != 400 or error.get("param") != param:
                    wrong.append((route, str(fields)[:60], resp.status_code, error.get("param")))
            good = await http.post(f"{srv.url}/v1/chat/completions", json=chat_body())
            stats = srv.engine.statistics()
    assert wrong == []
    assert good.status_code == 200 and stats.num_requests == 0


async def test_every_field_reaches_the_engine(fake_cfg):
    executors: list[FakeExecutor] = []
    body = chat_body(
        presence_penalty=0.5,
        frequency_penalty=0.25,
        logit_bias={"40": 5},
        min_tokens=2,
        ignore_eos=True,
        stream_interval=3,
        logprobs=True,
        top_logprobs=4,
        max_tokens=6,
        seed=7,
    )
    with trio.fail_after(20):
        async with fake_server(fake_cfg, executors=executors) as srv, httpx.AsyncClient() as http:
            resp = await http.post(f"{srv.url}/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    [seq] = [s for plan in executors[0].plans for s in plan.new_seqs]
    expected = SamplingParams(
        max_tokens=6,
        seed=7,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        logit_bias=((40, 5.0),),
        min_tokens=2,
        ignore_eos=True,
        stream_interval=3,
        logprobs=4,
    )
    assert seq.params == expected


# -- n choices -----------------------------------------------------------------------------


@pytest.mark.parametrize("route", ["chat/completions", "completions"])
async def test_n_choices_non_streaming(fake_cfg, route):
    executors: list[FakeExecutor] = []
    fields = {"n": 3, "seed": 100}
    body = chat_body(**fields) if route.startswith("chat") else completion_body(**fields)
    with trio.fail_after(20):
        async with fake_server(fake_cfg, executors=executors) as srv, httpx.AsyncClient() as http:
            single = (await http.post(f"{srv.url}/v1/{route}", json={**body, "n": 1})).json()
            resp = await http.post(f"{srv.url}/v1/{route}", json=body)
    assert resp.status_code == 200, resp.text
    reply = resp.json()
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2]
    texts = [c["message"]["content"] if "message" in c else c["text"] for c in reply["choices"]]
    assert texts == [TEXT] * 3
    assert all(c["finish_reason"] == "stop" for c in reply["choices"])
    usage, one = reply["usage"], single["usage"]
    assert usage["prompt_tokens"] == one["prompt_tokens"]  # counted once
    assert usage["completion_tokens"] == 3 * one["completion_tokens"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    seeds = sorted(s.params.seed for plan in executors[0].plans for s in plan.new_seqs)
    assert seeds == [100, 100, 101, 102]  # the n=1 request, then seed + i


@pytest.mark.parametrize("route", ["chat/completions", "completions"])
async def test_n_choices_streaming(fake_cfg, route):
    fields = {"n": 3, "stream": True, "stream_options": {"include_usage": True}}
    body = chat_body(**fields) if route.startswith("chat") else completion_body(**fields)
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, httpx.AsyncClient() as http:
            events = await post_stream(http, srv.url, route, body)
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3 * (len(TEXT) + 1)
    chunks = events[:-2]
    assert all(len(c["choices"]) == 1 for c in chunks)
    assert len({c["id"] for c in events[:-1]}) == 1
    if route.startswith("chat"):
        firsts = [c["choices"][0] for c in chunks[:3]]
        assert [f["index"] for f in firsts] == [0, 1, 2]
        assert all(f["delta"]["role"] == "assistant" for f in firsts)
    for index in range(3):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        text = "".join(ch["delta"].get("content") or "" if "delta" in ch else ch["text"] for ch in mine)
        assert text == TEXT
        assert [ch["finish_reason"] for ch in mine if ch["finish_reason"]] == ["stop"]
        assert mine[-1]["finish_reason"] == "stop"


async def test_n_beyond_capacity_is_429_and_frees_the_choices_opened():
    cfg = load_config(
        None,
        overrides=["server.port=0", "server.drain_timeout_s=5", "engine.max_num_seqs=1", "limits.max_waiting=1"],
        environ={},
    )
    assert cfg.limits.max_n >= 3
    with trio.fail_after(20):
        async with fake_server(cfg) as srv, httpx.AsyncClient() as http:
            refused = await http.post(f"{srv.url}/v1/chat/completions", json=chat_body(n=3))
            stats = srv.engine.statistics()
            fits = await http.post(f"{srv.url}/v1/chat/completions", json=chat_body(n=2))
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert stats.num_requests == 0
    assert fits.status_code == 200 and len(fits.json()["choices"]) == 2


async def test_disconnect_mid_stream_aborts_every_choice(fake_cfg):
    body = chat_body(n=3, stream=True, max_tokens=4000)
    with trio.fail_after(20):
        async with fake_server(fake_cfg, text="abc", then_eos=False) as srv:
            async with httpx.AsyncClient() as http:
                async with http.stream("POST", f"{srv.url}/v1/chat/completions", json=body) as resp:
                    lines = resp.aiter_lines()
                    for _ in range(12):
                        await lines.__anext__()
            await wait_until(srv.engine.statistics, until=engine_idle, poll_s=0.01)
            stats = srv.engine.statistics()
    assert stats.scheduler.num_aborted == 3 and stats.cache.num_leased == 0


def hand_stream(name: str) -> tuple[RequestStream, trio.MemorySendChannel]:
    send, recv = trio.open_memory_channel(16)
    send.send_nowait(Accepted(num_prompt_tokens=3, max_tokens=100))
    return RequestStream(RequestId(name), recv, TOKENIZER, ()), send


async def test_one_choice_failing_mid_stream_sends_the_error_and_closes_all():
    (ok, ok_send), (bad, bad_send) = hand_stream("ok"), hand_stream("bad")
    await ok.wait_accepted()
    await bad.wait_accepted()
    ok_send.send_nowait(RequestOutput(token_ids=tuple(TOKENIZER.encode("ab"))))
    bad_send.send_nowait(RequestFailed(error=ExecutorCrashedError("boom")))
    body = ChoicesSseBody([ok, bad], ResponseBuilder(chat=False, model=MODEL), include_usage=True)
    with trio.fail_after(5):
        async with body:
            events = sse_events("".join([event async for event in body]))
    assert events[-1]["error"]["message"] == "boom"  # in-band, and nothing after it
    assert all("error" not in e for e in events[:-1])
    with pytest.raises(trio.BrokenResourceError):  # the surviving choice was aborted too
        ok_send.send_nowait(RequestOutput(token_ids=(5,)))


# -- logprobs ------------------------------------------------------------------------------


class WordTokenizer:
    """A tiny vocabulary with one multi-byte token, to pin the formats down exactly."""

    VOCAB = {1: "H", 2: "é", 3: "J", 4: "i"}

    def decode(self, token_ids, skip_special_tokens=False):
        return "".join(self.VOCAB[t] for t in token_ids)


WORDS = WordTokenizer()
ENTRIES = (
    TokenLogprob(token_id=1, logprob=-0.5, top=((1, -0.5), (3, -1.5))),
    TokenLogprob(token_id=2, logprob=-math.inf, top=((4, -0.1),)),
)
USAGE = Usage(prompt_tokens=3, completion_tokens=2)


def chat_item(text, logprob):
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def test_chat_logprobs_format():
    builder = ResponseBuilder(chat=True, model=MODEL, logprobs=True, tokenizer=WORDS)
    reply = builder.full([ChoiceResult(index=0, text="Hé", finish_reason="stop", logprobs=ENTRIES)], USAGE)
    content = reply["choices"][0]["logprobs"]["content"]
    assert content == [
        {**chat_item("H", -0.5), "top_logprobs": [chat_item("H", -0.5), chat_item("J", -1.5)]},
        {**chat_item("é", -9999.0), "top_logprobs": [chat_item("i", -0.1)]},
    ]
    chunk = json.loads(builder.chunk(0, "H", None, ENTRIES[:1])[6:])
    assert chunk["choices"][0]["logprobs"]["content"] == content[:1]
    assert json.loads(builder.chunk(0, "x")[6:])["choices"][0]["logprobs"] is None


def test_completion_logprobs_format_and_offsets_across_chunks():
    builder = ResponseBuilder(chat=False, model=MODEL, logprobs=True, tokenizer=WORDS)
    reply = builder.full([ChoiceResult(index=0, text="Hé", finish_reason="stop", logprobs=ENTRIES)], USAGE)
    assert reply["choices"][0]["logprobs"] == {
        "tokens": ["H", "é"],
        "token_logprobs": [-0.5, -9999.0],
        "top_logprobs": [{"H": -0.5, "J": -1.5}, {"i": -0.1, "é": -9999.0}],  # + the sampled token
        "text_offset": [0, 1],
    }
    streamed = [json.loads(builder.chunk(1, "x", None, (e,))[6:])["choices"][0] for e in ENTRIES * 2]
    assert [c["logprobs"]["text_offset"] for c in streamed] == [[0], [1], [2], [3]]
    assert all(c["index"] == 1 for c in streamed)


def test_no_logprobs_when_not_asked():
    builder = ResponseBuilder(chat=True, model=MODEL, tokenizer=WORDS)
    reply = builder.full([ChoiceResult(index=0, text="H", finish_reason="stop", logprobs=ENTRIES)], USAGE)
    assert reply["choices"][0]["logprobs"] is None
    assert json.loads(builder.chunk(0, "H", None, ENTRIES)[6:])["choices"][0]["logprobs"] is None


async def test_chat_logprobs_end_to_end(fake_cfg):
    body = chat_body(logprobs=True, top_logprobs=2)
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, httpx.AsyncClient() as http:
            plain = (await http.post(f"{srv.url}/v1/chat/completions", json=body)).json()
            events = await post_stream(http, srv.url, "chat/completions", {**body, "stream": True})
            off = (await http.post(f"{srv.url}/v1/chat/completions", json=chat_body())).json()
    content = plain["choices"][0]["logprobs"]["content"]
    assert len(content) == plain["usage"]["completion_tokens"]  # one per token, EOS included
    assert "".join(c["token"] for c in content).startswith(TEXT)
    for item in content:
        assert set(item) == {"token", "logprob", "bytes", "top_logprobs"}
        assert item["bytes"] == list(item["token"].encode()) and item["logprob"] <= 0
        assert len(item["top_logprobs"]) == 2
        assert all(set(t) == {"token", "logprob", "bytes"} for t in item["top_logprobs"])
    streamed = [e["choices"][0]["logprobs"] for e in events[:-1] if e["choices"]]
    assert [c for s in streamed if s for c in s["content"]] == content
    assert off["choices"][0]["logprobs"] is None


async def test_completion_logprobs_end_to_end_with_n(fake_cfg):
    body = completion_body(logprobs=1, n=2)
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, httpx.AsyncClient() as http:
            plain = (await http.post(f"{srv.url}/v1/completions", json=body)).json()
            events = await post_stream(http, srv.url, "completions", {**body, "stream": True})
    for choice in plain["choices"]:
        logprobs = choice["logprobs"]
        assert set(logprobs) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
        assert "".join(logprobs["tokens"]).startswith(TEXT)
        assert len(set(map(len, logprobs.values()))) == 1
        offsets = logprobs["text_offset"]
        assert offsets[0] == 0 and offsets == sorted(offsets)
        assert all(1 <= len(top) <= 2 for top in logprobs["top_logprobs"])
    for index in range(2):
        mine = [e["choices"][0]["logprobs"] for e in events[:-1] if e["choices"][0]["index"] == index]
        offsets = [o for m in mine if m for o in m["text_offset"]]
        assert offsets == plain["choices"][index]["logprobs"]["text_offset"]


# --- fields inside a message -----------------------------------------------------------------


def test_an_answer_sent_back_as_openai_python_writes_it_is_accepted():
    # openai-python's ChatCompletionMessage, dumped into the next turn's messages.
    echoed = {
        "role": "assistant",
        "content": "Hi!",
        "refusal": None,
        "tool_calls": None,
        "function_call": None,
        "audio": None,
        "annotations": [],
    }
    parsed = parse_chat(chat_body(messages=[*CHAT, echoed, *CHAT]), model_names=ServedNames((MODEL,)), max_n=8)
    assert [m.role for m in parsed.prompt] == ["user", "assistant", "user"]


@pytest.mark.parametrize(
    ("message", "param", "code"),
    [
        ({"role": "user", "content": "hi", "nmae": "x"}, "messages[0].nmae", "unknown_parameter"),
        # tool fields are honoured (tests/agent), in their places only and in their shapes
        ({"role": "user", "content": "hi", "tool_call_id": "call_1"}, "messages[0].tool_call_id", None),
        ({"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]}, "messages[0].tool_calls", None),
        ({"role": "user", "content": "hi", "name": ""}, "messages[0].name", None),
        ({"role": "user", "content": "hi", "name": 7}, "messages[0].name", None),
    ],
)
def test_message_fields_this_server_would_ignore_are_refused(message, param, code):
    with pytest.raises(InvalidRequestError) as refused:
        parse_chat(chat_body(messages=[message]), model_names=ServedNames((MODEL,)), max_n=8)
    assert refused.value.param == param and refused.value.code == code


def test_a_message_name_reaches_the_chat_template():
    from vllm_mlx_trio.actors.admission.actor import AdmissionActor, AdmissionLimits

    class Recording(FakeTokenizer):
        turns: list = []

        def apply_chat_template(self, messages, **kwargs):
            Recording.turns = messages
            return super().apply_chat_template(messages, **kwargs)

    parsed = parse_chat(
        chat_body(messages=[{"role": "user", "content": "hi", "name": "ada"}, *CHAT]),
        model_names=ServedNames((MODEL,)),
        max_n=8,
    )
    limits = AdmissionLimits(max_context_tokens=99, default_max_tokens=None, max_stop_sequences=4, vocab_size=259)
    send, recv = trio.open_memory_channel(0)
    actor = AdmissionActor(submit_recv=recv, admit_send=send, tokenizer=Recording(), limits=limits)
    actor.tokenize(parsed.prompt)
    assert Recording.turns == [{"role": "user", "content": "hi", "name": "ada"}, {"role": "user", "content": "hi"}]
