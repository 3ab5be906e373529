"""``vllm-mlx-trio bench prefix-lookup``: what a prefix-cache lookup costs the event loop.

The scheduler looks every request up in the cache manager's :class:`BlockPool`, on the event loop,
so a lookup's time is taken from every running stream. The pool here holds ``N`` conversations
that share a system prompt and the chat template's turn header after it, then go their own ways
(their full blocks and a tail at each end, as requests leave them); each row is the median time
of a lookup of a new conversation (a hit on the system prompt's blocks, then the token-granular
search among the children of the last one, which all start with the turn header), and of the
commit and release that follow it. Pure bookkeeping: no model runs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from ..core.prefix.block_pool import BlockPool
from ..messages import RequestId

#: The conversations' shared system prompt, in tokens (two 64-token blocks).
SYSTEM_TOKENS = 128
#: The chat template's tokens between the system turn and the user's text (``<|im_end|>``, a
#: newline, ``<|im_start|>user`` and so on): every conversation has them after the system prompt.
TURN_HEADER = (151645, 198, 151644, 872, 198)
#: Each conversation's own tokens after them.
OWN_TOKENS = 200
#: Token ids are drawn below this.
VOCAB = 32000


def conversation(system: tuple[int, ...], seed: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return system + TURN_HEADER + tuple(rng.randrange(VOCAB) for _ in range(OWN_TOKENS))


def filled_pool(num_conversations: int, block_size: int, system: tuple[int, ...]) -> BlockPool:
    """A pool holding every conversation's blocks and a tail at its end, none leased."""
    pool = BlockPool(block_size=block_size)
    for i in range(num_conversations):
        tokens, request_id = conversation(system, i), RequestId(f"held-{i}")
        pool.lookup(request_id, tokens)
        pool.commit(request_id, tokens, tail_at=len(tokens) - 1)
        pool.release([request_id])
    return pool


def lookup_row(num_conversations: int, *, block_size: int, lookups: int) -> dict:
    """Median ms of a new conversation's lookup, and of its commit and release, at this fill."""
    system = tuple(random.Random(-1).randrange(VOCAB) for _ in range(SYSTEM_TOKENS))
    pool = filled_pool(num_conversations, block_size, system)
    lookup_ms, commit_ms = [], []
    for j in range(lookups):
        tokens, request_id = conversation(system, 10**9 + j), RequestId(f"new-{j}")
        started = time.perf_counter()
        hit = pool.lookup(request_id, tokens)
        looked_up = time.perf_counter()
        pool.commit(request_id, tokens, tail_at=len(tokens) - 1)
        pool.release([request_id])
        commit_ms.append((time.perf_counter() - looked_up) * 1e3)
        lookup_ms.append((looked_up - started) * 1e3)
    return {
        "conversations": num_conversations,
        "cached_tokens": hit.num_cached_tokens,
        "lookup_ms": round(statistics.median(lookup_ms), 3),
        "commit_release_ms": round(statistics.median(commit_ms), 3),
    }


def run_prefix_lookup_command(cfg, args: argparse.Namespace) -> int:
    from .machine import machine_info
    from .report import format_section, write_json

    block_size = cfg.cache.block_size
    rows = [lookup_row(n, block_size=block_size, lookups=args.lookups) for n in args.conversations]
    notes = [
        f"conversations: a {SYSTEM_TOKENS}-token system prompt and a {len(TURN_HEADER)}-token turn header, "
        f"then {OWN_TOKENS} tokens of their own; "
        f"cache.block_size {block_size}; median of {args.lookups} lookups of new conversations",
        "cached_tokens: the last lookup's hit (the system prompt's blocks, then the tokens a child shares after them)",
    ]
    print(format_section("prefix-cache lookup on the event loop", rows, machine_info(), notes), flush=True)
    if args.json_path:
        write_json(args.json_path, {"kind": "prefix-lookup", "block_size": block_size, "rows": rows})
    return 0
