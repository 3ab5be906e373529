"""``speculative.method = "draft"``: a separate, smaller model with the target's tokenizer proposes the drafts.

The drafter keeps its own KV cache of the sequence. Invariant after :meth:`DraftModelDrafter.settle`: the draft
cache, followed by :attr:`DraftModelDrafter._unfed` (tokens it has not run yet), holds exactly what the target's
cache holds. Drafting ``k`` tokens runs ``k`` one-token forwards (the first also runs the unfed tokens); rejected
drafts are trimmed off the cache afterwards, as mlx-lm's ``speculative_generate_step`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import attrs
import mlx.core as mx
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from ..errors import ModelLoadError
from .loading import load_model

#: Prompt tokens per draft forward when a sequence enters speculation (a bound on the activation memory).
DRAFT_PREFILL_STEP = 512


class DraftModelDrafter:
    """Greedy drafts from a draft model; one sequence at a time, MLX thread only."""

    needs_target_hidden: ClassVar[bool] = False

    def __init__(self, model: Any, *, prefill_step: int = DRAFT_PREFILL_STEP):
        self._model = model
        self._prefill_step = prefill_step
        self._cache: list[Any] | None = None
        self._unfed: list[int] = []
        self._drafts: list[int] = []

    def start(self, tokens: Sequence[int], target_hidden: mx.array | None) -> None:
        self._cache = make_prompt_cache(self._model)
        if not can_trim_prompt_cache(self._cache):
            raise ModelLoadError("the draft model's KV cache cannot be trimmed; pick a draft model without "
                                 "sliding-window or recurrent layers")  # fmt: skip
        tokens = list(tokens)
        while len(tokens) > self._prefill_step:
            self._model(mx.array([tokens[: self._prefill_step]]), cache=self._cache)
            mx.eval([c.state for c in self._cache])
            tokens = tokens[self._prefill_step :]
        self._unfed = tokens
        self._drafts = []

    def propose(self, last_token: int, num_tokens: int) -> list[int]:
        assert self._cache is not None, "start() first"
        self._drafts = []
        if num_tokens <= 0:
            self._unfed.append(last_token)
            return []
        inputs = mx.array([[*self._unfed, last_token]])
        self._unfed = []
        drafts = []
        for _ in range(num_tokens):
            logits = self._model(inputs, cache=self._cache)[:, -1, :]
            token = mx.argmax(logits, axis=-1)
            mx.async_eval(token)
            drafts.append(token)
            inputs = token[:, None]
        self._drafts = [int(t) for t in mx.concatenate(drafts).tolist()]
        return list(self._drafts)

    def settle(self, accepted: Sequence[int], target_hidden: mx.array | None) -> None:
        """The cache ran ``last`` and the drafts but the last one; keep ``last`` and the accepted drafts."""
        assert self._cache is not None, "start() first"
        num_accepted = len(accepted) - 1
        if not self._drafts:  # propose() drafted nothing: ``last`` is already in _unfed
            return
        if num_accepted == len(self._drafts):  # all accepted: the last draft was never run
            self._unfed = [self._drafts[-1]]
        else:
            trim_prompt_cache(self._cache, len(self._drafts) - 1 - num_accepted)
        self._drafts = []

    def stop(self) -> None:
        self._cache = None
        self._unfed = []
        self._drafts = []


def vocab_mismatch(target_tokenizer: Any, draft_tokenizer: Any, draft_vocab_size: int, vocab_size: int) -> str | None:
    """None if the draft model shares the target's tokenizer, else what differs."""
    target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if target_vocab != draft_vocab:
        differing = len(set(target_vocab.items()) ^ set(draft_vocab.items()))
        return f"its tokenizer differs from the model's ({len(draft_vocab)} vs {len(target_vocab)} tokens, " \
               f"{differing} entries differ)"  # fmt: skip
    if draft_vocab_size != vocab_size:
        return f"its vocabulary has {draft_vocab_size} rows, the model's {vocab_size}"
    return None


def load_draft_model_drafter(cfg: Any, target_model: Any, info: Any) -> DraftModelDrafter:
    """Load ``speculative.draft_model`` (a hub id, directory or ``demo:...``) and check it speaks the target's
    tokens; a mismatch is a :class:`ModelLoadError` at startup, never a garbled request later."""
    model_cfg = attrs.evolve(cfg.model, path=cfg.speculative.draft_model, chat_template=None)
    model, tokenizer, config = load_model(model_cfg)
    draft_vocab_size = int(config.get("vocab_size") or len(tokenizer.get_vocab()))
    mismatch = vocab_mismatch(info.tokenizer, tokenizer, draft_vocab_size, info.vocab_size)
    if mismatch is not None:
        raise ModelLoadError(
            f"speculative.draft_model {cfg.speculative.draft_model!r} cannot draft for {cfg.model.path!r}: {mismatch}"
        )
    return DraftModelDrafter(model)
