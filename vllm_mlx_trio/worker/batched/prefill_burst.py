"""Prompts that arrive together (a burst): each one's first token from its own prefill, decoding once all are in.

The runner prefills a burst's prompts back to back, one per plan (prefill.py). Were each one's last token fed
through ``BatchGenerator`` (generator_join.py), every plan would also run a decode step for the burst's earlier
rows: on a backend where each forward pays a fixed cost (reading the weights), those extra steps at partial batch
sizes cost about 5 % of a 5-prompt burst's throughput on ``demo:small`` against prefilling the burst together, as
mlx-lm does (docs/benchmarks.md, "Burst"). So while more of the burst waits, a prompt's last chunk takes its last token
too, the runner samples the first token from that forward's logits with the row's own sampler and emits it, and the
plan runs no decode step; the row joins the generator with that token to feed next. The burst's last prompt takes
the usual path, and its step decodes every row of the burst together.

Only prompts whose remainder fits ``limit`` tokens (``prefill_step_size``: the burst's earlier rows wait at most one
full prefill step's time for their second token), that protect no live stream (a stream that had its first token
before they arrived keeps its pace), whose row has no logits processors (they are applied in the generator's step),
on a cache whose position the attention layers tell (the prefix store checkpoints it where it stands), and never
when sharded (ranks must run the same steps).
"""

from __future__ import annotations

from collections.abc import Container

import mlx.core as mx

from .prefill import PrefillRow, PromptPrefill


def burst_continues(prefill: PromptPrefill, live: Container, limit: int) -> bool:
    """Whether prompts of the same burst wait behind the head: some are queued, none protects a live stream, and
    what is left of them fits ``limit`` tokens."""
    behind = prefill.behind_head
    if not behind or sum(row.left for row in behind) > limit:
        return False
    return not any(rid in live for row in behind for rid in row.live.seq.protects)


def sample_first(row: PrefillRow, sampler) -> tuple[mx.array, mx.array]:
    """The first token (uint32 ``(1,)``) sampled from the row's last-token logits, and its logprob row, evaluated."""
    assert row.first_logits is not None
    logprobs = row.first_logits - mx.logsumexp(row.first_logits, axis=-1, keepdims=True)
    token = sampler(logprobs).astype(mx.uint32)
    mx.eval(token, logprobs)
    return token, logprobs[0]
