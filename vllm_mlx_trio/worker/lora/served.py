"""The batched runner's side of named adapters: load them onto the base, and name each forward's
rows' adapters (the request's ``SamplingParams.adapter``; None: the base)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from mlx_lm.models.cache import make_prompt_cache

from ...config import ModelConfig
from ...errors import ModelLoadError
from ..demo import is_demo_path
from ..demo.adapter import resolve_demo_adapter
from .install import install_adapters, read_adapter
from .rows_model import RowsModel


def adapter_folder(name: str, path: str, model_cfg: ModelConfig) -> str:
    """The folder of adapter ``name``: a demo adapter is built first."""
    if is_demo_path(path):
        try:
            return str(resolve_demo_adapter(path, model_cfg.demo_cache_dir))
        except ValueError as exc:
            raise ModelLoadError(f"model.adapters.{name}: {exc}") from exc
    return path


class ServedAdapters:
    """The adapters installed on one base model, and each one's slot."""

    def __init__(self, model: Any, model_cfg: ModelConfig):
        weights = {name: read_adapter(name, adapter_folder(name, path, model_cfg)) for name, path in model_cfg.adapters}
        self.rows, self.slots = install_adapters(model, weights)
        self._model = model

    @contextlib.contextmanager
    def applied(self, adapter: str | None) -> Iterator[None]:
        """Forwards of one row inside run ``adapter`` (the prefix store's recompute of a hit)."""
        self.rows.set([self.slot(adapter)])
        try:
            yield
        finally:
            self.rows.clear()

    def cache_or_new(self, cache: list[Any] | None) -> list[Any]:
        """``cache``, or an empty one for a row without a hit."""
        return cache if cache is not None else make_prompt_cache(self._model)

    def slot(self, adapter: str | None) -> int:
        """The slot of ``adapter`` (0: the base); admission let only served names through."""
        return 0 if adapter is None else self.slots[adapter]

    def for_generator(self, model: Any, generator: Any, adapter_of_uid: Callable[[int], str | None]) -> RowsModel:
        """The model the generator's batches call: the rows are the generation batch's (the only
        batch the runner's rows decode in: its own prefill feeds the prompts)."""

        def rows_of(cache: Any) -> list[int]:
            batch = generator._generation_batch
            if cache is not batch.prompt_cache:
                raise RuntimeError("adapters: a forward of rows outside the generation batch (mlx-lm's prompt path)")
            return [self.slot(adapter_of_uid(uid)) for uid in batch.uids]

        return RowsModel(model, self.rows, rows_of)

    def for_prefill(self, model: Any, adapter_of_head: Callable[[], str | None]) -> RowsModel:
        """The model the runner's own prefill calls: one prompt a call, the queue's head."""
        return RowsModel(model, self.rows, lambda _cache: [self.slot(adapter_of_head())])
