"""Moving one sequence between mlx-lm's ``BatchGenerator`` and the speculative path, on the MLX thread.

A decoding row of the generator holds, in its KV cache, the prompt and every token it has emitted, and has already
sampled (asynchronously) its next token, not yet emitted: the *pending* token. The speculative path keeps the same
shape (:class:`SpecSequence`), so a sequence moves either way without running the model:

* out of the batch: the row's cache is extracted, its pending token read, the row removed;
* back into the batch: the pending token becomes a one-token "prompt" on top of the cache, so the generator runs it
  and samples the next token, exactly as if the row had never left. The runner emits the pending token itself.

mlx-lm's generator has no public reader of a row's pending token; :func:`take_from_batch` reads it from the
generation batch (mlx-lm 0.32.2), in this one place.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import attrs
from mlx_lm.generate import BatchGenerator, StopSequences

from ..sampling import Sampler, greedy

if TYPE_CHECKING:
    from .sampling import SpecSampler


@attrs.define(slots=True, eq=False)
class SpecSequence:
    """A sequence on the speculative path: the target's cache holds prompt + emitted tokens; ``pending`` is the
    target's next (greedy) token, computed but neither emitted nor in the cache."""

    cache: list[Any]
    pending: int
    #: Whether the last round accepted every draft: only then does a pipelined drafter draft a round ahead.
    all_accepted: bool = True
    #: A sampled request's drafting and verdict (its filters, temperature and PRNG key); None: greedy.
    sampler: SpecSampler | None = None


def take_from_batch(generator: BatchGenerator, uid: int) -> SpecSequence:
    """Take a decoding row out of the generator, with its cache and pending token."""
    batch = generator._generation_batch  # private: the pending token has no public reader
    index = batch.uids.index(uid)
    pending = int(batch._next_tokens[index].item())
    cache, _tokens = generator.extract_cache([uid])[uid]
    generator.remove([uid])
    return SpecSequence(cache=cache, pending=pending)


def put_into_batch(
    generator: BatchGenerator,
    spec: SpecSequence,
    cached_tokens: list[int],
    max_tokens: int,
    stop_ids: Iterable[int],
    sampler: Sampler = greedy,
) -> int:
    """Give the sequence back to the generator with its ``sampler`` (no processors: the envelope held); its uid.

    ``cached_tokens`` are the tokens the cache holds; ``max_tokens`` counts the tokens after ``pending``.
    """
    stop = StopSequences([[t] for t in sorted(stop_ids)] or None)
    (uid,) = generator.insert(
        [[spec.pending]],
        caches=[spec.cache],
        all_tokens=[cached_tokens],
        max_tokens=[max_tokens],
        samplers=[sampler],
        logits_processors=[[]],
        stop_sequences=[stop],
    )
    return uid
