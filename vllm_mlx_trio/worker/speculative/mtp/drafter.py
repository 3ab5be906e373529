"""The MTP drafter: drafts with the target checkpoint's own multi-token-prediction head (worker/speculative/drafter.py).

The head (head.py for the Qwen3.5 / Qwen3-Next layout, head_deepseek.py for DeepSeek-V3's,
picked by :data:`MTP_LAYOUT_LOADERS`) maps (the target's hidden state at position ``i``, the token at ``i + 1``) to a
hidden state that predicts the token at ``i + 2``; it shares the target's embedding and output head (a DeepSeek-V3
checkpoint's own copies where they differ). The drafter keeps the
head's own attention cache in step with the target's cache, one entry per position, always fed with the *target's*
hidden states once they are known:

* :meth:`MTPDrafter.propose` runs the head ``k`` times from the pending (target) hidden and ``last``, feeding each
  step its own output hidden and its own draft (the chain is built lazily and evaluated once);
* :meth:`MTPDrafter.settle` trims the head's cache back to where the round started and forwards, in one call, the
  pairs the target has now confirmed: (pending hidden, ``last``) and (verify hidden of ``last``/``d_i``, ``d_i+1``)
  for the accepted drafts; the verify hidden that produced the bonus token becomes the pending hidden.

Drafts never change the output (the target verifies them); they only decide how many tokens a round yields.
MLX thread only.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import mlx.core as mx

from ....errors import ModelLoadError
from ..hidden import final_norm_owner, resolve_hidden_state_mode
from .head import MTPHead, load_mtp_head, text_config_of
from .head_deepseek import LoadedHead, Shared, load_deepseek_mtp
from .head_deepseek_v4 import load_deepseek_v4_mtp

if TYPE_CHECKING:
    from .batch import MTPBatch


class MTPDrafter:
    """Drafts for one sequence at a time with the target's MTP head (the ``Drafter`` protocol)."""

    needs_target_hidden: ClassVar[bool] = True

    def __init__(
        self,
        head: MTPHead | Any,
        embed: Callable[[mx.array], mx.array],
        lm_head: Callable[[mx.array], mx.array],
        *,
        hidden_state_mode: str,
    ):
        self.head = head
        self._embed = embed
        self._lm_head = lm_head
        #: The target hidden states this head wants (``post_norm`` / ``pre_norm``): the runner passes it to
        #: ``speculative.hidden.target_forward``.
        self.hidden_state_mode = hidden_state_mode
        self._cache = head.make_cache()
        self._pending: mx.array | None = None  # (1, 1, H): target hidden at the position before ``last``
        self._round: tuple[int, int] | None = None  # (head cache offset before propose, last token)

    @classmethod
    def for_target(cls, model: Any, model_dir: str | pathlib.Path, *, hidden_state_mode: str | None) -> MTPDrafter:
        """The drafter of a loaded target: its checkpoint's MTP head (the layout :func:`mtp_layout_loader` picks),
        sharing the target's embedding and head where the checkpoint does; ``hidden_state_mode`` is the config
        override (None: the model's, else ``post_norm``)."""
        config = json.loads((pathlib.Path(model_dir) / "config.json").read_text(encoding="utf-8"))
        head, embed, lm_head = mtp_layout_loader(config)(model_dir, config, shared_embedding_and_head(model))
        return cls(head, embed, lm_head, hidden_state_mode=resolve_hidden_state_mode(hidden_state_mode, config))

    @property
    def cached_positions(self) -> int:
        """How many positions the head's own cache holds (for tests and status)."""
        return self._cache[0].offset

    def start(self, tokens: Sequence[int], target_hidden: mx.array | None) -> None:
        self._cache = self.head.make_cache()
        self._pending, self._round = None, None
        if target_hidden is None or not tokens:
            return
        rows = min(int(target_hidden.shape[1]), len(tokens))
        if rows > 1:  # hidden at tokens[-rows + i] pairs with the token after it
            self._forward(list(tokens[len(tokens) - rows + 1 :]), target_hidden[:, -rows:-1])
        self._pending = target_hidden[:, -1:]

    def propose(self, last_token: int, num_tokens: int) -> list[int]:
        return self.propose_lazy(last_token, num_tokens).tolist()

    def propose_lazy(
        self, last_token: int, num_tokens: int, pick: Callable[[mx.array], mx.array] | None = None
    ) -> mx.array:
        """:meth:`propose` with the drafts left on the device (uint32 ``(n,)``); ``pick`` chooses each draft from
        the head's logits ``(1, vocab)`` (default: the argmax; a sampled request's sampler otherwise)."""
        self._round = (self.cached_positions, last_token)
        if self._pending is None or num_tokens <= 0:
            return mx.array([], dtype=mx.uint32)
        hidden, token = self._pending, mx.array([[last_token]], dtype=mx.int32)
        drafts = []
        for _ in range(num_tokens):
            hidden = self.head(self._embed(token), hidden, self._cache)
            logits = self._lm_head(hidden)[:, -1, :]
            chosen = mx.argmax(logits, axis=-1) if pick is None else pick(logits)
            token = chosen.astype(mx.int32).reshape(1, 1)
            drafts.append(token)
        return mx.concatenate(drafts, axis=1)[0].astype(mx.uint32)

    def settle(self, accepted: Sequence[int], target_hidden: mx.array | None) -> None:
        if not accepted:
            raise ValueError("settle needs at least the bonus token")
        start, last = self._round if self._round is not None else (self.cached_positions, None)
        self._round = None
        for layer_cache in self._cache:
            layer_cache.trim(layer_cache.offset - start)
        if target_hidden is None:  # nothing to pair the tokens with: resume once a hidden state comes
            self._pending = None
            return
        kept = len(accepted) - 1  # accepted drafts; row ``kept`` produced the bonus
        tokens, hiddens = list(accepted[:kept]), [target_hidden[:, :kept]]
        if self._pending is not None and last is not None:
            tokens, hiddens = [last, *tokens], [self._pending, *hiddens]
        if tokens:
            self._forward(tokens, mx.concatenate(hiddens, axis=1))
        self._pending = target_hidden[:, kept : kept + 1]

    def batch(self) -> MTPBatch | None:
        """The head's side of a speculative batch (worker/speculative/mtp/batch.py), or None when its cache does
        not roll back per row."""
        from mlx_lm.models.cache import KVCache

        from .batch import MTPBatch

        if not all(type(layer) is KVCache for layer in self.head.make_cache()):
            return None
        return MTPBatch(self.head, self._embed, self._lm_head, hidden_state_mode=self.hidden_state_mode)

    def stop(self) -> None:
        self._cache = self.head.make_cache()
        self._pending, self._round = None, None

    def _forward(self, tokens: list[int], hiddens: mx.array) -> None:
        """Write the pairs (hiddens[i], tokens[i]) into the head's cache, lazily: the next :meth:`propose` evaluates
        them with its drafts (one synchronisation per round), :meth:`stop` drops them unevaluated."""
        self.head(self._embed(mx.array([tokens], dtype=mx.int32)), hiddens, self._cache)


def _load_qwen_layout(model_dir: str | pathlib.Path, config: dict[str, Any], shared: Shared) -> LoadedHead:
    """Qwen3.5 / Qwen3-Next: a top-level ``mtp.*`` block; the embedding and the head are always the target's."""
    return load_mtp_head(model_dir, config), *shared


#: mlx-lm model type (after mlx-lm's own remapping: ``kimi_k2`` -> ``deepseek_v3``) -> the loader of its MTP layout.
#: Any other model type: the Qwen3.5 / Qwen3-Next layout.
MTP_LAYOUT_LOADERS: dict[str, Callable[[str | pathlib.Path, dict[str, Any], Shared], LoadedHead]] = {
    "deepseek_v3": load_deepseek_mtp,  # MTP layer = model.layers.{num_hidden_layers} (head_deepseek.py)
    "deepseek_v41": load_deepseek_v4_mtp,  # DeepSeek-V4: refused with the reasons (head_deepseek_v4.py)
}


def mtp_layout_loader(config: dict[str, Any]) -> Callable[[str | pathlib.Path, dict[str, Any], Shared], LoadedHead]:
    """The head loader for a checkpoint's ``config.json``."""
    from mlx_lm.utils import MODEL_REMAPPING

    model_type = text_config_of(config).get("model_type") or config.get("model_type")
    return MTP_LAYOUT_LOADERS.get(MODEL_REMAPPING.get(model_type, model_type), _load_qwen_layout)


def load_mtp_drafter(cfg: Any, target_model: Any, info: Any) -> MTPDrafter:
    """``[speculative] method = "mtp"``: the drafter of the loaded target (worker/speculative/drafter.py's
    ``drafter_loader``); ``cfg`` is the EngineConfig, ``info`` the target's ModelInfo."""
    from mlx_lm.utils import _download  # the local snapshot mlx_lm.load used (a hub id is cached by now)

    try:
        model_dir = _download(info.model_path, revision=cfg.model.revision)
    except Exception as exc:  # boundary: hub and filesystem errors
        raise ModelLoadError(f"could not find the checkpoint of {info.model_path!r}: {exc}") from exc
    return MTPDrafter.for_target(target_model, model_dir, hidden_state_mode=cfg.speculative.hidden_state_mode)


def shared_embedding_and_head(model: Any) -> tuple[Callable[[mx.array], mx.array], Callable[[mx.array], mx.array]]:
    """The target's token embedding and output head (its ``lm_head``, or the tied embedding)."""
    inner = final_norm_owner(model)
    embed = inner.embed_tokens
    for owner in (model, getattr(model, "language_model", None)):
        lm_head = getattr(owner, "lm_head", None)
        if lm_head is not None:
            return embed, lm_head
    return embed, embed.as_linear
