"""The soak's request mix, and one HTTP client per kind that checks the exact outcome.

Every request comes from a seeded ``random.Random``: the same seed gives the same requests
in the same order (the interleaving on the server still depends on timing). Each client
returns an outcome (``ok``, ``cancelled``, ``finished``, ``rejected``) or raises
:class:`SoakMismatch` naming what the server answered instead.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import attrs
import httpx
import trio

#: (kind, percent of the requests). ``cancel_stream`` closes the connection after a random
#: number of chunks; ``cancel_wait`` gives up on a non-streaming request after a random delay.
MIX = (
    ("stream_chat", 35),
    ("chat", 25),
    ("completion", 10),
    ("cancel_stream", 8),
    ("cancel_wait", 7),
    ("malformed", 15),
)
#: The outcomes each kind may have; anything else is a soak failure.
EXPECTED = {
    "stream_chat": {"ok"},
    "chat": {"ok"},
    "completion": {"ok"},
    "cancel_stream": {"cancelled", "finished"},
    "cancel_wait": {"cancelled", "finished"},
    "malformed": {"rejected"},
}
#: Longest wait before a ``cancel_wait`` client gives up, in seconds.
MAX_CANCEL_WAIT_S = 0.25
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
_WORDS = (
    "river stone light window garden paper silver morning engine quiet north valley "
    "lantern copper harbor winter signal orchard meadow thunder candle bridge forest"
).split()
#: A system prompt of well over two 64-token blocks, shared by half of the chat requests, so
#: the prefix cache commits, leases and releases blocks (also for the cancelled ones).
SYSTEM = " ".join(f"{w} {i}" for i, w in enumerate(_WORDS * 4))
#: Sentinel: do not check the error's ``param``.
ANY_PARAM = "<any>"


class SoakMismatch(Exception):
    """A request's answer differs from the one the soak expects."""


@attrs.frozen(kw_only=True)
class SoakRequest:
    """One planned request: what to send, and how the client behaves."""

    kind: str
    path: str
    body: dict | bytes
    #: Malformed: the case's name, the expected status and ``error.param``.
    case: str = ""
    status: int = 200
    param: str | None = ANY_PARAM
    #: cancel_stream: close after this many chunks; cancel_wait: give up after this long.
    cancel_after_chunks: int = 0
    cancel_after_s: float = 0.0
    #: Choices requested (``n``): good requests must produce n * max_tokens tokens.
    n: int = 1
    max_tokens: int = 0


def malformed_cases(model: str) -> tuple[tuple[str, str, dict | bytes, int, str | None], ...]:
    """(name, path, body, status, param); the last three are refused by admission, in the engine."""
    msgs = [{"role": "user", "content": "hi"}]
    chat = {"model": model, "messages": msgs}
    return (
        ("bad_json", CHAT, b'{"model": "x", "messages": [', 400, None),
        ("empty_body", CHAT, b"", 400, None),
        ("not_an_object", CHAT, b"[1, 2]", 400, None),
        ("bad_utf8", COMPLETIONS, b'{"prompt": "\xff"}', 400, None),
        ("nan", COMPLETIONS, b'{"prompt": "x", "temperature": NaN}', 400, None),
        ("messages_not_a_list", CHAT, {"model": model, "messages": "hi"}, 400, "messages"),
        (
            "bad_role",
            CHAT,
            {"model": model, "messages": [{"role": "wizard", "content": "hi"}]},
            400,
            "messages[0].role",
        ),
        ("unknown_model", CHAT, {**chat, "model": "no-such-model"}, 404, "model"),
        ("max_tokens_zero", CHAT, {**chat, "max_tokens": 0}, 400, "max_tokens"),
        ("max_tokens_string", CHAT, {**chat, "max_tokens": "5"}, 400, "max_tokens"),
        ("temperature_negative", CHAT, {**chat, "temperature": -1}, 400, "temperature"),
        ("prompt_not_a_string", COMPLETIONS, {"model": model, "prompt": 5}, 400, "prompt"),
        ("n_zero", COMPLETIONS, {"model": model, "prompt": "hi", "n": 0}, 400, "n"),
        ("max_tokens_over_context", CHAT, {**chat, "max_tokens": 10**6}, 400, "max_tokens"),
        ("logit_bias_out_of_vocab", CHAT, {**chat, "logit_bias": {"999999999": 1}}, 400, ANY_PARAM),
        ("min_tokens_over_max", CHAT, {**chat, "max_tokens": 2, "min_tokens": 5}, 400, "min_tokens"),
    )


def _words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(low, high)))


def _sampling(rng: random.Random, max_tokens: int) -> dict:
    body: dict[str, Any] = {"max_tokens": max_tokens, "ignore_eos": True}
    if rng.random() < 0.5:
        body["temperature"] = 0
    else:
        body |= {"temperature": 0.8, "seed": rng.randrange(2**31)}
    return body


def _chat_body(rng: random.Random, model: str, max_tokens: int, *, stream: bool) -> dict:
    messages = [{"role": "user", "content": _words(rng, 3, 30)}]
    if rng.random() < 0.5:
        messages.insert(0, {"role": "system", "content": SYSTEM})
    body = {"model": model, "messages": messages, **_sampling(rng, max_tokens)}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    elif rng.random() < 0.2:
        body |= {"logprobs": True, "top_logprobs": 2}
    return body


def plan_request(kind: str, rng: random.Random, model: str, max_tokens: int) -> SoakRequest:
    """One request of ``kind``, drawn from ``rng``."""
    if kind == "malformed":
        case, path, body, status, param = rng.choice(malformed_cases(model))
        return SoakRequest(kind=kind, path=path, body=body, case=case, status=status, param=param)
    if kind == "completion" or (kind == "cancel_wait" and rng.random() < 0.3):
        n = rng.choice((1, 1, 2))
        prompt = (SYSTEM + " " if rng.random() < 0.3 else "") + _words(rng, 3, 30)
        body = {"model": model, "prompt": prompt, "n": n, **_sampling(rng, max_tokens)}
        return SoakRequest(
            kind=kind,
            path=COMPLETIONS,
            body=body,
            n=n,
            max_tokens=max_tokens,
            cancel_after_s=rng.uniform(0.0, MAX_CANCEL_WAIT_S),
        )
    stream = kind in ("stream_chat", "cancel_stream")
    body = _chat_body(rng, model, max_tokens, stream=stream)
    return SoakRequest(
        kind=kind,
        path=CHAT,
        body=body,
        max_tokens=max_tokens,
        cancel_after_chunks=rng.randint(1, max_tokens),
        cancel_after_s=rng.uniform(0.0, MAX_CANCEL_WAIT_S),
    )


def plan_requests(num: int, seed: int, model: str, max_tokens: int) -> list[SoakRequest]:
    """``num`` requests in :data:`MIX`'s proportions (rounding goes to the first kind), shuffled."""
    rng = random.Random(seed)
    counts = {kind: num * percent // 100 for kind, percent in MIX}
    counts[MIX[0][0]] += num - sum(counts.values())
    kinds = [kind for kind, count in counts.items() for _ in range(count)]
    rng.shuffle(kinds)
    return [plan_request(kind, rng, model, max_tokens) for kind in kinds]


def every_malformed_case(model: str) -> list[SoakRequest]:
    """Each malformed case once (the warm-up sends them, so no first-time path is measured)."""
    return [
        SoakRequest(kind="malformed", path=p, body=b, case=c, status=s, param=q)
        for c, p, b, s, q in malformed_cases(model)
    ]


async def send(http: httpx.AsyncClient, req: SoakRequest) -> str:
    """Send ``req`` as its kind's client does; return the outcome or raise SoakMismatch."""
    clients: dict[str, Callable] = {
        "stream_chat": _streamed,
        "cancel_stream": _streamed,
        "chat": _plain,
        "completion": _plain,
        "cancel_wait": _cancelled_wait,
        "malformed": _malformed,
    }
    return await clients[req.kind](http, req)


def _post_kwargs(req: SoakRequest) -> dict:
    if isinstance(req.body, bytes):
        return {"content": req.body, "headers": {"Content-Type": "application/json"}}
    return {"json": req.body}


def _refused(resp: httpx.Response, text: str) -> SoakMismatch:
    return SoakMismatch(f"{resp.request.url.path} answered {resp.status_code}: {text[:200]}")


async def _streamed(http: httpx.AsyncClient, req: SoakRequest) -> str:
    """A streamed chat; ``cancel_stream`` closes the connection after some chunks."""
    chunks, finish, usage, done = 0, None, None, False
    async with http.stream("POST", req.path, **_post_kwargs(req)) as resp:
        if resp.status_code != 200:
            raise _refused(resp, (await resp.aread()).decode(errors="replace"))
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            if line[5:].strip() == "[DONE]":
                done = True
                continue
            event = json.loads(line[5:])
            if "error" in event:
                raise SoakMismatch(f"in-band error: {event['error']}")
            if choices := event.get("choices"):
                chunks += 1
                finish = choices[0].get("finish_reason") or finish
            usage = event.get("usage") or usage
            if req.kind == "cancel_stream" and chunks >= req.cancel_after_chunks:
                return "cancelled"  # leaving the block closes the connection mid-stream
    if not done or finish != "length":
        raise SoakMismatch(f"stream ended without [DONE] or finish_reason length: {done=} {finish=}")
    _check_usage(usage, req)
    return "finished" if req.kind == "cancel_stream" else "ok"


def _check_usage(usage: dict | None, req: SoakRequest) -> None:
    tokens = (usage or {}).get("completion_tokens")
    if tokens != req.n * req.max_tokens:
        raise SoakMismatch(f"usage.completion_tokens {tokens}, expected {req.n * req.max_tokens}")


def _check_completed(resp: httpx.Response, req: SoakRequest) -> None:
    if resp.status_code != 200:
        raise _refused(resp, resp.text)
    body = resp.json()
    choices = body.get("choices") or []
    finishes = [choice.get("finish_reason") for choice in choices]
    if finishes != ["length"] * req.n:
        raise SoakMismatch(f"finish_reason {finishes}, expected {['length'] * req.n}")
    _check_usage(body.get("usage"), req)


async def _plain(http: httpx.AsyncClient, req: SoakRequest) -> str:
    _check_completed(await http.post(req.path, **_post_kwargs(req)), req)
    return "ok"


async def _cancelled_wait(http: httpx.AsyncClient, req: SoakRequest) -> str:
    """A non-streaming request whose client gives up (closes the connection) after a delay."""
    with trio.move_on_after(req.cancel_after_s) as scope:
        resp = await http.post(req.path, **_post_kwargs(req))
    if scope.cancelled_caught:
        return "cancelled"
    _check_completed(resp, req)
    return "finished"


async def _malformed(http: httpx.AsyncClient, req: SoakRequest) -> str:
    """The exact 4xx with an OpenAI-shaped error body."""
    resp = await http.post(req.path, **_post_kwargs(req))
    if resp.status_code != req.status:
        raise SoakMismatch(f"{req.case}: status {resp.status_code}, expected {req.status}: {resp.text[:200]}")
    error = resp.json().get("error")
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        raise SoakMismatch(f"{req.case}: not an OpenAI error body: {resp.text[:200]}")
    if error.get("type") != "invalid_request_error":
        raise SoakMismatch(f"{req.case}: error type {error.get('type')!r}")
    if req.param != ANY_PARAM and error.get("param") != req.param:
        raise SoakMismatch(f"{req.case}: error param {error.get('param')!r}, expected {req.param!r}")
    return "rejected"
