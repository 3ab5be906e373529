"""The GPU check's summary: one table over the JSON files ``bench all --json`` wrote.

For each model and level, each of our paths' aggregate tokens/s next to mlx-lm's own loop at
the same level (``generate_step`` at 1, ``BatchGenerator`` at C) and their ratio,
``vs_ceiling``, as ``bench all`` computed it. Nothing is measured here.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterable

from ..machine import format_machine
from ..report import format_table

COLUMNS = ("model", "conc", "path", "agg_tok_s", "ceiling_tok_s", "vs_ceiling")


def model_label(path: str) -> str:
    """A model path's last part: the build directory's name (``qwen3-8b-shape``)."""
    return pathlib.PurePath(path).name or path


def summary_rows(payload: dict) -> list[dict]:
    """Our rows of one ``bench all`` payload, each beside its model's ceiling at its level.

    A ceiling section starts each model's sections (``run_all``'s order), so the sections
    after it are compared with it.
    """
    rows: list[dict] = []
    model, ceiling = None, {}
    for section in payload["sections"]:
        if section["kind"] == "ceiling":
            model = model_label(section["model"])
            ceiling = {row["conc"]: row["agg_tok_s"] for row in section["rows"]}
            continue
        rows += [_our_row(model, row, ceiling) for row in section["rows"]]
    return sorted(rows, key=lambda r: (r["model"] or "", r["conc"]))


def _our_row(model: str | None, row: dict, ceiling: dict[int, float]) -> dict:
    return {
        "model": model,
        "conc": row["conc"],
        "path": row["path"],
        "agg_tok_s": row.get("agg_tok_s"),
        "ceiling_tok_s": ceiling.get(row["conc"]),
        "vs_ceiling": row.get("vs_ceiling"),
    }


def machine_lines(payload: dict) -> list[str]:
    """The machine lines of each model's ceiling (the process that ran mlx-lm's loops)."""
    return [format_machine(s["machine"]) for s in payload["sections"] if s["kind"] == "ceiling"]


def format_summary(paths: Iterable[str | pathlib.Path]) -> tuple[str, bool]:
    """The summary of every payload that exists, and whether all did (a run cut short writes none)."""
    rows, lines, complete = [], [], True
    for path in paths:
        try:
            payload = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            lines.append(f"{path}: no results ({exc.__class__.__name__}): that run did not finish")
            complete = False
            continue
        lines += machine_lines(payload)
        rows += summary_rows(payload)
    title = "== GPU check: ours over mlx-lm's own loop at the same concurrency (vs_ceiling)"
    distinct = list(dict.fromkeys(lines))  # one machine, usually: said once
    return "\n".join([title, *distinct, format_table(rows, COLUMNS)]) + "\n", complete
