"""The per-token SSE chunk from a template is byte for byte what encoding the whole chunk gives."""

from __future__ import annotations

import json

import pytest

from vllm_mlx_trio.http.openai.responses import ResponseBuilder, sse

TEXTS = ["hello", " world", 'quote " and \\ back', "new\nline\ttab", "é✓ 日本 😀", "\x00\x1f ctrl", "\ue000text\ue000"]


def _encoded(builder: ResponseBuilder, index: int, text: str) -> str:
    """What chunk() gave before the template: the whole envelope through json.dumps."""
    kind = "chat.completion.chunk" if builder.chat else "text_completion"
    if builder.chat:
        choice = {"index": index, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
    else:
        choice = {"index": index, "text": text, "logprobs": None, "finish_reason": None}
    return sse(builder._envelope(kind, [choice]))


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("model", ["demo:tiny", 'odd "model" \ue000text\ue000 name'])
def test_template_chunks_are_the_encoded_chunks(chat, model):
    builder = ResponseBuilder(chat=chat, model=model)
    for index in (0, 1):
        for text in TEXTS:
            got = builder.chunk(index, text)
            assert got == _encoded(builder, index, text)
            assert json.loads(got[len("data: ") :])["choices"][0]["index"] == index
    assert set(builder._templates) == {0, 1}  # the template path was taken, once per choice
