"""Claude Code's billing header, made the same on every request so the prefix cache can reuse a
session's prompt. Pure: no Trio, no MLX.

Claude Code (since 2.1.36) puts one line at the start of its system prompt::

    x-anthropic-billing-header: cc_version=2.1.37.0d9; cc_entrypoint=cli; cch=fa690;

``cch`` (5 hex digits) and the last part of ``cc_version`` change with the request's content,
so the prompt differs from the previous turn's within its first ~40 tokens and no cached block
can be reused. It reaches every API the same way: Anthropic's ``system`` (its own first block),
chat completions' first ``system`` message (proxies flatten it there, as the first line) and the
Responses API's ``instructions``; each becomes the first system turn. Only that line, and only
at the very start of the first turn when it is a system (or developer) turn, is rewritten:
``cch`` becomes ``00000`` and the version's hex suffix ``000``. The same text anywhere else (a
user's message, a file the agent read) is never touched.
"""

from __future__ import annotations

import re

#: The header as the first line of a text (up to the end of the line).
BILLING_HEADER = re.compile(r"\Ax-anthropic-billing-header:[^\n]*")
#: The per-request hash, and the content-derived suffix of the client's version.
_CCH = re.compile(r"\bcch=[0-9a-fA-F]+")
_VERSION_SUFFIX = re.compile(r"\b(cc_version=\d+\.\d+\.\d+)\.[0-9a-fA-F]{3}(?=;)")
#: What they become.
STABLE_CCH = "cch=00000"
STABLE_VERSION_SUFFIX = "000"
#: The roles whose turn, first in the prompt, may carry the header.
SYSTEM_ROLES = frozenset({"system", "developer"})


def stable_billing_header(text: str) -> str:
    """``text`` with a billing header on its first line made the same on every request; any
    other text as it is."""
    match = BILLING_HEADER.match(text)
    if match is None:
        return text
    line = _CCH.sub(STABLE_CCH, match.group(0))
    line = _VERSION_SUFFIX.sub(rf"\g<1>.{STABLE_VERSION_SUFFIX}", line)
    return line + text[match.end() :]
