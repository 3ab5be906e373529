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

from ...core.speculative import sampling_fits
from ...runner_kinds import VLM_SPECULATIVE
from ..runner_base import LiveSequence
from ..speculative.runner import SpecRunner
from .runner import VlmRunner


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
