"""``vllm-mlx-trio parse-output``: show the assistant message the server builds from a model's raw text.

Users run it to see why a model's output did not parse: the text (stdin) goes through the same
streaming parser the server uses, whole or in N-character chunks.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any

from .errors import ConfigError

#: ``--tool-parser`` / ``--reasoning-parser`` values besides the parser names.
OFF, AUTO = "none", "auto"


def add_parse_output_parser(commands: Any) -> None:
    from .parsers import REASONING_PARSERS, TOOL_PARSERS

    cmd = commands.add_parser(
        "parse-output",
        help="parse a model's raw output (stdin) into the OpenAI assistant message",
        description=__doc__,
    )
    cmd.add_argument("--tool-parser", default=OFF, choices=[OFF, AUTO, *sorted(TOOL_PARSERS)])
    cmd.add_argument("--reasoning-parser", default=OFF, choices=[OFF, AUTO, *sorted(REASONING_PARSERS)])
    cmd.add_argument("--tools", type=pathlib.Path, help="JSON file: the request's `tools` list (types the values)")
    cmd.add_argument(
        "--chat-template", type=pathlib.Path, help="a chat template (.jinja) or tokenizer_config.json, for `auto`"
    )
    cmd.add_argument("--chunk-size", type=int, default=0, help="feed N characters at a time (default: whole)")
    cmd.add_argument(
        "--starts-in-reasoning",
        choices=["auto", "yes", "no"],
        default="auto",
        help="the prompt ended inside the thinking block (auto: a closer and no opener in the output)",
    )
    cmd.add_argument("--deltas", action="store_true", help="also print the streamed deltas, one JSON object a line")
    cmd.add_argument("--list", action="store_true", help="print the parser names and exit")


def run_parse_output(args: argparse.Namespace) -> int:
    from .parsers import REASONING_PARSERS, TOOL_PARSERS, OutputParser, reasoning_markers

    if args.list:
        print(json.dumps({"tool_parsers": sorted(TOOL_PARSERS), "reasoning_parsers": sorted(REASONING_PARSERS)}))
        return 0
    if args.chunk_size < 0:
        raise ConfigError("--chunk-size must be 0 (whole) or more")
    tool_parser, reasoning_parser = _resolve_names(args)
    text = sys.stdin.buffer.read().decode("utf-8")
    inside = args.starts_in_reasoning == "yes"
    if args.starts_in_reasoning == "auto" and reasoning_parser is not None:
        start, end = reasoning_markers(reasoning_parser)
        inside = end in text and start not in text
    parser = OutputParser(
        tool_parser=tool_parser,
        reasoning_parser=reasoning_parser,
        tools=_load_tools(args.tools),
        starts_in_reasoning=inside,
    )
    size = args.chunk_size or max(len(text), 1)
    deltas = [delta for at in range(0, len(text), size) for delta in parser.feed(text[at : at + size])]
    deltas += parser.finish()
    if args.deltas:
        for delta in deltas:
            print(
                json.dumps({k: v for k, v in _delta_fields(delta).items() if v not in ("", None)}, ensure_ascii=False)
            )
    print(json.dumps(openai_message(parser.message()), ensure_ascii=False, indent=2))
    return 0


def openai_message(message: Any) -> dict:
    """The OpenAI chat-completion assistant message of a :class:`ParsedMessage`."""
    return {
        "role": "assistant",
        "content": message.content,
        "reasoning_content": message.reasoning,
        "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in message.tool_calls
        ],
    }


def _delta_fields(delta: Any) -> dict:
    return {
        "content": delta.content,
        "reasoning": delta.reasoning,
        "tool_index": delta.tool_index,
        "tool_id": delta.tool_id,
        "tool_name": delta.tool_name,
        "arguments": delta.arguments,
    }


def _resolve_names(args: argparse.Namespace) -> tuple[str | None, str | None]:
    from .parsers import detect_reasoning_parser, detect_tool_parser

    template = _load_template(args.chat_template) if args.chat_template else None
    if AUTO in (args.tool_parser, args.reasoning_parser) and template is None:
        raise ConfigError("`auto` needs --chat-template (a .jinja file or tokenizer_config.json)")
    tool = detect_tool_parser(template) if args.tool_parser == AUTO else args.tool_parser
    reasoning = detect_reasoning_parser(template) if args.reasoning_parser == AUTO else args.reasoning_parser
    return (None if tool in (OFF, None) else tool), (None if reasoning in (OFF, None) else reasoning)


def _load_template(path: pathlib.Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix != ".json":
            return text
        template = json.loads(text).get("chat_template")
    except (OSError, ValueError, AttributeError) as exc:
        raise ConfigError(f"--chat-template {path}: {exc}") from exc
    if isinstance(template, list):  # named templates: [{"name": "default", "template": "..."}, ...]
        template = "\n".join(t.get("template", "") for t in template if isinstance(t, dict))
    if not isinstance(template, str):
        raise ConfigError(f"--chat-template {path}: no chat_template in it")
    return template


def _load_tools(path: pathlib.Path | None) -> list[dict] | None:
    if path is None:
        return None
    try:
        tools = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--tools {path}: {exc}") from exc
    if isinstance(tools, dict):  # a whole request body
        tools = tools.get("tools")
    if not isinstance(tools, list):
        raise ConfigError(f"--tools {path}: expected a JSON list of tools (or a request with `tools`)")
    return tools
