"""Incremental detokenizing and stop strings: pure, no Trio, no MLX."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from vllm_mlx_trio.core.text import IncrementalDetokenizer, StopStringMatcher
from vllm_mlx_trio.testing.fake_executor import FakeTokenizer

TOKENIZER = FakeTokenizer()


def stream_text(token_ids, chunk=1):
    detok = IncrementalDetokenizer(TOKENIZER)
    pieces = [detok.add(token_ids[i : i + chunk]) for i in range(0, len(token_ids), chunk)]
    return pieces + [detok.flush()]


def test_split_characters_are_held_back_not_replaced():
    ids = TOKENIZER.encode("a✓b日")
    pieces = stream_text(ids)
    assert "".join(pieces) == "a✓b日"
    assert all("\ufffd" not in p for p in pieces)
    assert pieces[1:3] == ["", ""]  # the first two bytes of ✓ emit nothing


def test_special_tokens_are_skipped():
    assert "".join(stream_text([*TOKENIZER.encode("hi"), 2])) == "hi"


@given(st.text(max_size=40), st.integers(min_value=1, max_value=5))
def test_streamed_text_equals_whole_decode(text, chunk):
    ids = TOKENIZER.encode(text)
    assert "".join(stream_text(ids, chunk)) == TOKENIZER.decode(ids, skip_special_tokens=True)


def feed_all(matcher, chunks):
    out = []
    for chunk in chunks:
        text, hit = matcher.feed(chunk)
        out.append(text)
        if hit:
            return "".join(out), True
    return "".join(out) + matcher.flush(), False


def test_stop_string_across_chunks_is_trimmed():
    assert feed_all(StopStringMatcher(("STOP",)), ["one ST", "O", "P two"]) == ("one ", True)


def test_partial_stop_is_released_when_ruled_out():
    matcher = StopStringMatcher(("STOP",))
    assert matcher.feed("one ST") == ("one ", False)
    assert matcher.feed("ART") == ("START", False)


def test_earliest_of_several_stops_wins():
    assert feed_all(StopStringMatcher(("b", "abc")), ["xxab", "c"]) == ("xxa", True)


@given(st.text(alphabet="abcS", max_size=30), st.lists(st.integers(1, 4), min_size=1, max_size=10))
def test_chunking_never_changes_the_result(text, cuts):
    chunks, i = [], 0
    while i < len(text):
        cut = cuts[len(chunks) % len(cuts)]
        chunks.append(text[i : i + cut])
        i += cut
    expected = (text[: text.index("Sab")], True) if "Sab" in text else (text, False)
    assert feed_all(StopStringMatcher(("Sab",)), chunks) == expected


def test_special_markup_is_spelled_out_and_other_special_tokens_stay_skipped():
    from types import SimpleNamespace

    from vllm_mlx_trio.core.text import ByteLevelDetokenizer, with_special_markup

    added = {
        0: SimpleNamespace(content="<|eot_id|>", special=True),
        1: SimpleNamespace(content="<|python_tag|>", special=True),
    }
    tokenizer = SimpleNamespace(added_tokens_decoder=added)
    table = (b"", b"", b"{", b"}")
    kept = with_special_markup(table, tokenizer, frozenset({"<|python_tag|>", "[TOOL_CALLS]"}))
    assert kept == (b"", b"<|python_tag|>", b"{", b"}")
    assert ByteLevelDetokenizer(kept).add([1, 2, 3, 0]) == "<|python_tag|>{}"
    assert with_special_markup(table, tokenizer, frozenset()) == table
