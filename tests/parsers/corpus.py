"""The third-party fixture corpus: real model outputs per tool-parser family, as the public projects' own
parser tests record them (``tests/parsers/data/*.json``, each file names its sources), run through our
parsers whole and fed in 3-character pieces.

A case carries the source's expected answer. Where this project answers otherwise on purpose, the case is
``disputed``: it says why and gives the answer expected here. Accuracy counts matches with the source.

    python -m tests.parsers.corpus        # the per-family accuracy table
"""

from __future__ import annotations

import json
import logging
import pathlib
from collections.abc import Callable

import attrs

from vllm_mlx_trio.parsers import OutputParser, ParsedDelta, ParsedMessage, parse_text

DATA = pathlib.Path(__file__).parent / "data"
#: Size of the pieces the streamed run feeds (the measure the issue's figures use).
CHUNK_CHARS = 3


@attrs.frozen
class Case:
    family: str
    parser: str
    id: str
    source: str
    text: str
    tools: list
    expected: dict
    disputed: dict | None
    #: The reasoning parser the case's model runs with (its output starts inside the thinking block
    #: when ``starts_in_reasoning``), else None.
    reasoning_parser: str | None = None
    starts_in_reasoning: bool = False

    @property
    def name(self) -> str:
        return f"{self.parser}:{self.id}"

    def expected_here(self) -> dict:
        """The answer this project gives on purpose (the source's, unless disputed)."""
        return self.disputed["expected_here"] if self.disputed else self.expected


def load_cases() -> list[Case]:
    cases = []
    for path in sorted(DATA.glob("*.json")):
        data = json.loads(path.read_text())
        for raw in data["cases"]:
            cases.append(
                Case(
                    family=data["family"],
                    parser=data["parser"],
                    id=raw["id"],
                    source=raw["source"],
                    text=raw["text"],
                    tools=_tools(raw.get("tools", data["tools"]), data),
                    expected=raw["expected"],
                    disputed=raw.get("disputed"),
                    reasoning_parser=raw.get("reasoning_parser"),
                    starts_in_reasoning=raw.get("starts_in_reasoning", False),
                )
            )
    return cases


def _tools(tools: list | str, data: dict) -> list:
    """A case's tools: given, or the name of one of its file's ``tool_sets``."""
    return data["tool_sets"][tools] if isinstance(tools, str) else tools


def _parser_kwargs(case: Case) -> dict:
    return {
        "tool_parser": case.parser,
        "reasoning_parser": case.reasoning_parser,
        "tools": case.tools,
        "starts_in_reasoning": case.starts_in_reasoning,
    }


def run_whole(case: Case) -> ParsedMessage:
    return parse_text(case.text, **_parser_kwargs(case))


def run_chunked(case: Case, size: int = CHUNK_CHARS) -> tuple[list[ParsedDelta], ParsedMessage]:
    parser = OutputParser(**_parser_kwargs(case))
    deltas = [d for at in range(0, len(case.text), size) for d in parser.feed(case.text[at : at + size])]
    deltas += parser.finish()
    return deltas, parser.message()


def mismatch(message: ParsedMessage, expected: dict) -> str | None:
    """Why ``message`` is not ``expected`` (None when it is).

    Content is compared without the whitespace at its ends (whitespace next to markup is dropped by
    design); arguments as decoded JSON (a string in ``expected`` is compared as the raw text); a call's
    id only where the case gives one; reasoning only where the case gives it.
    """
    content = (message.content or "").strip()
    if content != (expected["content"] or "").strip():
        return f"content {content!r} != {(expected['content'] or '').strip()!r}"
    if "reasoning" in expected and (message.reasoning or "").strip() != expected["reasoning"].strip():
        return f"reasoning {message.reasoning!r} != {expected['reasoning']!r}"
    got, want = message.tool_calls, expected["calls"]
    if len(got) != len(want):
        return f"{len(got)} calls {[(c.name, c.arguments) for c in got]} != {len(want)} calls"
    for index, (call, spec) in enumerate(zip(got, want, strict=True)):
        problem = _call_mismatch(call.name, call.arguments, call.id, spec)
        if problem:
            return f"call {index}: {problem}"
    return None


def _call_mismatch(name: str, arguments: str, call_id: str, spec: dict) -> str | None:
    if name != spec["name"]:
        return f"name {name!r} != {spec['name']!r}"
    if isinstance(spec["arguments"], str):
        ok = arguments == spec["arguments"]
    else:
        try:
            ok = json.loads(arguments) == spec["arguments"]
        except ValueError:
            ok = False
    if not ok:
        return f"arguments {arguments!r} != {json.dumps(spec['arguments'], ensure_ascii=False)!r}"
    if "id" in spec and call_id != spec["id"]:
        return f"id {call_id!r} != {spec['id']!r}"
    return None


def deltas_mismatch(deltas: list[ParsedDelta], message: ParsedMessage) -> str | None:
    """The streamed pieces must add up to the message: each call's fragments to its exact arguments."""
    fragments: dict[int, str] = {}
    for delta in deltas:
        if delta.tool_index is not None:
            fragments[delta.tool_index] = fragments.get(delta.tool_index, "") + delta.arguments
    joined = [fragments[index] for index in sorted(fragments)]
    if joined != [call.arguments for call in message.tool_calls]:
        return f"streamed fragments {joined!r} != arguments {[c.arguments for c in message.tool_calls]!r}"
    return None


def outcomes(case: Case, expected: Callable[[Case], dict] = lambda case: case.expected) -> dict[str, str | None]:
    """Per run (``whole``, ``chunks3``): None if it gave the expected answer, else why not."""
    want = expected(case)
    deltas, streamed = run_chunked(case)
    return {
        "whole": mismatch(run_whole(case), want),
        f"chunks{CHUNK_CHARS}": mismatch(streamed, want) or deltas_mismatch(deltas, streamed),
    }


def accuracy_table(cases: list[Case]) -> str:
    """Per family: runs as the source expects (whole + chunked), and as expected here."""
    rows: dict[str, list[int]] = {}
    failures = []
    for case in cases:
        as_source = outcomes(case)
        as_here = outcomes(case, Case.expected_here) if case.disputed else as_source
        counts = rows.setdefault(case.family, [0, 0, 0, 0])
        counts[0] += sum(v is None for v in as_source.values())
        counts[1] += len(as_source)
        counts[2] += sum(v is None for v in as_here.values())
        counts[3] += int(case.disputed is not None)
        failures += [f"  {case.name} [{run}] {why}" for run, why in as_here.items() if why]
    lines = ["family          runs  as source        as expected here  disputed cases"]
    total = [0, 0, 0, 0]
    for family, counts in sorted(rows.items()):
        lines.append(_row(family, counts))
        total = [a + b for a, b in zip(total, counts, strict=True)]
    lines.append(_row("all", total))
    if failures:
        lines += ["not as expected here:", *failures]
    return "\n".join(lines)


def _row(family: str, counts: list[int]) -> str:
    ok, runs, here, disputed = counts
    return f"{family:<14} {runs:>5}  {ok:>4} ({ok / runs:6.1%})   {here:>4} ({here / runs:6.1%})   {disputed:>3}"


def main() -> None:
    logging.disable(logging.WARNING)  # the parsers' WARNINGs for markup that does not parse
    print(accuracy_table(load_cases()))


if __name__ == "__main__":
    main()
