"""``vllm-mlx-trio bench agents``: the per-turn reuse table of the agent sessions."""

from __future__ import annotations

import argparse
from typing import Any

import attrs

#: A plain model (SmolLM2, 8k context) and a hybrid one (Qwen3.5-shaped: linear-attention layers
#: whose state is snapshotted, not paged); ``@compact`` runs the short sessions (2k context).
DEFAULT_MODELS = "demo:smollm2,demo:mtp-tiny@compact"


def run_agents_command(cfg, args: argparse.Namespace) -> int:
    import trio

    from ..machine import format_machine, machine_info
    from ..report import format_table, write_json
    from .run import reuse_summary

    sessions = [s for s in args.sessions.split(",") if s]
    targets = [f"{args.url}@{args.size}"] if args.url else [m for m in args.models.split(",") if m]
    tables: list[dict[str, Any]] = []
    lines = ["== agent sessions: prefix-cache reuse turn by turn", format_machine(machine_info())]
    for target in targets:
        rows = trio.run(_measure, cfg, target, sessions, args)
        tables.append({"target": target, "rows": rows})
        lines += [f"-- {target}", format_table(rows, list(rows[0])), f"lowest reused_pct: {reuse_summary(rows)}"]
    lines += [
        f"note: {args.turns} turns per session, max_tokens {args.max_tokens}, greedy; each turn replays the "
        "history as its client does (docs/benchmarks.md, 'Agent sessions'); reused_pct = cached_tokens over the "
        "previous turn's prompt + reply tokens; ttft_ms: request sent to the first streamed content event",
    ]
    print("\n".join(lines), flush=True)
    if args.json_path:
        write_json(args.json_path, {"tables": tables})
    return 0


async def _measure(cfg, target: str, sessions: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    from ...local_server import open_local_server

    path, _, size = target.partition("@")
    if args.url:
        return await _sessions(args.url, args.model or "default", sessions, args, size or args.size)
    model = attrs.evolve(cfg.model, path=path)
    server = attrs.evolve(cfg.server, port=0, accept_any_model_name=True)
    async with open_local_server(attrs.evolve(cfg, model=model, server=server)) as srv:
        return await _sessions(srv.url, path, sessions, args, size or args.size)


async def _sessions(
    url: str, model: str, sessions: list[str], args: argparse.Namespace, size: str
) -> list[dict[str, Any]]:
    from .run import run_session

    rows: list[dict[str, Any]] = []
    for kind in sessions:
        rows += await run_session(url, kind, model, turns=args.turns, max_tokens=args.max_tokens, size=size)
    return rows


def add_agents_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default=DEFAULT_MODELS, help=f"models served in turn (default {DEFAULT_MODELS})")
    parser.add_argument("--url", default=None, help="bench a running server instead (any checkout, any peer)")
    parser.add_argument("--model", default=None, help="with --url: the model name to send")
    parser.add_argument("--sessions", default="claude-code,codex,opencode", help="session shapes, in order")
    parser.add_argument("--turns", type=int, default=4, help="turns per session (default 4)")
    parser.add_argument("--max-tokens", type=int, default=48, help="reply tokens per turn (default 48)")
    parser.add_argument(
        "--size", choices=("full", "compact"), default="full", help="session texts where a model names none"
    )
    parser.add_argument("--json", dest="json_path", default=None, help="also write the rows here")
