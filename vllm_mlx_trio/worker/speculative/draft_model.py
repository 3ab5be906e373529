"""``speculative.method = "draft"``: a separate, smaller model with the target's tokenizer proposes the drafts.

The drafter keeps its own KV cache of the sequence. Invariant after :meth:`DraftModelDrafter.settle`: the draft
cache, followed by :attr:`DraftModelDrafter._unfed` (tokens it has not run yet), holds exactly what the target's
cache holds. Drafting ``k`` tokens runs ``k`` one-token forwards (the first also runs the unfed tokens); rejected
drafts are trimmed off the cache afterwards, as mlx-lm's ``speculative_generate_step`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import mlx.core as mx
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from ...errors import ModelLoadError
from ..loading import load_model

if TYPE_CHECKING:
    from .draft_batch import DraftBatch

#: Chooses a draft from the draft model's logits ``(1, vocab)``: ``uint32`` of shape ``(1,)`` (sampled requests).
Pick = Callable[[mx.array], mx.array]
#: Prompt tokens per draft forward when a sequence enters speculation (a bound on the activation memory).
DRAFT_PREFILL_STEP = 512


@attrs.define(slots=True)
class _Ahead:
    """Drafts started for the next round before this round's verify was read, assuming it accepts every draft:
    the cache has also run the last draft, the bonus and all but the last of these."""

    drafts: mx.array
    confirmed: bool = False


class DraftModelDrafter:
    """Greedy drafts from a draft model; one sequence at a time, MLX thread only.

    Besides the :class:`~.drafter.Drafter` protocol it pipelines (:class:`~.drafter.PipelinedDrafter`):
    :meth:`propose_lazy` leaves the drafts on the device, and :meth:`draft_ahead` starts the next round's drafts
    from the verify's (lazy) bonus token, so the device never waits for the host between rounds.
    """

    needs_target_hidden: ClassVar[bool] = False

    def __init__(self, model: Any, *, prefill_step: int = DRAFT_PREFILL_STEP):
        self._model = model
        self._prefill_step = prefill_step
        self._cache: list[Any] | None = None
        self._unfed: list[int] = []
        self._num_drafts = 0  # this round's drafts: the cache ran ``last`` and all but the last of them
        self._ahead: _Ahead | None = None

    def start(self, tokens: Sequence[int], target_hidden: mx.array | None) -> None:
        self._cache = make_prompt_cache(self._model)
        if not can_trim_prompt_cache(self._cache):
            raise ModelLoadError(
                "the draft model's KV cache cannot be trimmed; pick a draft model without "
                "sliding-window or recurrent layers"
            )
        tokens = list(tokens)
        for start in range(0, len(tokens), self._prefill_step):
            # Only the cache is ever evaluated, so the output head never runs over the prompt's positions.
            self._model(mx.array([tokens[start : start + self._prefill_step]]), cache=self._cache)
            if start + self._prefill_step < len(tokens):  # the last chunk is evaluated with the first drafts
                mx.eval([c.state for c in self._cache])
        self._unfed = []
        self._num_drafts = 0
        self._ahead = None

    def propose(self, last_token: int, num_tokens: int) -> list[int]:
        return self.propose_lazy(last_token, num_tokens).tolist()

    def propose_lazy(self, last_token: int, num_tokens: int, pick: Pick | None = None) -> mx.array:
        """:meth:`propose`, the drafts left on the device (uint32, shape ``(n,)``, evaluation started); ``pick``
        chooses each draft from the logits (default: the argmax)."""
        assert self._cache is not None, "start() first"
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.confirmed:
            if ahead.drafts.size == num_tokens:  # started last round for exactly this: ``last_token`` is its bonus
                self._num_drafts = num_tokens
                return ahead.drafts
            trim_prompt_cache(self._cache, ahead.drafts.size)  # keep the last draft, drop the bonus and the rest
        self._num_drafts = max(0, num_tokens)
        if num_tokens <= 0:
            self._unfed.append(last_token)
            return mx.array([], dtype=mx.uint32)
        inputs = mx.array([[*self._unfed, last_token]], dtype=mx.uint32)
        self._unfed = []
        return self._draft(inputs, num_tokens, pick)

    def draft_ahead(self, drafts: mx.array, bonus: mx.array, num_tokens: int, pick: Pick | None = None) -> None:
        """Start the next round's ``num_tokens`` drafts after ``bonus`` (lazy: the verify's token after the last
        draft), as if :meth:`settle` will accept all of ``drafts`` (this round's, from :meth:`propose_lazy`)."""
        assert self._cache is not None and self._ahead is None, "one round ahead at most"
        if num_tokens <= 0 or self._num_drafts == 0:
            return
        inputs = mx.concatenate([drafts[-1:], bonus.reshape(1).astype(mx.uint32)])[None]
        self._ahead = _Ahead(self._draft(inputs, num_tokens, pick))

    def _draft(self, inputs: mx.array, num_tokens: int, pick: Pick | None) -> mx.array:
        drafts = []
        for _ in range(num_tokens):
            logits = self._model(inputs, cache=self._cache)[:, -1, :]
            token = mx.argmax(logits, axis=-1).astype(mx.uint32) if pick is None else pick(logits)
            mx.async_eval(token)
            drafts.append(token)
            inputs = token[:, None]
        return mx.concatenate(drafts)

    def settle(self, accepted: Sequence[int], target_hidden: mx.array | None) -> None:
        """The cache ran ``last`` and the drafts but the last one; keep ``last`` and the accepted drafts."""
        assert self._cache is not None, "start() first"
        num_accepted, num_drafts, self._num_drafts = len(accepted) - 1, self._num_drafts, 0
        if not num_drafts:  # propose() drafted nothing: ``last`` is already in _unfed
            return
        if num_accepted == num_drafts:  # all accepted: the last draft was never run, unless a round ahead ran it
            if self._ahead is not None:
                self._ahead.confirmed = True
            else:
                self._unfed = [accepted[-2]]
            return
        ahead_ran = 0 if self._ahead is None else self._ahead.drafts.size + 1
        self._ahead = None
        trim_prompt_cache(self._cache, ahead_ran + num_drafts - 1 - num_accepted)

    def batch(self) -> DraftBatch | None:
        """The draft model's side of a speculative batch (worker/speculative/draft_batch.py), or None when its cache
        does not roll back per row."""
        from .draft_batch import DraftBatch
        from .ragged import plain_attention

        return DraftBatch(self._model, prefill_step=self._prefill_step) if plain_attention(self._model) else None

    def stop(self) -> None:
        self._cache = None
        self._unfed = []
        self._num_drafts = 0
        self._ahead = None


def vocab_mismatch(target_tokenizer: Any, draft_tokenizer: Any, draft_vocab_size: int, vocab_size: int) -> str | None:
    """None if the draft model shares the target's tokenizer, else what differs."""
    target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if target_vocab != draft_vocab:
        differing = len(set(target_vocab.items()) ^ set(draft_vocab.items()))
        return (
            f"its tokenizer differs from the model's ({len(draft_vocab)} vs {len(target_vocab)} tokens, "
            f"{differing} entries differ)"
        )
    if draft_vocab_size != vocab_size:
        return f"its vocabulary has {draft_vocab_size} rows, the model's {vocab_size}"
    return None


def load_draft_model_drafter(cfg: Any, target_model: Any, info: Any) -> DraftModelDrafter:
    """Load ``speculative.draft_model`` (a hub id, directory or ``demo:...``) and check it speaks the target's
    tokens; a mismatch is a :class:`ModelLoadError` at startup, never a garbled request later."""
    # The target's adapter is the target's: the draft loads as it is.
    model_cfg = attrs.evolve(cfg.model, path=cfg.speculative.draft_model, chat_template=None, adapter_path=None)
    model, tokenizer, config = load_model(model_cfg)
    draft_vocab_size = int(config.get("vocab_size") or len(tokenizer.get_vocab()))
    mismatch = vocab_mismatch(info.tokenizer, tokenizer, draft_vocab_size, info.vocab_size)
    if mismatch is not None:
        raise ModelLoadError(
            f"speculative.draft_model {cfg.speculative.draft_model!r} cannot draft for {cfg.model.path!r}: {mismatch}"
        )
    return DraftModelDrafter(model)
