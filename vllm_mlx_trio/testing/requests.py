"""What the tests send: chat messages, request bodies, and the scheduler's own requests.

One version of each builder, with the parameters the tests vary, so that a test shows only
what is particular to it (the question it asks, the fields it sets).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trio

from ..core.params import SamplingParams
from ..core.request import Request
from ..messages import Admit, RequestId

#: The model name the tests' configs serve (the demo model's).
MODEL = "demo:tiny"
#: The path of the OpenAI chat route.
CHAT_ROUTE = "/v1/chat/completions"


def chat(question: str = "hi", *, system: str | None = None) -> list[dict[str, str]]:
    """The messages of a one-question chat: ``system``'s turn when given, then the user's."""
    messages = [{"role": "system", "content": system}] if system is not None else []
    return [*messages, {"role": "user", "content": question}]


def chat_body(question: str = "hi", *, model: str = MODEL, **fields: Any) -> dict[str, Any]:
    """A chat-completions body asking ``question``, plus ``fields`` (``messages=`` among them
    replaces the question)."""
    return {"model": model, "messages": chat(question), **fields}


async def post_chat(http: Any, url: str, question: str = "hi", **fields: Any) -> dict[str, Any]:
    """POST :func:`chat_body` to the server at ``url`` with the ``httpx.AsyncClient``
    ``http``; it must answer 200: its JSON."""
    resp = await http.post(f"{url}{CHAT_ROUTE}", json=chat_body(question, **fields))
    assert resp.status_code == 200, resp.text
    return resp.json()


def make_request(
    name: str = "r",
    *,
    prompt: int | Sequence[int] = 2,
    eos_token_ids: Sequence[int] = (2,),
    media_keys: tuple[tuple[int, str], ...] = (),
    **params: Any,
) -> Request:
    """A scheduler :class:`Request` named ``name`` with ``SamplingParams(**params)``, as
    admission would hand it over. ``prompt``: its token ids, or how many (10, 11, 12, ...).

    Its outbox has room for a few outputs and no reader: a test looks at the request itself.
    """
    prompt_token_ids = tuple(range(10, 10 + prompt)) if isinstance(prompt, int) else tuple(prompt)
    send, _recv = trio.open_memory_channel(4)
    admit = Admit(
        request_id=RequestId(name),
        prompt_token_ids=prompt_token_ids,
        params=SamplingParams(**params),
        outbox=send,
        arrival_time=0.0,
        media_keys=media_keys,
    )
    return Request(admit, tuple(eos_token_ids))
