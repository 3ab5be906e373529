"""OpenAI Responses API on the real HTTP server over a FakeExecutor: protocol details.

The openai SDK is the client (its ``responses.stream()`` helper is strict about the event
sequence); raw httpx where the bytes on the wire are the point.
"""

from __future__ import annotations

import json

import attrs
import httpx
import openai
import pytest
import trio

from vllm_mlx_trio.errors import ExecutorCrashedError
from vllm_mlx_trio.testing.clients import openai_client
from vllm_mlx_trio.testing.fake_executor import FakeExecutor, FakeTokenizer
from vllm_mlx_trio.testing.harness import fake_server
from vllm_mlx_trio.testing.polling import engine_idle, wait_until

MODEL = "demo:tiny"


def prompts(executor: FakeExecutor) -> list[str]:
    """Every prompt the executor was given, as text (the fake tokenizer is byte-level)."""
    return [FakeTokenizer().decode(list(seq.prompt_token_ids)) for plan in executor.plans for seq in plan.new_seqs]


async def test_create_returns_a_response_with_usage(fake_cfg):
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, openai_client(srv.url) as c:
            response = await c.responses.create(model=MODEL, input="hi", instructions="Be brief.", temperature=0)
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "completed" and response.output_text == "Hello, world!"
    assert response.instructions == "Be brief." and response.temperature == 0
    [item] = response.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    usage = response.usage
    assert usage.output_tokens == len("Hello, world!") + 1  # + the EOS token
    assert usage.input_tokens_details.cached_tokens == 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


async def test_max_output_tokens_makes_it_incomplete(fake_cfg):
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, openai_client(srv.url) as c:
            response = await c.responses.create(model=MODEL, input="hi", max_output_tokens=3)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "Hel" and response.usage.output_tokens == 3


async def test_stream_helper_accepts_the_event_sequence(fake_cfg):
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, openai_client(srv.url) as c:
            async with c.responses.stream(model=MODEL, input=[{"role": "user", "content": "hi"}]) as stream:
                kinds = [event.type async for event in stream]
                final = await stream.get_final_response()
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert final.output_text == "Hello, world!" and final.status == "completed"
    assert final.usage.output_tokens == len("Hello, world!") + 1


async def test_stream_on_the_wire_has_one_id_and_increasing_sequence_numbers(fake_cfg):
    body = {"model": MODEL, "input": "hi", "stream": True, "max_output_tokens": 2}
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, httpx.AsyncClient() as http:
            resp = await http.post(f"{srv.url}/v1/responses", json=body)
    blocks = [b for b in resp.text.split("\n\n") if b.strip()]
    events = []
    for block in blocks:
        name, data = block.split("\n")
        events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert {data["response"]["id"] for _, data in events if "response" in data} == {events[0][1]["response"]["id"]}
    assert events[-1][0] == "response.incomplete"
    deltas = [data for name, data in events if name == "response.output_text.delta"]
    assert [d["delta"] for d in deltas] == ["H", "e"] and all(d["logprobs"] == [] for d in deltas)


@pytest.mark.parametrize("stream", [False, True])
async def test_previous_response_id_continues_the_conversation(fake_cfg, stream):
    executors: list[FakeExecutor] = []
    with trio.fail_after(20):
        async with fake_server(fake_cfg, executors=executors) as srv, openai_client(srv.url) as c:
            first = await c.responses.create(model=MODEL, input="first question", instructions="OLD RULES")
            kwargs = {"model": MODEL, "input": "second question", "previous_response_id": first.id}
            if stream:
                async with c.responses.stream(**kwargs) as s:
                    second = await s.get_final_response()
            else:
                second = await c.responses.create(**kwargs)
            stored = await c.responses.retrieve(second.id)
    later = prompts(executors[0])[-1]
    assert "first question" in later and "Hello, world!" in later and "second question" in later
    assert "OLD RULES" not in later  # instructions are not carried over (as OpenAI does)
    assert second.previous_response_id == first.id
    assert stored.output_text == second.output_text and stored.id == second.id


async def test_unknown_stored_and_deleted_ids_are_404(fake_cfg):
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, openai_client(srv.url) as c:
            unstored = await c.responses.create(model=MODEL, input="hi", store=False)
            kept = await c.responses.create(model=MODEL, input="hi")
            await c.responses.delete(kept.id)
            failures = []
            for call in (
                lambda: c.responses.retrieve(unstored.id),
                lambda: c.responses.retrieve(kept.id),
                lambda: c.responses.delete(kept.id),
                lambda: c.responses.create(model=MODEL, input="hi", previous_response_id="resp_nope"),
            ):
                with pytest.raises(openai.NotFoundError) as caught:
                    await call()
                failures.append(caught.value.body)
    assert all(f["type"] == "invalid_request_error" and f["code"] == "not_found" for f in failures)
    assert failures[-1]["param"] == "previous_response_id"


async def test_the_store_evicts_the_least_recently_used(fake_cfg):
    cfg = attrs.evolve(fake_cfg, limits=attrs.evolve(fake_cfg.limits, max_stored_responses=2))
    with trio.fail_after(20):
        async with fake_server(cfg) as srv, openai_client(srv.url) as c:
            a, b = [await c.responses.create(model=MODEL, input="hi") for _ in range(2)]
            await c.responses.retrieve(a.id)  # a is now the most recently used
            await c.responses.create(model=MODEL, input="hi")
            kept = await c.responses.retrieve(a.id)
            with pytest.raises(openai.NotFoundError):
                await c.responses.retrieve(b.id)
    assert kept.id == a.id


BAD = [
    ("unknown field", {"foo": 1}, "foo", "unknown_parameter"),
    ("unknown item field", {"input": [{"role": "user", "content": "x", "y": 1}]}, "input[0].y", "unknown_parameter"),
    ("bad role", {"input": [{"role": "robot", "content": "x"}]}, "input[0].role", None),
    ("wrong type", {"temperature": "hot"}, "temperature", None),
    ("unknown item type", {"input": [{"type": "banana"}]}, "input[0].type", None),
    ("no tool parser", {"tools": [{"type": "function", "name": "f", "parameters": {}}]}, "tools", None),
    ("unknown tool kind", {"tools": [{"type": "computer_use_2030"}]}, "tools[0].type", "unsupported_parameter"),
    ("forced without tools", {"tool_choice": "required"}, "tool_choice", None),
    ("max_tool_calls", {"max_tool_calls": 2}, "max_tool_calls", "unsupported_parameter"),
    ("background", {"background": True}, "background", "unsupported_parameter"),
    ("include", {"include": ["message.output_text.logprobs"]}, "include", "unsupported_parameter"),
    ("temperature range", {"temperature": 9}, "temperature", None),
]


@pytest.mark.parametrize(("what", "change", "param", "code"), BAD, ids=[b[0] for b in BAD])
async def test_bad_requests_get_openai_errors(fake_cfg, what, change, param, code):
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, openai_client(srv.url) as c:
            with pytest.raises(openai.BadRequestError) as caught:
                await c.responses.create(model=MODEL, input="hi", extra_body=change)
    error = caught.value.body
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param and error["code"] == code


async def test_unknown_model_is_404(fake_cfg):
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, openai_client(srv.url) as c:
            with pytest.raises(openai.NotFoundError) as caught:
                await c.responses.create(model="gpt-nope", input="hi")
    assert caught.value.body["code"] == "model_not_found"


async def test_failure_mid_stream_is_an_error_then_response_failed(fake_cfg):
    body = {"model": MODEL, "input": "hi", "stream": True, "max_output_tokens": 100}
    with trio.fail_after(20), pytest.raises(ExecutorCrashedError):  # the server exits with its engine
        async with fake_server(fake_cfg, fail_at_step=3) as srv, httpx.AsyncClient() as http:
            resp = await http.post(f"{srv.url}/v1/responses", json=body)
            names = [line.removeprefix("event: ") for line in resp.text.splitlines() if line.startswith("event: ")]
            failed = json.loads(resp.text.strip().split("\n")[-1].removeprefix("data: "))
    assert names[-2:] == ["error", "response.failed"]
    assert failed["response"]["status"] == "failed" and failed["response"]["error"]["code"] == "engine_failed"


async def test_disconnect_mid_stream_frees_the_request(fake_cfg):
    body = {"model": MODEL, "input": "hi", "stream": True, "max_output_tokens": 4000}
    with trio.fail_after(20):
        async with fake_server(fake_cfg, text="abc", then_eos=False) as srv:
            async with httpx.AsyncClient() as http:
                async with http.stream("POST", f"{srv.url}/v1/responses", json=body) as resp:
                    lines = resp.aiter_lines()
                    while (await lines.__anext__()) != "event: response.output_text.delta":
                        pass
            await wait_until(srv.engine.statistics, until=engine_idle, poll_s=0.01)
            stats = srv.engine.statistics()
    assert stats.scheduler.num_aborted == 1 and stats.cache.num_leased == 0
