"""What the three agent clients send, turn after turn, written from their published behaviour.

Each session keeps its history the way its client does and builds the next request from it:

- Claude Code (``/v1/messages``): ``system`` blocks led by the billing header, whose ``cch``
  changes on every request; adaptive thinking with ``display: "omitted"``; the
  ``clear_thinking`` context-management edit; ``metadata.user_id`` as a JSON string; the
  assistant's blocks replayed as received; tool results as user turns.
- Codex CLI (``/v1/responses``): stateless (``store: false``, the whole history every turn),
  ``instructions``, a ``developer`` message, ``AGENTS.md`` and ``<environment_context>`` user
  items; ``function``, ``custom`` (``apply_patch`` with a Lark grammar), ``web_search`` and
  ``namespace`` tools; the output items replayed as received.
- OpenCode (``/v1/chat/completions``): several ``system`` messages (core prompt, environment,
  ``AGENTS.md``), ``tools``, ``stream_options.include_usage``; the assistant message replayed
  with its ``tool_calls``.

Tool schemas carry what these clients really put in them: ``$schema``,
``additionalProperties: false``, ``enum``, ``format: uri``, ``minLength``.
"""

from __future__ import annotations

import json
import random
from typing import Any

import attrs

#: Follow-up requests, one per turn after the first (a coding task, as the clients' users type them).
FOLLOW_UPS = (
    "Now run the tests and tell me which ones fail.",
    "Fix the failing test in tests/test_parser.py without changing the public API.",
    "Update the changelog with one line about the fix.",
    "Summarise what you changed in three bullet points.",
    "Check the README still describes the CLI flags correctly.",
)
FIRST_REQUEST = "Find the bug in src/parser.py that makes empty lines crash the tokenizer."


#: A file as a tool returns it: what most of an agent's prompt growth is made of.
def _file_text(lines: int) -> str:
    """A file as a tool returns it: what most of an agent's prompt growth is made of."""
    return "\n".join(
        f"{i:4d}  def rule_{i}(line):  # tokenizer rule {i}: split on whitespace, keep quoted runs"
        for i in range(1, lines + 1)
    )


def _core_prompt(rules: int) -> str:
    return " ".join(
        f"Rule {i}: read the relevant files before editing, keep changes minimal, run the tests, "
        "and explain what you did in plain words."
        for i in range(1, rules + 1)
    )


@attrs.frozen
class SessionTexts:
    """The long texts of a session: its system prompt's rules, and a file as tools return it."""

    core: str
    file: str


#: Sessions of a few thousand tokens; ``compact`` fits a 2,048-token context (the random demos'
#: byte-level tokenizers spend a token per character).
TEXTS = {"full": SessionTexts(_core_prompt(6), _file_text(8)), "compact": SessionTexts(_core_prompt(1), _file_text(1))}

_SCHEMA_URL = "http://json-schema.org/draft-07/schema#"


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "$schema": _SCHEMA_URL,
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


_PATH = {"type": "string", "minLength": 1, "description": "An absolute path."}
READ_SCHEMA = _schema({"file_path": _PATH, "limit": {"type": "integer", "minimum": 1}}, ["file_path"])
BASH_SCHEMA = _schema(
    {"command": {"type": "string", "minLength": 1}, "timeout": {"type": "number", "maximum": 600000}}, ["command"]
)
FETCH_SCHEMA = _schema(
    {"url": {"type": "string", "format": "uri"}, "mode": {"type": "string", "enum": ["text", "markdown"]}}, ["url"]
)
TOOL_SPECS = (
    ("Read", "Reads a file from the local filesystem.", READ_SCHEMA),
    ("Bash", "Executes a bash command and returns its output.", BASH_SCHEMA),
    ("WebFetch", "Fetches a URL and returns its content.", FETCH_SCHEMA),
)


def billing_header(rng: random.Random) -> str:
    """Claude Code's first system block: the version's 3-hex suffix and ``cch`` differ on every
    request (the release stays)."""
    return (
        f"x-anthropic-billing-header: cc_version=2.1.36.{rng.randrange(4096):03x}; "
        f"cc_entrypoint=cli; cch={rng.randrange(16**5):05x};"
    )


class ClaudeCodeSession:
    """``/v1/messages`` as Claude Code sends it."""

    path = "/v1/messages"

    def __init__(self, model: str, max_tokens: int, texts: SessionTexts = TEXTS["full"], seed: int = 0):
        self._texts = texts
        self._model = model
        self._max_tokens = max_tokens
        self._rng = random.Random(seed)
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": [self._reminder(FIRST_REQUEST)]}]

    @staticmethod
    def _reminder(text: str) -> dict[str, Any]:
        return {"type": "text", "text": f"<system-reminder>Today is a weekday.</system-reminder>\n{text}"}

    def request(self) -> tuple[dict[str, Any], dict[str, str]]:
        version = self._rng.randrange(1000)
        system = [
            {"type": "text", "text": billing_header(self._rng)},
            {
                "type": "text",
                "text": f"You are Claude Code. {self._texts.core}",
                "cache_control": {"type": "ephemeral"},
            },
        ]
        tools = [{"name": name, "description": about, "input_schema": schema} for name, about, schema in TOOL_SPECS]
        body = {
            "model": self._model,
            "max_tokens": self._max_tokens,
            "system": system,
            "messages": self.messages,
            "tools": tools,
            "thinking": {"type": "adaptive", "display": "omitted"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "metadata": {"user_id": json.dumps({"device_id": "d1", "session_id": "s1", "n": version})},
            "stream": True,
        }
        headers = {
            "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27",
            "anthropic-version": "2023-06-01",
            "x-claude-code-session-id": "s1",
        }
        return body, headers

    def add_reply(self, reply: dict[str, Any], turn: int) -> None:
        """The assistant's blocks as received, then the tool results or the next request."""
        blocks = reply["content"] or [{"type": "text", "text": ""}]
        self.messages.append({"role": "assistant", "content": blocks})
        calls = [block for block in blocks if block["type"] == "tool_use"]
        if calls:
            results = [{"type": "tool_result", "tool_use_id": c["id"], "content": self._texts.file} for c in calls]
            self.messages.append({"role": "user", "content": results})
        else:
            text = f"{FOLLOW_UPS[turn % len(FOLLOW_UPS)]}\n\nsrc/parser.py:\n{self._texts.file}"
            self.messages.append({"role": "user", "content": [self._reminder(text)]})


#: The shape of Codex's apply_patch grammar (a Lark ``format`` on a custom tool).
CODEX_LARK = (
    'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF\n'
    'end_patch: "*** End Patch" LF?\nhunk: /[^*].*/ LF\n%import common.LF\n'
)


class CodexSession:
    """``/v1/responses`` as Codex CLI sends it (stateless: the whole history every turn)."""

    path = "/v1/responses"

    def __init__(self, model: str, max_tokens: int, texts: SessionTexts = TEXTS["full"], seed: int = 0):
        self._texts = texts
        self._model = model
        self._max_tokens = max_tokens
        environment = "<environment_context><cwd>/work/app</cwd><shell>bash</shell></environment_context>"
        self.input: list[dict[str, Any]] = [
            _message(
                "developer",
                "<permissions instructions>Ask before writing outside the workspace.</permissions instructions>",
            ),
            _message("user", f"# AGENTS.md instructions for /work/app\n\n{texts.core}"),
            _message("user", environment),
            _message("user", FIRST_REQUEST),
        ]

    def request(self) -> tuple[dict[str, Any], dict[str, str]]:
        shell = {
            "type": "function",
            "name": "shell",
            "description": "Runs a command.",
            "strict": False,
            "parameters": BASH_SCHEMA,
        }
        patch = {
            "type": "custom",
            "name": "apply_patch",
            "description": "Edits files.",
            "format": {"type": "grammar", "syntax": "lark", "definition": CODEX_LARK},
        }
        github = {
            "type": "namespace",
            "name": "mcp__github__",
            "description": "GitHub tools.",
            "tools": [{"type": "function", "name": "fetch_page", "parameters": FETCH_SCHEMA}],
        }
        body = {
            "model": self._model,
            "instructions": "You are Codex, a coding agent running in a terminal.",
            "input": self.input,
            "tools": [shell, patch, {"type": "web_search"}, github],
            "tool_choice": "auto",
            "parallel_tool_calls": False,
            "reasoning": {"effort": "medium", "summary": "auto"},
            "store": False,
            "stream": True,
            "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "thread-1",
            "text": {"verbosity": "low"},
            "max_output_tokens": self._max_tokens,
        }
        return body, {}

    def add_reply(self, reply: dict[str, Any], turn: int) -> None:
        output = reply["output"]
        self.input.extend(output)
        calls = [item for item in output if item["type"] in ("function_call", "custom_tool_call")]
        for call in calls:
            kind = "function_call_output" if call["type"] == "function_call" else "custom_tool_call_output"
            self.input.append({"type": kind, "call_id": call["call_id"], "output": self._texts.file})
        if not calls:
            self.input.append(_message("user", f"{FOLLOW_UPS[turn % len(FOLLOW_UPS)]}\n\n{self._texts.file}"))


def _message(role: str, text: str) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


class OpenCodeSession:
    """``/v1/chat/completions`` as OpenCode (the AI SDK's openai-compatible provider) sends it."""

    path = "/v1/chat/completions"

    def __init__(self, model: str, max_tokens: int, texts: SessionTexts = TEXTS["full"], seed: int = 0):
        self._texts = texts
        self._model = model
        self._max_tokens = max_tokens
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": f"You are opencode, an interactive CLI tool. {texts.core}"},
            {
                "role": "system",
                "content": "Here is useful information about the environment: <env>cwd: /work/app</env>",
            },
            {"role": "system", "content": "Instructions from: /work/app/AGENTS.md\nUse pytest."},
            {"role": "user", "content": FIRST_REQUEST},
        ]

    def request(self) -> tuple[dict[str, Any], dict[str, str]]:
        tools = [
            {"type": "function", "function": {"name": name.lower(), "description": about, "parameters": schema}}
            for name, about, schema in TOOL_SPECS
        ]
        body = {
            "model": self._model,
            "messages": self.messages,
            "tools": tools,
            "tool_choice": "auto",
            "max_tokens": self._max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        return body, {}

    def add_reply(self, reply: dict[str, Any], turn: int) -> None:
        message = {"role": "assistant", "content": reply["content"]}
        if reply["tool_calls"]:
            message["tool_calls"] = reply["tool_calls"]
        self.messages.append(message)
        for call in reply["tool_calls"]:
            self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": self._texts.file})
        if not reply["tool_calls"]:
            self.messages.append(
                {"role": "user", "content": f"{FOLLOW_UPS[turn % len(FOLLOW_UPS)]}\n\n{self._texts.file}"}
            )


SESSIONS = {"claude-code": ClaudeCodeSession, "codex": CodexSession, "opencode": OpenCodeSession}
