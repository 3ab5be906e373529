"""Structured output: constraint specs compiled into llguidance grammars (no mlx here).

:func:`compile_constraint` turns a :class:`~..core.constraint.ConstraintSpec` into a
:class:`CompiledConstraint`; :class:`ConstraintCompiler` does it for one model, with its
tokenizer (built once, lazily) and a bounded cache of compiled grammars. The MLX side
(``worker/grammar_mask.py``) asks a compiled constraint for a fresh matcher per row.
"""

from .compiler import (
    GRAMMAR_CACHE_SIZE,
    CompiledConstraint,
    ConstraintCompiler,
    compile_constraint,
    llg_tokenizer_from,
)
from .grammar import build_grammar
from .tools import TOOL_CALL_FORMATS

__all__ = [
    "GRAMMAR_CACHE_SIZE",
    "TOOL_CALL_FORMATS",
    "CompiledConstraint",
    "ConstraintCompiler",
    "build_grammar",
    "compile_constraint",
    "llg_tokenizer_from",
]
