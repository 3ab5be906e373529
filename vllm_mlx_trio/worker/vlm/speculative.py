"""The ``vlm-speculative`` runner: the vlm runner with the speculative runner's rounds (MTP or a draft model).

A vision-language model served through the batched MLLM path, with speculation as a conservative greedy-only
optimisation: a request decodes in draft -> verify rounds only while it is alone in the batch, greedy
(``temperature = 0``, ``top_p = 1``, ``top_k = 0``, ``min_p = 0``), with no request-local logits processors
(core/speculative.py's envelope); anything else takes the vlm runner's normal path. Neither runner is changed: the
class composes them, so every step is one of the two:

* a media prompt is prefilled by the vlm runner (vision encode, then ``engine.mllm_prefill_step_size`` chunks
  beside the decoding rows) and joins the batch; once it decodes there and fits the envelope, the speculative
  runner takes its row out of the batch with its cache (the row's M-RoPE delta travels in its
  :class:`~vllm_mlx_trio.worker.vlm.cache.RopeKVCache`, so verify forwards place tokens where the batch would);
* a verify forward goes through the language model adapter (``LanguageAdapter``), whose final norm is the one the
  MTP head's hidden states are read at (``speculative.hidden_state_mode``); the hybrid Qwen3.5 cache rolls back
  through the speculative runner's cache transaction;
* a second request arriving sends the row back into the batch, media rows and text rows alike.

The MTP head is the checkpoint's ``mtp.*`` block, which ``mlx_vlm.load`` drops and the MTP drafter reads from the
files; a draft model must share the model's tokenizer (vision tokens included). Greedy output is the same with
speculation on or off: the target verifies every draft.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from ...core.speculative import sampling_fits
from ...runner_kinds import VLM_SPECULATIVE
from ..runner_base import LiveSequence
from ..speculative.drafter import CacheTransaction
from ..speculative.runner import SpecRunner
from .runner import VlmRunner

#: mlx-vlm's Gated DeltaNet module (Qwen3.5 and its MoE), whose forward picks the recurrence's algorithm.
GATED_DELTA_MODULE = "mlx_vlm.models.qwen3_5.gated_delta"


class VlmSpecRunner(SpecRunner, VlmRunner):
    """The vlm runner's steps, and speculative rounds for a request alone in the envelope.

    Method resolution puts the speculative runner's hooks first; each calls ``super()``, which is the vlm runner's
    (media prefill, media rows into the generator), then the batched runner's."""

    kind = VLM_SPECULATIVE

    def _fits(self, sequence: LiveSequence) -> bool:
        """The MLLM envelope: alone in the runner and greedy, whatever the drafter could sample (a sampled
        request takes the normal path), and the speculative runner's own conditions (no request-local logits
        processors, the thinking gate)."""
        greedy = sampling_fits(sequence.seq.params, sequence.num_output_tokens, sampled=False)
        return len(self._live) == 1 and greedy and super()._fits(sequence)

    def _verify(self, cache: list[Any], inputs: Any) -> tuple[Any, Any]:
        with sequential_delta_rule():
            return super()._verify(cache, inputs)

    def _transaction(self, cache: list[Any], inputs: Any) -> CacheTransaction:
        return _SequentialKeep(super()._transaction(cache, inputs))


class _SequentialKeep:
    """A cache transaction whose replay of the kept tokens runs the sequential recurrence too."""

    def __init__(self, transaction: CacheTransaction):
        self._transaction = transaction

    def keep(self, num_tokens: int) -> None:
        with sequential_delta_rule():
            self._transaction.keep(num_tokens)


@contextlib.contextmanager
def sequential_delta_rule() -> Iterator[None]:
    """Inside the block, mlx-vlm's Gated DeltaNet runs a forward of a few tokens (a verify of
    ``num_draft_tokens + 1``, or the replay of the kept ones) with the per-token recurrence its
    decode step runs, not its chunked prefill scan.

    Without MLX's Metal kernel mlx-vlm takes the chunked scan for any forward longer than one
    token: 64-token chunks with a 64-row triangular solve built row by row, ~8x a decode step for
    a 4-token verify on the CPU, which made speculation slower than decoding. The per-token
    recurrence is also what the batched path computes for the same tokens. MLX thread only: the
    module's function is swapped for the block."""
    module = sys.modules.get(GATED_DELTA_MODULE)
    if module is None:  # no Gated DeltaNet model loaded
        yield
        return
    chunked = module.gated_delta_chunked

    def per_token(q, k, v, g, beta, state, mask=None, C=64):
        return module.gated_delta_ops(q, k, v, g, beta, state, mask)

    module.gated_delta_chunked = per_token
    try:
        yield
    finally:
        module.gated_delta_chunked = chunked
