"""``[[models]]`` over HTTP on fake engines: load on demand, LRU eviction under a budget,
pinned models, waiting for a load, load failures, cancellation while waiting, unload."""

from __future__ import annotations

import anthropic
import attrs
import httpx
import openai
import pytest
import trio

from vllm_mlx_trio.testing.clients import anthropic_client, openai_client
from vllm_mlx_trio.testing.fake_executor import StepGate
from vllm_mlx_trio.testing.models import BAD_PATH, MIB, FakeModels, models_cfg, models_server
from vllm_mlx_trio.testing.polling import wait_until

CHAT = [{"role": "user", "content": "hi"}]
A = {"name": "a", "path": "demo:tiny"}
B = {"name": "b", "path": "demo:small", "aliases": ["bee"]}
C = {"name": "c", "path": "demo:tiny"}
POLL_S = 0.01


async def chat(url: str, model: str) -> str:
    async with openai_client(url) as client:
        reply = await client.chat.completions.create(model=model, messages=CHAT, max_tokens=20)
    assert reply.model == model
    return reply.choices[0].message.content


async def states(url: str) -> dict[str, str]:
    async with httpx.AsyncClient() as client:
        cards = (await client.get(f"{url}/v1/models")).json()["data"]
    return {card["id"]: card["state"] for card in cards}


async def status_of(url: str, name: str) -> dict:
    async with httpx.AsyncClient() as client:
        models = (await client.get(f"{url}/v1/status")).json()["models"]
    return next(model for model in models if model["name"] == name)


async def test_models_load_on_demand_and_are_listed_with_their_state():
    fakes = FakeModels()
    with trio.fail_after(20):
        async with models_server(models_cfg([A, B]), fakes) as url:
            before = await states(url)
            answer = await chat(url, "bee")
            after = await states(url)
            async with openai_client(url) as client:
                with pytest.raises(openai.NotFoundError) as unknown:
                    await client.chat.completions.create(model="gpt-4o", messages=CHAT, max_tokens=3)
    assert before == {"a": "not_loaded", "b": "not_loaded", "bee": "not_loaded"}
    assert answer == "I am b."
    assert after == {"a": "not_loaded", "b": "loaded", "bee": "loaded"}
    assert fakes.opened == ["b"]
    assert unknown.value.body["code"] == "model_not_found"


async def test_the_least_recently_used_idle_model_leaves_when_the_budget_holds_one():
    fakes = FakeModels(footprints={"a": 60 * MIB, "b": 60 * MIB, "c": 60 * MIB})
    with trio.fail_after(20):
        async with models_server(models_cfg([A, B, C], memory_mb=100), fakes) as url:
            assert await chat(url, "a") == "I am a."
            assert await chat(url, "b") == "I am b."
            after_b = await states(url)
            assert await chat(url, "a") == "I am a."
            after_a = await states(url)
    assert after_b == {"a": "not_loaded", "b": "loaded", "bee": "loaded", "c": "not_loaded"}
    assert after_a == {"a": "loaded", "b": "not_loaded", "bee": "not_loaded", "c": "not_loaded"}
    assert fakes.opened == ["a", "b", "a"]


async def test_a_pinned_model_stays_and_one_that_can_never_fit_is_refused():
    fakes = FakeModels(footprints={"a": 50 * MIB, "b": 40 * MIB, "c": 60 * MIB})
    pinned_a = {**A, "pinned": True}
    with trio.fail_after(20):
        async with models_server(models_cfg([pinned_a, B, C], memory_mb=100), fakes) as url:
            at_start = await states(url)
            assert await chat(url, "b") == "I am b."
            async with openai_client(url) as client:
                with pytest.raises(openai.APIStatusError) as too_large:
                    await client.chat.completions.create(model="c", messages=CHAT, max_tokens=3)
                with pytest.raises(openai.APIStatusError) as again:
                    await client.chat.completions.create(model="c", messages=CHAT, max_tokens=3)
            assert await chat(url, "a") == "I am a."
            after = await states(url)
    assert at_start["a"] == "loaded" and at_start["b"] == "not_loaded"
    assert too_large.value.status_code == 503
    error = too_large.value.body
    assert error["code"] == "model_unavailable" and "can never fit" in error["message"] and "pinned" in error["message"]
    assert again.value.status_code == 503 and fakes.opened.count("c") == 1  # measured once, not reloaded
    assert after["a"] == "loaded" and after["b"] == "loaded" and after["c"] == "failed"


async def test_requests_arriving_while_their_model_loads_wait_for_it():
    fakes = FakeModels(gates={"b": trio.Event()})
    answers: list[str] = []
    with trio.fail_after(20):
        async with models_server(models_cfg([A, B]), fakes) as url:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: _append(answers, chat(url, "b")))
                await wait_until(lambda: status_of(url, "b"), poll_s=POLL_S, until=lambda s: s["waiting_for_load"] == 1)
                nursery.start_soon(lambda: _append(answers, chat(url, "bee")))
                loading = await wait_until(
                    lambda: status_of(url, "b"), poll_s=POLL_S, until=lambda s: s["waiting_for_load"] == 2
                )
                assert await chat(url, "a") == "I am a."  # the other model serves meanwhile
                fakes.gates["b"].set()
    assert loading["state"] == "loading" and loading["loading_for_s"] is not None and loading["load_phase"] == "loading"
    assert answers == ["I am b.", "I am b."]
    assert fakes.opened.count("b") == 1


async def test_waiting_for_a_load_is_bounded_by_max_waiting():
    fakes = FakeModels(gates={"a": trio.Event()})
    with trio.fail_after(20):
        async with models_server(models_cfg([{**A, "limits": {"max_waiting": 1}}]), fakes) as url:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(chat, url, "a")
                await wait_until(lambda: status_of(url, "a"), poll_s=POLL_S, until=lambda s: s["waiting_for_load"] == 1)
                async with openai_client(url) as client:
                    with pytest.raises(openai.RateLimitError) as full:
                        await client.chat.completions.create(model="a", messages=CHAT, max_tokens=3)
                fakes.gates["a"].set()
    assert full.value.status_code == 429 and "wait for model 'a'" in full.value.body["message"]


async def test_a_model_that_fails_to_load_is_answered_clearly_while_the_others_serve():
    fakes = FakeModels()
    broken = {"name": "broken", "path": f"{BAD_PATH}/model"}
    with trio.fail_after(20):
        async with models_server(models_cfg([A, broken]), fakes) as url:
            assert await chat(url, "a") == "I am a."
            async with openai_client(url) as client:
                with pytest.raises(openai.APIStatusError) as failed:
                    await client.chat.completions.create(model="broken", messages=CHAT, max_tokens=3)
            async with anthropic_client(url) as client:
                with pytest.raises(anthropic.APIStatusError) as failed_messages:
                    await client.messages.create(model="broken", messages=CHAT, max_tokens=3)
            assert await chat(url, "a") == "I am a."
            async with httpx.AsyncClient() as client:
                cards = (await client.get(f"{url}/v1/models")).json()["data"]
    assert failed.value.status_code == 503
    assert failed.value.body["code"] == "model_unavailable"
    assert (
        "'broken' could not be loaded" in failed.value.body["message"]
        and "no such directory" in failed.value.body["message"]
    )
    assert failed_messages.value.status_code == 503 and failed_messages.value.body["type"] == "error"
    broken_card = next(card for card in cards if card["id"] == "broken")
    assert broken_card["state"] == "failed" and "no such directory" in broken_card["error"]
    assert next(card for card in cards if card["id"] == "a")["state"] == "loaded"


async def test_a_request_cancelled_while_its_model_loads_leaves_the_wait():
    fakes = FakeModels(gates={"a": trio.Event()})
    with trio.fail_after(20):
        async with models_server(models_cfg([A]), fakes) as url:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(chat, url, "a")  # cancelled below: its connection closes
                await wait_until(lambda: status_of(url, "a"), poll_s=POLL_S, until=lambda s: s["waiting_for_load"] == 1)
                nursery.cancel_scope.cancel()
            left = await wait_until(
                lambda: status_of(url, "a"), poll_s=POLL_S, until=lambda s: s["waiting_for_load"] == 0
            )
            fakes.gates["a"].set()
            await wait_until(lambda: status_of(url, "a"), poll_s=POLL_S, until=lambda s: s["state"] == "loaded")
            assert await chat(url, "a") == "I am a."
    assert left["state"] == "loading"
    assert fakes.opened == ["a"]


async def test_delete_unloads_a_model_and_the_next_request_loads_it_again():
    fakes = FakeModels()
    with trio.fail_after(20):
        async with models_server(models_cfg([A, B]), fakes) as url:
            assert await chat(url, "a") == "I am a."
            async with httpx.AsyncClient() as client:
                unloaded = await client.delete(f"{url}/v1/models/a")
                unknown = await client.delete(f"{url}/v1/models/zzz")
                after = await states(url)
                loaded = await client.post(f"{url}/v1/models/b/load")
            assert await chat(url, "a") == "I am a."
    assert unloaded.status_code == 200 and unloaded.json()["state"] == "not_loaded"
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert after["a"] == "not_loaded"
    assert loaded.status_code == 200 and loaded.json()["state"] == "loaded"
    assert fakes.opened == ["a", "b", "a"]


async def _append(into: list[str], answer) -> None:
    into.append(await answer)


async def test_a_request_without_a_valid_key_is_refused_before_any_load(monkeypatch):
    monkeypatch.setenv("VLLM_MLX_TRIO_API_KEYS", "sk-right")
    fakes = FakeModels()
    with trio.fail_after(20):
        async with models_server(models_cfg([A]), fakes) as url:
            async with openai_client(url, api_key="sk-wrong") as client:
                with pytest.raises(openai.AuthenticationError):
                    await client.chat.completions.create(model="a", messages=CHAT, max_tokens=3)
            async with openai_client(url, api_key="sk-right") as client:
                listed = [card.id async for card in client.models.list()]
                reply = await client.chat.completions.create(model="a", messages=CHAT, max_tokens=20)
    assert listed == ["a"] and reply.choices[0].message.content == "I am a."
    assert fakes.opened == ["a"]  # the refused request loaded nothing


async def test_a_loaded_models_own_routes_take_model_in_the_query():
    fakes = FakeModels()
    with trio.fail_after(20):
        async with models_server(models_cfg([A, B]), fakes) as url:
            async with httpx.AsyncClient() as client:
                before = await client.get(f"{url}/v1/cache/stats", params={"model": "a"})
                assert await chat(url, "a") == "I am a."
                loaded = await client.get(f"{url}/v1/cache/stats", params={"model": "a"})
                metrics = await client.get(f"{url}/metrics", params={"model": "a"})
                unnamed = await client.get(f"{url}/v1/cache/stats")
    assert before.status_code == 404 and unnamed.status_code == 404
    assert loaded.status_code == 200 and "enabled" in loaded.json()
    assert metrics.status_code == 200 and "vllm:" in metrics.text
    assert fakes.opened == ["a"]


async def test_a_model_waits_for_room_while_the_only_one_it_could_replace_is_busy():
    fakes = FakeModels(footprints={"a": 60 * MIB, "b": 60 * MIB}, step_gates={"a": StepGate()})
    answers: list[str] = []
    with trio.fail_after(20):
        async with models_server(models_cfg([A, B], memory_mb=100), fakes) as url:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: _append(answers, chat(url, "a")))
                await wait_until(lambda: status_of(url, "a"), poll_s=POLL_S, until=lambda s: s["requests"] == 1)
                nursery.start_soon(lambda: _append(answers, chat(url, "b")))
                waiting = await wait_until(
                    lambda: status_of(url, "b"), poll_s=POLL_S, until=lambda s: s["load_phase"] == "making_room"
                )
                a_busy = await status_of(url, "a")
                fakes.step_gates["a"].allow(100)  # a's request finishes: a is idle, b takes its room
            after = await states(url)
    assert a_busy["state"] == "loaded" and waiting["state"] == "loading"
    assert sorted(answers) == ["I am a.", "I am b."]
    assert fakes.opened == ["a", "b"] and after == {"a": "not_loaded", "b": "loaded", "bee": "loaded"}


async def test_the_routers_own_errors_carry_cors_headers_and_bound_the_body():
    fakes = FakeModels()
    cfg = models_cfg([A], cors_origins=["https://app.example"])
    cfg = attrs.evolve(cfg, limits=attrs.evolve(cfg.limits, max_body_bytes=1024))
    with trio.fail_after(20):
        async with models_server(cfg, fakes) as url:
            async with httpx.AsyncClient() as client:
                headers = {"Origin": "https://app.example"}
                unknown = await client.post(
                    f"{url}/v1/chat/completions", json={"model": "zz", "messages": CHAT}, headers=headers
                )
                large = await client.post(f"{url}/v1/chat/completions", json={"model": "a", "messages": CHAT * 200})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert unknown.headers["access-control-allow-origin"] == "https://app.example"
    assert unknown.headers["vary"] == "Origin" and unknown.headers["x-request-id"]
    assert large.status_code == 413 and large.json()["error"]["type"] == "request_too_large"
    assert fakes.opened == []


async def test_a_models_named_adapters_are_listed_and_routed_to_it():
    fakes = FakeModels()
    with_adapter = {**A, "adapters": {"x": "/srv/adapters/x"}}
    with trio.fail_after(20):
        async with models_server(models_cfg([with_adapter, B]), fakes) as url:
            async with httpx.AsyncClient() as client:
                cards = {card["id"]: card for card in (await client.get(f"{url}/v1/models")).json()["data"]}
            answer = await chat(url, "a:x")
            async with openai_client(url) as client:
                with pytest.raises(openai.NotFoundError) as unknown:
                    await client.chat.completions.create(model="a:y", messages=CHAT, max_tokens=3)
    assert list(cards) == ["a", "a:x", "b", "bee"]
    assert cards["a:x"]["parent"] == "a" and cards["a:x"]["root"] == "/srv/adapters/x"
    assert answer == "I am a." and fakes.opened == ["a"]
    assert unknown.value.body["code"] == "model_not_found"
