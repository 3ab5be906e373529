"""What a request constrains its output to, as pure data (compiled in ``structured/``).

A :class:`ConstraintSpec` travels in :class:`~.params.SamplingParams`; admission compiles it
(off the event loop) into a grammar the MLX thread enforces token by token. Nothing here
imports a grammar library: the compiled grammar is known only through :class:`CompiledGrammar`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal, Protocol

import attrs

ConstraintKind = Literal["json_object", "json_schema", "regex", "choice", "grammar", "tool_calls"]
CONSTRAINT_KINDS: tuple[str, ...] = ("json_object", "json_schema", "regex", "choice", "grammar", "tool_calls")


@attrs.frozen
class ConstraintSpec:
    """One request's output constraint."""

    kind: ConstraintKind
    #: json_schema: the schema as canonical JSON text; regex: the pattern; choice: a JSON list of strings;
    #: grammar: Lark text; tool_calls: a JSON list of the OpenAI tool objects that may be called; json_object: "".
    body: str
    #: tool_calls only: the tool parser's name (see parsers/) whose markup the forced calls use.
    tool_call_format: str | None = None
    #: tool_calls only: more than one call allowed (parallel_tool_calls).
    parallel: bool = True

    @property
    def key(self) -> str:
        """A hash of everything that shapes the compiled grammar (the compile cache's key)."""
        text = json.dumps([self.kind, self.body, self.tool_call_format, self.parallel])
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def canonical_json(value: Any) -> str:
    """JSON text without spaces, keys in the order given (a schema's property order is the
    output's): equal schemas give equal specs, hence one compile-cache entry."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


@attrs.frozen
class ReasoningMarkers:
    """The model's thinking block, which the grammar lets come before the constrained part."""

    start: str
    end: str
    #: The prompt already ends inside the thinking block (the template injected ``start``).
    starts_inside: bool = False


class CompiledGrammar(Protocol):
    """A compiled constraint as the MLX thread uses it (``structured.CompiledConstraint``)."""

    spec: ConstraintSpec

    def new_matcher(self) -> Any:
        """A fresh matcher at the grammar's start (one per running row; replay a resumed row's tokens)."""
        ...
