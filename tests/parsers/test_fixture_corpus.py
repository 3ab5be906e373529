"""The third-party fixture corpus (``tests/parsers/data``): every real model output parses as expected,
whole and fed in 3-character pieces, with each call's streamed fragments adding up to its arguments."""

from __future__ import annotations

import logging

import pytest

from .corpus import CHUNK_CHARS, Case, accuracy_table, load_cases, outcomes

CASES = load_cases()


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_case_parses_as_expected_whole_and_in_pieces(case: Case, caplog):
    with caplog.at_level(logging.ERROR):
        results = outcomes(case, Case.expected_here)
    assert results == {"whole": None, f"chunks{CHUNK_CHARS}": None}, case.source


@pytest.mark.parametrize("case", [c for c in CASES if c.disputed], ids=lambda case: case.name)
def test_a_disputed_case_says_why_and_really_differs_from_its_source(case: Case):
    assert len(case.disputed["reason"]) > 20
    assert case.disputed["expected_here"] != case.expected
    assert all(why is not None for why in outcomes(case).values())


def test_every_family_has_cases_from_named_sources():
    families = {case.parser for case in CASES}
    assert families == {"hermes", "qwen3_coder", "llama3_json", "mistral", "deepseek_v3", "kimi_k2", "glm45", "openai"}
    for family in families:
        assert sum(case.parser == family for case in CASES) >= 7, family
    assert all(":" in case.source for case in CASES)


def test_accuracy_table_lists_every_family():
    table = accuracy_table(CASES)
    assert "not as expected here" not in table
    for family in {case.family for case in CASES}:
        assert f"\n{family} " in table
