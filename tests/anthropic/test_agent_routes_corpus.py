"""The bad-input corpus for the agent routes: ``/v1/messages``, ``/v1/messages/count_tokens``
and ``/v1/responses`` on the real server (FakeExecutor behind it).

Seeded mutations of valid bodies, each bad by construction (broken JSON, a body that is not an
object, a field of the wrong type, an unknown field at any depth, a required field removed, a
value out of range, an unsupported feature): every one must get a 4xx (never a 5xx), in the
route's own error shape (Anthropic's on the Messages paths, OpenAI's on /v1/responses), under
4 KiB, with nothing logged at ERROR.
"""

from __future__ import annotations

import copy
import json
import logging
import random
from dataclasses import dataclass

import httpx
import trio

from vllm_mlx_trio.testing.fake_executor import letters_script
from vllm_mlx_trio.testing.harness import fake_executor_factory, open_server

MODEL = "demo:tiny"
SEED = 20261201
PER_ROUTE = 150
CONCURRENCY = 16
MAX_ERROR_BYTES = 4096
MESSAGES, COUNT, RESPONSES = "/v1/messages", "/v1/messages/count_tokens", "/v1/responses"
WRONG_VALUES = ["x", 7, -1.5, True, None, [], {}, [1, "a"], {"k": "v"}]


@dataclass(frozen=True)
class Bad:
    family: str
    path: str
    body: bytes


def valid_body(rng: random.Random, path: str) -> dict:
    text = rng.choice(["hi", "Weather?", "é日✓", "2+2?"])
    if path == RESPONSES:
        body = {"model": MODEL, "input": rng.choice([text, [{"role": "user", "content": text}]])}
        if rng.random() < 0.5:
            body["max_output_tokens"] = rng.randint(1, 20)
        if rng.random() < 0.3:
            body["instructions"] = "Be brief."
        return body
    body = {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}
    if path == MESSAGES:
        body["max_tokens"] = rng.randint(1, 20)
        if rng.random() < 0.3:
            body["stop_sequences"] = ["zz"]
    if rng.random() < 0.4:
        body["system"] = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    return body


def _paths(value, prefix=()):
    """Every (path, value) inside a JSON value, the root excluded."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*prefix, key), item
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield (*prefix, index), item
            yield from _paths(item, (*prefix, index))


def _at(body, path):
    for step in path[:-1]:
        body = body[step]
    return body


#: Fields where a string is also a valid shape (a string content, input or system).
STRING_TOO = frozenset({"content", "input", "system"})


def wrong_type(rng, body):
    """A value replaced by one of another JSON type that its field never accepts (never null:
    null is "absent" for an optional field; never an integer for a number)."""
    path, value = rng.choice([(p, v) for p, v in _paths(body) if "cache_control" not in p])
    choices = [v for v in WRONG_VALUES if v is not None and type(v) is not type(value)]
    if path[-1] in STRING_TOO:
        choices = [v for v in choices if not isinstance(v, str)]
    if isinstance(value, float):
        choices = [v for v in choices if type(v) is not int]
    _at(body, path)[path[-1]] = rng.choice(choices)
    return body


def unknown_field(rng, body):
    objects = [body] + [v for p, v in _paths(body) if isinstance(v, dict) and p[-1] != "cache_control"]
    target = rng.choice(objects)
    target[rng.choice(["foo", "nmae", "Temperature", "maxTokens", "x_y"])] = rng.choice(WRONG_VALUES)
    return body


def removed_required(rng, body):
    required = ["model", "messages", "input", "max_tokens"]
    del body[rng.choice([name for name in required if name in body])]
    return body


def out_of_range(rng, body):
    name = rng.choice(["temperature", "top_p", "max_tokens" if "messages" in body else "max_output_tokens"])
    body[name] = rng.choice({"temperature": [-1, 2.5, 99], "top_p": [-0.5, 0, 1.5]}.get(name, [-1, 0, 10**9]))
    return body


def unsupported(rng, body):
    if "input" in body:
        change = rng.choice(
            [
                {"background": True},
                {"truncation": "auto"},
                {"tools": [{"type": "computer_use_2030"}]},
                {"top_logprobs": 3},
                {"include": ["file_search_call.results"]},
            ]
        )
    else:
        change = rng.choice(
            [
                {"mcp_servers": [{"type": "url"}]},
                {"container": "c"},
                {"tools": [{"type": "bash_20250124", "name": "bash"}]},
                {"messages": [{"role": "user", "content": [{"type": "document"}]}]},
            ]
        )
    body.update(change)
    return body


def not_an_object(rng, body):
    return rng.choice([[body], "body", 3, None, True])


MUTATIONS = [wrong_type, unknown_field, removed_required, out_of_range, unsupported, not_an_object]


def build_corpus(seed: int = SEED) -> list[Bad]:
    rng = random.Random(seed)
    corpus = []
    for path in (MESSAGES, COUNT, RESPONSES):
        for _ in range(PER_ROUTE):
            body = valid_body(rng, path)
            if rng.random() < 0.1:
                raw = json.dumps(body)
                corpus.append(Bad("broken json", path, raw[: rng.randint(0, len(raw) - 1)].encode()))
                continue
            mutation = rng.choice(MUTATIONS)
            if mutation is out_of_range and path == COUNT:
                mutation = unknown_field  # count_tokens has no sampling fields
            bad = mutation(rng, copy.deepcopy(body))
            corpus.append(Bad(mutation.__name__, path, json.dumps(bad).encode()))
    return corpus


def check(resp: httpx.Response, bad: Bad) -> None:
    what = f"{bad.family} {bad.path}: {bad.body[:200]!r} -> {resp.status_code} {resp.content[:300]!r}"
    assert 400 <= resp.status_code < 500, what
    assert len(resp.content) < MAX_ERROR_BYTES, what
    assert resp.headers["content-type"].startswith("application/json"), what
    body = resp.json()
    if bad.path == RESPONSES:
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, what
    else:
        assert set(body) == {"type", "error"} and body["type"] == "error", what
        assert set(body["error"]) == {"type", "message"}, what
        assert body["error"]["type"] in ("invalid_request_error", "not_found_error"), what
    message = body["error"]["message"]
    assert isinstance(message, str) and message, what


def test_corpus_is_deterministic_and_covers_every_route_and_mutation():
    corpus = build_corpus()
    assert [(b.path, b.body) for b in corpus] == [(b.path, b.body) for b in build_corpus()]
    assert {b.path for b in corpus} == {MESSAGES, COUNT, RESPONSES}
    assert {b.family for b in corpus} == {m.__name__ for m in MUTATIONS} | {"broken json"}


async def test_bad_input_corpus_on_the_agent_routes(fake_cfg, caplog):
    corpus = build_corpus()
    responses: dict[int, httpx.Response] = {}
    limiter = trio.CapacityLimiter(CONCURRENCY)

    async def send(i: int, bad: Bad) -> None:
        async with limiter:
            responses[i] = await http.post(
                srv.url + bad.path, content=bad.body, headers={"content-type": "application/json"}
            )

    caplog.set_level(logging.WARNING)
    factory = fake_executor_factory(script=letters_script, step_s=0.001)
    with trio.fail_after(120):
        async with open_server(fake_cfg, executor_factory=factory) as srv, httpx.AsyncClient(timeout=30) as http:
            async with trio.open_nursery() as nursery:
                for i, bad in enumerate(corpus):
                    nursery.start_soon(send, i, bad)
    failures = []
    for i, bad in enumerate(corpus):
        try:
            check(responses[i], bad)
        except AssertionError as exc:
            failures.append(str(exc)[:400])
    assert not failures, f"{len(failures)} bad answers, e.g.:\n" + "\n".join(failures[:5])
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
