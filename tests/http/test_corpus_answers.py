"""The bad-input corpus's answers, byte for byte, against a recorded reference.

``test_bad_input_corpus`` checks each answer's shape; this one checks that every answer
(status, message, type, param, code) is exactly the one recorded in ``data/corpus_answers.json``,
so a change in how requests are parsed (hand-written checks -> declared schemas) cannot
change a single byte a client sees. Regenerate the reference only for a deliberate change:
``VLLM_MLX_TRIO_RECORD_CORPUS=1 pytest tests/http/test_corpus_answers.py``.
"""

from __future__ import annotations

import json
import os
import pathlib

import httpx
import trio
from test_bad_input_corpus import (
    CHAT,
    FORMER_BUGS,
    MODEL,
    Bad,
    _hypothesis_bodies,
    build_corpus,
    fake_server,
    post,
)

REFERENCE = pathlib.Path(__file__).parent / "data" / "corpus_answers.json"
RECORD_ENV = "VLLM_MLX_TRIO_RECORD_CORPUS"


def all_bad_requests() -> list[Bad]:
    """The corpus, the Hypothesis cases and the former bugs, in a fixed order."""
    bads = list(build_corpus())
    for field, value in _hypothesis_bodies():
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, field: value}
        bads.append(Bad(f"hypothesis: {field}", CHAT, json.dumps(body).encode(), 0))
    bads += [Bad(f"former bug {p.id}", CHAT, p.values[0], p.values[1]) for p in FORMER_BUGS]
    return bads


async def test_corpus_answers_are_unchanged(fake_cfg):
    bads = all_bad_requests()
    answers = []
    with trio.fail_after(120):
        async with fake_server(fake_cfg) as srv, httpx.AsyncClient(timeout=10) as http:
            for bad in bads:
                resp = await post(http, srv.url, bad)
                answers.append([resp.status_code, resp.content.decode()])
    if os.environ.get(RECORD_ENV):
        REFERENCE.write_text(json.dumps(answers, ensure_ascii=False, indent=0) + "\n")
    reference = json.loads(REFERENCE.read_text())
    assert len(reference) == len(bads)
    changed = [
        f"{bad.family}: {bad.body[:160]!r}\n  was {want}\n  now {got}"
        for bad, want, got in zip(bads, reference, answers, strict=True)
        if want != got
    ]
    assert not changed, f"{len(changed)} answers changed:\n" + "\n".join(changed[:10])
