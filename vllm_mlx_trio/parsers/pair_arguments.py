"""Arguments written as key/value tags, streamed as JSON members (``qwen3_coder``, ``glm45``).

Each pair goes out once its closing tag is seen, typed by the tool's schema, as a member of the JSON
object: ``{"city": "Paris"``, then ``, "days": 3``, and ``}`` when the call's markup ends. The fragments
make exactly the text ``json.dumps`` writes of the same arguments, so they concatenate to the call's
final ``arguments``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any


class PairArguments:
    """Reads one call's key/value tags as they arrive (see the module's docstring)."""

    #: Arguments built from tags are never "done" before their call's markup ends.
    done = False

    def __init__(self, pair: re.Pattern, last_pair: re.Pattern, value: Callable[[str, str], tuple[str, Any]]) -> None:
        """``pair`` matches a whole pair (its closing tag seen), ``last_pair`` one cut by the end of the
        call's markup; ``value`` gives (key, typed value) from a match's two groups."""
        self._pair = pair
        self._last_pair = last_pair
        self._value = value
        self._sent = False

    def take(self, text: str, *, final: bool = False) -> tuple[str, int]:
        """(fragment to send, characters of ``text`` read): every whole pair at the start of ``text``; with
        ``final`` (the call's markup ended) a last pair without its closing tag too."""
        pos, members = 0, []
        while True:
            match = self._pair.match(text, pos) or (self._last_pair.match(text, pos) if final else None)
            if match is None or match.end() == pos:
                return "".join(members), pos
            key, value = self._value(match.group(1), match.group(2))
            opening = ", " if self._sent else "{"
            members.append(f"{opening}{json.dumps(key, ensure_ascii=False)}: {json.dumps(value, ensure_ascii=False)}")
            self._sent = True
            pos = match.end()

    def close(self) -> str:
        return "}" if self._sent else "{}"
