"""Feeding text through the parsers in every chunking, and comparing messages without the random ids."""

from __future__ import annotations

import json
import random
import re

from vllm_mlx_trio.parsers import OutputParser, ParsedDelta, ParsedMessage, parse_text

#: Token-like pieces: a markup tag whole (special tokens are), else a word with its leading space, a run of
#: punctuation, or whitespace (roughly a byte-level BPE pre-tokenizer).
_TOKEN_LIKE = re.compile(r"<[|｜][^>]*?[|｜]>|<[^<>\s]{1,20}>|\[[A-Z_]+\]| ?\w+| ?[^\w\s<\[]+|\s+|.", re.DOTALL)


def chunkings(text: str, *, seed: int = 0) -> dict[str, list[str]]:
    """The text whole, in 1- and 2-char pieces, token-like pieces, and three random splits."""
    rng = random.Random(seed)
    out = {"whole": [text], "1": list(text), "2": [text[i : i + 2] for i in range(0, len(text), 2)]}
    out["tokens"] = _TOKEN_LIKE.findall(text)
    assert "".join(out["tokens"]) == text
    for round_ in range(3):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12)))) if len(text) > 1 else []
        out[f"random{round_}"] = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    return out


def stream(chunks: list[str], **kwargs) -> tuple[list[ParsedDelta], ParsedMessage]:
    parser = OutputParser(**kwargs)
    deltas = [delta for chunk in chunks for delta in parser.feed(chunk)]
    deltas += parser.finish()
    return deltas, parser.message()


def decoded(arguments: str) -> dict | str:
    """A call's arguments decoded (checked to be a JSON object), or as written with ``BROKEN:`` in front when they
    are not JSON (a streamed call whose markup broke keeps what was sent)."""
    try:
        args = json.loads(arguments)
    except ValueError:
        return "BROKEN:" + arguments
    assert isinstance(args, dict)
    return args


def shape(message: ParsedMessage) -> tuple:
    """The message without the random call ids; arguments decoded (see :func:`decoded`)."""
    return message.content, message.reasoning, [(call.name, decoded(call.arguments)) for call in message.tool_calls]


def from_deltas(deltas: list[ParsedDelta]) -> tuple:
    """What a streaming client builds from the deltas (OpenAI's accumulation by index)."""
    content = "".join(d.content for d in deltas) or None
    reasoning = "".join(d.reasoning for d in deltas) or None
    calls: dict[int, dict] = {}
    for d in deltas:
        if d.tool_index is None:
            continue
        call = calls.setdefault(d.tool_index, {"id": None, "name": None, "arguments": ""})
        if d.tool_id is not None:
            assert call["id"] is None, "id sent twice"
            call["id"] = d.tool_id
            call["name"] = d.tool_name
        call["arguments"] += d.arguments
    assert sorted(calls) == list(range(len(calls))), "call indexes are not 0, 1, ..."
    assert all(c["id"] and c["name"] for c in calls.values())
    return content, reasoning, [(c["name"], decoded(c["arguments"])) for _, c in sorted(calls.items())]


def check_all_chunkings(text: str, expected: tuple, **kwargs) -> None:
    """Whole and every chunking give ``expected``; the deltas add up to the message."""
    assert shape(parse_text(text, **kwargs)) == expected
    for name, chunks in chunkings(text).items():
        deltas, message = stream(chunks, **kwargs)
        assert shape(message) == expected, name
        assert from_deltas(deltas) == expected, name
        assert len({c.id for c in message.tool_calls}) == len(message.tool_calls)
