"""The drafter protocol: what the speculative runner asks of whatever proposes draft tokens.

A drafter serves the one sequence inside the speculative envelope (core/speculative.py) and lives on the MLX
thread. The speculative runner (worker/speculative/runner.py) owns the target side: one verify forward of
``[last, d1..dk]``, greedy acceptance, rolling the target's cache back; the drafter only proposes and keeps its own
state in step with what the target accepted.

The round, as the runner drives it::

    drafter.start(tokens, hidden)          # once, when the sequence enters speculation
    loop:
        drafts = drafter.propose(last, k)  # 0..k greedy drafts following ``last``
        verify [last, *drafts] in one target forward -> accepted drafts + one bonus token
        drafter.settle(accepted, hidden)   # accepted = accepted drafts + bonus
        last = accepted[-1]
    drafter.stop()                         # finished, cancelled, preempted, or the envelope broke

Hidden-state alignment (for drafters with ``needs_target_hidden``): row ``i`` of ``target_hidden`` is the target's
hidden state at the position whose logits produced token ``i`` of the tokens it goes with. In :meth:`Drafter.settle`
those tokens are ``accepted`` (so ``target_hidden`` has ``len(accepted)`` rows on its sequence axis, the last one
produced the bonus token); in :meth:`Drafter.start` the hidden states end at the last position in the target's cache,
whose logits produced the ``last_token`` of the first :meth:`Drafter.propose`. ``target_hidden`` has shape
``(1, n, hidden_size)``.

A :meth:`Drafter.propose` may return fewer than ``num_tokens`` drafts, none included (e.g. an MTP drafter entered
with ``target_hidden=None`` because the sequence came from the batched path, which keeps no hidden states); the
runner then verifies ``[last]`` alone, which is a plain decode step, and the following :meth:`Drafter.settle` carries
the hidden state.

What the speculative runner uses beside a drafter:

* :func:`drafter_loader` gives ``speculative.method``'s loader, ``load(cfg: EngineConfig, target_model, info:
  ModelInfo) -> Drafter``, called on the MLX thread after the target loaded; it imports the method's module only
  then (``"draft"``: worker/speculative/draft_model.py, ``"mtp"``: worker/speculative/mtp/drafter.py);
* a drafter with ``needs_target_hidden`` also has ``hidden_state_mode: str`` (resolved), and the runner then runs the
  verify forward through :func:`~vllm_mlx_trio.worker.speculative.hidden.target_forward` ``(model, inputs, cache, *,
  mode) -> (logits, hidden)`` (``inputs``: ``mx.array`` of shape ``(1, n)``; ``logits`` ``(1, n, vocab)``,
  ``hidden`` ``(1, n, hidden_size)``);
* for a target cache that is not trimmable,
  :func:`~vllm_mlx_trio.worker.speculative.cache_txn.open_transaction` ``(model, cache, inputs) -> CacheTransaction``,
  opened before the verify forward of ``inputs`` (a list of token ids); :meth:`CacheTransaction.keep` then leaves
  exactly the first ``n`` of them in the cache. A trimmable cache uses
  :class:`~vllm_mlx_trio.worker.speculative.runner.TrimTransaction` instead; a target whose cache can do neither is
  refused at load (:func:`~vllm_mlx_trio.worker.speculative.cache_txn.rollback_problem`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ...errors import ConfigError

if TYPE_CHECKING:
    import mlx.core as mx

#: ``load(cfg, target_model, info) -> Drafter``: builds a method's drafter for the loaded target.
DrafterLoader = Callable[[Any, Any, Any], "Drafter"]


def drafter_loader(method: str) -> DrafterLoader:
    """The loader of ``speculative.method``'s drafter; imports its module (MLX) only now."""
    if method == "draft":
        from .draft_model import load_draft_model_drafter

        return load_draft_model_drafter
    if method == "mtp":
        from .mtp.drafter import load_mtp_drafter

        return load_mtp_drafter
    raise ConfigError(f"speculative.method = {method!r} has no drafter")


class CacheTransaction(Protocol):
    """Opened on the target's cache just before a verify forward of ``inputs``."""

    def keep(self, num_tokens: int) -> None:
        """After the forward: leave the cache holding what it held before plus the first ``num_tokens`` inputs."""
        ...


class Drafter(Protocol):
    """Proposes draft tokens for the one sequence inside the speculative envelope; MLX thread only."""

    #: True: needs the target's hidden states (MTP); False: tokens are enough (a draft model).
    needs_target_hidden: ClassVar[bool]

    def start(self, tokens: Sequence[int], target_hidden: mx.array | None) -> None:
        """Enter speculation: ``tokens`` (prompt + output so far) are in the target's cache; ``target_hidden`` are the
        target's hidden states for (at least) the last of them, in the drafter's hidden_state_mode, or None when the
        runner has none (the sequence came from the batched path)."""
        ...

    def propose(self, last_token: int, num_tokens: int) -> list[int]:
        """Up to ``num_tokens`` greedy drafts following ``last_token`` (the target's latest token, not yet in the
        drafter's state). Fewer (even none) is allowed; the runner verifies what it gets."""
        ...

    def settle(self, accepted: Sequence[int], target_hidden: mx.array | None) -> None:
        """After verify: ``accepted`` are the accepted drafts followed by the bonus token (the target's own token at
        the first mismatch, or after the last draft). The target's cache now ends with ``last_token`` and the accepted
        drafts; the bonus is the next :meth:`propose`'s ``last_token``, in no cache yet. Roll the drafter's own state
        back/forward to match (ending just before the bonus)."""
        ...

    def stop(self) -> None:
        """The sequence left speculation (finished, cancelled, or the envelope broke): free per-sequence state."""
        ...


class LazyDrafter(Drafter, Protocol):
    """A drafter whose drafts can stay on the device, so a round syncs host and device once (the runner reads the
    drafts and the verdict together), and that can sample its drafts (speculative rejection sampling)."""

    def propose_lazy(self, last_token: int, num_tokens: int, pick: Any = None) -> mx.array:
        """:meth:`Drafter.propose` with the drafts left on the device: ``uint32`` of shape ``(n,)``. ``pick``
        (``logits (1, vocab) -> uint32 (1,)``) chooses each draft instead of the argmax: a sampled request's
        :meth:`~vllm_mlx_trio.worker.speculative.sampling.SpecSampler.pick`."""
        ...


class PipelinedDrafter(LazyDrafter, Protocol):
    """A lazy drafter whose next round can start before the host reads this one.

    The round, pipelined::

        drafts = drafter.propose_lazy(last, k)              # lazy uint32 (n,), evaluation started
        verify [last, *drafts] -> verdict (lazy)            # evaluation started
        drafter.draft_ahead(drafts, next_token, k')         # next round's drafts, if all n are accepted
        read drafts and verdict (the one sync)
        drafter.settle(accepted, hidden)                    # all accepted: the ahead drafts stand, else dropped
        drafts = drafter.propose_lazy(next_token, k')       # returns the ahead drafts when they stand
    """

    def draft_ahead(self, drafts: mx.array, bonus: mx.array, num_tokens: int, pick: Any = None) -> None:
        """Start the next round's ``num_tokens`` drafts after ``bonus`` (a lazy token) as if the coming
        :meth:`Drafter.settle` accepts all of ``drafts``; a settle that rejects any drops them."""
        ...
