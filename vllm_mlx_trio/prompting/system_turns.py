"""System and developer turns as a chat template can take them.

Agent clients send what strict templates refuse or drop: OpenAI's ``developer`` role (Codex,
the Responses API), which most templates do not know and silently leave out of the prompt,
and several ``system`` turns (OpenCode sends its core prompt, the project's AGENTS.md and
plugin texts as separate ones; Codex's ``instructions`` plus its developer items), which Qwen's
newer templates answer with "System message must be at the beginning".

:func:`developer_as_system` maps ``developer`` to ``system`` for a template that does not name
the role. :func:`merged_system_turns` moves every system turn's text, in order, into one
system turn at the front; admission renders with it only when the template refused the turns
as sent, so templates that take several system turns see exactly what the client sent.
"""

from __future__ import annotations

import attrs

from ..chat_messages import ChatMessage, TextPart

#: Between two system turns' texts when they become one.
SYSTEM_TEXT_SEPARATOR = "\n\n"


def developer_as_system(messages: tuple[ChatMessage, ...], template_source: str | None) -> tuple[ChatMessage, ...]:
    """``developer`` turns as ``system`` ones, unless the template handles the role itself
    (its source mentions ``developer``, as gpt-oss's harmony template does)."""
    if template_source is not None and "developer" in template_source:
        return messages
    return tuple(attrs.evolve(m, role="system") if m.role == "developer" else m for m in messages)


def merged_system_turns(messages: tuple[ChatMessage, ...]) -> tuple[ChatMessage, ...] | None:
    """One system turn at the front holding every system turn's text in order, the other turns
    as they were; None when there is nothing to merge (at most one system turn, and first) or a
    system turn holds more than text."""
    positions = [i for i, m in enumerate(messages) if m.role == "system"]
    if not positions or positions == [0]:
        return None
    systems = [messages[i] for i in positions]
    if any(m.text is None for m in systems):
        return None
    text = SYSTEM_TEXT_SEPARATOR.join(m.text for m in systems if m.text)
    rest = tuple(m for m in messages if m.role != "system")
    return (ChatMessage(role="system", content=(TextPart(text=text),)), *rest)
