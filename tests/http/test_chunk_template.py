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


@pytest.mark.parametrize("model", ["demo:tiny", 'odd "model" \ue000text\ue000 name'])
def test_a_parsed_content_delta_comes_from_the_template_and_others_are_encoded_whole(model):
    """The parsed chat stream (a tool or reasoning parser on) sends its content deltas through the
    template too; a reasoning or tool-call delta, or one with the finish, is encoded whole."""
    builder = ResponseBuilder(chat=True, model=model)
    for text in TEXTS:
        assert builder.delta_chunk(1, {"content": text}) == _encoded(builder, 1, text)
    assert set(builder._templates) == {1}
    reasoning = builder.delta_chunk(0, {"reasoning_content": "hm"})
    assert json.loads(reasoning[len("data: ") :])["choices"][0]["delta"] == {"reasoning_content": "hm"}
    last = json.loads(builder.delta_chunk(0, {"content": "x"}, "stop")[len("data: ") :])["choices"][0]
    assert last["delta"] == {"content": "x"} and last["finish_reason"] == "stop"
    assert set(builder._templates) == {1}
