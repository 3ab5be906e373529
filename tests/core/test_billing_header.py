"""Claude Code's billing header: made stable at the start of a text, nowhere else."""

from __future__ import annotations

import pytest

from vllm_mlx_trio.core.billing_header import stable_billing_header

STABLE = "x-anthropic-billing-header: cc_version=2.1.37.000; cc_entrypoint=cli; cch=00000;"


@pytest.mark.parametrize(
    "header",
    [
        "x-anthropic-billing-header: cc_version=2.1.37.0d9; cc_entrypoint=cli; cch=fa690;",
        "x-anthropic-billing-header: cc_version=2.1.37.a1F; cc_entrypoint=cli; cch=36EE5;",
    ],
)
def test_every_request_gets_the_same_header(header):
    assert stable_billing_header(header) == STABLE
    assert stable_billing_header(header + "\nYou are Claude Code.") == STABLE + "\nYou are Claude Code."


def test_only_the_first_line_is_rewritten():
    text = "x-anthropic-billing-header: cc_version=2.1.37.0d9; cch=fa690;\nkeep cch=11111; cc_version=1.2.3.abc;"
    assert stable_billing_header(text).split("\n", 1)[1] == "keep cch=11111; cc_version=1.2.3.abc;"


@pytest.mark.parametrize(
    "text",
    [
        "You are Claude Code. x-anthropic-billing-header: cc_version=2.1.37.0d9; cch=fa690;",
        " x-anthropic-billing-header: cch=fa690;",
        "cch=fa690;",
        "",
    ],
)
def test_a_header_anywhere_but_the_start_is_left_alone(text):
    assert stable_billing_header(text) == text


def test_a_version_without_a_suffix_keeps_its_digits():
    text = "x-anthropic-billing-header: cc_version=2.1.100; cc_entrypoint=sdk-cli; cch=abcde;"
    assert (
        stable_billing_header(text)
        == "x-anthropic-billing-header: cc_version=2.1.100; cc_entrypoint=sdk-cli; cch=00000;"
    )
