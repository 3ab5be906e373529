"""Compile constraint specs for one model: its llguidance tokenizer and a cache of grammars.

Compiling (``LLMatcher`` construction) builds the grammar's parser against the tokenizer:
about 1-2 ms for a JSON schema, more for a large one. It happens at admission, in a
preprocessing thread, so the MLX thread only copies a ready matcher (``deep_copy``).
"""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Callable
from typing import Any

import attrs
from llguidance import LLMatcher, LLTokenizer

from ..core.constraint import ConstraintSpec, ReasoningMarkers, canonical_json
from ..errors import InvalidRequestError
from .grammar import build_grammar

#: Compiled grammars kept per model. An entry holds a parser (tens of KB to a few MB for a
#: big schema); agent clients reuse a handful of schemas, so 128 keeps every one hot without
#: letting a client that sends a new schema per request grow memory without bound.
GRAMMAR_CACHE_SIZE = 128
#: llguidance logs grammar warnings to stderr at level 1; errors reach us through is_error().
LLG_LOG_LEVEL = 0


@attrs.frozen(eq=False)
class CompiledConstraint:
    """A spec compiled for one tokenizer: hand each running row :meth:`new_matcher`."""

    spec: ConstraintSpec
    reasoning: ReasoningMarkers | None
    #: The llguidance grammar (JSON text) the matcher was built from.
    grammar: str
    _template: LLMatcher = attrs.field(repr=False, alias="template")

    def new_matcher(self) -> LLMatcher:
        """A fresh matcher at the grammar's start (cheap: shares the compiled parser)."""
        return self._template.deep_copy()


def compile_constraint(
    spec: ConstraintSpec, *, reasoning: ReasoningMarkers | None, tokenizer: LLTokenizer | None = None
) -> CompiledConstraint:
    """Compile ``spec``; an invalid or unsupported one raises :class:`InvalidRequestError`
    naming the problem. Without a ``tokenizer`` the grammar is checked but cannot be run."""
    grammar = _build(spec, reasoning)
    if tokenizer is None:
        error = LLMatcher.validate_grammar(grammar)
        if error:
            raise _invalid(spec, error)
        return CompiledConstraint(spec, reasoning, grammar, template=None)
    matcher = LLMatcher(tokenizer, grammar, log_level=LLG_LOG_LEVEL)
    if matcher.is_error():
        raise _invalid(spec, matcher.get_error())
    return CompiledConstraint(spec, reasoning, grammar, template=matcher)


def _build(spec: ConstraintSpec, reasoning: ReasoningMarkers | None) -> str:
    try:
        return build_grammar(spec, reasoning)
    except InvalidRequestError:
        raise
    except (ValueError, TypeError) as exc:  # boundary: llguidance refusing a schema's shape
        raise _invalid(spec, str(exc)) from exc


#: The request field each kind comes from, for the 400's ``param``.
_PARAMS = {
    "json_object": "response_format",
    "json_schema": "response_format",
    "regex": "guided_regex",
    "choice": "guided_choice",
    "grammar": "guided_grammar",
    "tool_calls": "tools",
}
_WHAT = {
    "json_object": "JSON object format",
    "json_schema": "JSON schema",
    "regex": "regex",
    "choice": "choice list",
    "grammar": "grammar",
    "tool_calls": "tool schemas",
}


def _invalid(spec: ConstraintSpec, error: str) -> InvalidRequestError:
    if spec.kind == "tool_calls":
        culprit = _failing_tool(spec)
        if culprit is not None:
            name, reason = culprit
            return InvalidRequestError(
                f"Invalid or unsupported parameters schema for tool {name!r:.80}: {_first_line(reason)}",
                param="tools",
            )
    first_lines = "\n".join(error.strip().splitlines()[:6])
    return InvalidRequestError(f"Invalid or unsupported {_WHAT[spec.kind]}: {first_lines}", param=_PARAMS[spec.kind])


def _failing_tool(spec: ConstraintSpec) -> tuple[str, str] | None:
    """The first tool whose schema alone does not compile, and why (tool schemas come from
    clients as they are: Claude Code's and Codex's carry ``$schema``, ``format``...)."""
    try:
        tools = json.loads(spec.body)
    except ValueError:
        return None
    for tool in tools:
        alone = attrs.evolve(spec, body=canonical_json([tool]), parallel=False)
        try:
            error = LLMatcher.validate_grammar(build_grammar(alone, None))
        except (ValueError, TypeError, InvalidRequestError) as exc:
            error = str(exc)
        if error:
            return str(tool.get("function", {}).get("name", "?")), error
    return None


def _first_line(error: str) -> str:
    """The cause in llguidance's message (its first line names it; the rest quotes the grammar)."""
    return error.strip().splitlines()[0][:300] if error.strip() else error


def llg_tokenizer_from(tokenizer: Any, *, vocab_size: int, eos_token_ids: tuple[int, ...]) -> LLTokenizer:
    """The llguidance tokenizer of an mlx-lm ``TokenizerWrapper`` (or a Hugging Face fast
    tokenizer): built from its ``tokenizers`` JSON; ~1 s at a 151 k vocabulary."""
    backend = _tokenizers_backend(tokenizer)
    if backend is None:
        raise InvalidRequestError("Structured output needs a fast (tokenizers) tokenizer; this model has none.")
    return LLTokenizer(backend.to_str(), n_vocab=vocab_size, eos_token=list(eos_token_ids) or None)


def _tokenizers_backend(tokenizer: Any) -> Any:
    """The ``tokenizers.Tokenizer`` inside mlx-lm's wrapper or a Hugging Face fast tokenizer."""
    for _ in range(3):  # wrapper -> PreTrainedTokenizerFast -> tokenizers.Tokenizer
        if hasattr(tokenizer, "to_str"):
            return tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        tokenizer = backend if backend is not None else getattr(tokenizer, "_tokenizer", None)
    return tokenizer if hasattr(tokenizer, "to_str") else None


class ConstraintCompiler:
    """One model's compiler: the llguidance tokenizer (built on the first constrained request,
    not at startup) and an LRU of compiled grammars keyed by the spec's hash and the reasoning
    markers. Thread-safe: preprocessing threads share it."""

    def __init__(self, make_tokenizer: Callable[[], LLTokenizer], *, cache_size: int = GRAMMAR_CACHE_SIZE):
        self._make_tokenizer = make_tokenizer
        self._tokenizer: LLTokenizer | None = None
        self._cache: collections.OrderedDict[tuple, CompiledConstraint] = collections.OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.compiles = 0  # grammars compiled (cache misses), for tests and stats

    def compile(self, spec: ConstraintSpec, *, reasoning: ReasoningMarkers | None = None) -> CompiledConstraint:
        key = (spec.key, reasoning)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
            tokenizer = self._llg_tokenizer()
        compiled = compile_constraint(spec, reasoning=reasoning, tokenizer=tokenizer)  # outside the lock
        with self._lock:
            self.compiles += 1
            self._cache[key] = compiled
            self._cache.move_to_end(key)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def _llg_tokenizer(self) -> LLTokenizer:
        if self._tokenizer is None:
            self._tokenizer = self._make_tokenizer()
        return self._tokenizer

    @property
    def cached(self) -> int:
        return len(self._cache)
