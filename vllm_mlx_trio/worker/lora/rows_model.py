"""The model as the batched runner's forwards see it when adapters are served: before each call it
sets every row's adapter slot (:class:`AdapterRows`) from the rows that forward runs.

mlx-lm's ``GenerationBatch`` calls ``model(tokens, cache=batch.prompt_cache)`` with its rows in
``batch.uids`` order; the runner's own prefill runs one prompt at a time. :class:`RowsModel` is
handed to both in place of the model; ``rows_of(cache)`` names the rows of the call (by the
cache it carries), so the slots follow the rows as mlx-lm filters and extends its batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .multi_linear import AdapterRows


class RowsModel:
    """``model`` whose every call first sets the rows' adapter slots (``rows_of(cache)``)."""

    def __init__(self, model: Any, rows: AdapterRows, rows_of: Callable[[Any], Sequence[int]]):
        self._model = model
        self._rows = rows
        self._rows_of = rows_of

    def __call__(self, inputs: Any, *args: Any, cache: Any = None, **kwargs: Any) -> Any:
        self._rows.set(self._rows_of(cache))
        try:
            return self._model(inputs, *args, cache=cache, **kwargs)
        finally:
            self._rows.clear()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)
