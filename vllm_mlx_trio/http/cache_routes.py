"""The prefix-cache routes: ``GET /v1/cache/stats`` and ``DELETE /v1/cache``.

Extensions, not OpenAI API: they expose the paged prefix cache's counters (since the server
started) and gauges (now), and drop every cached block that no running request holds.
"""

from __future__ import annotations

import quart

from ..actors.prefix.cache_manager import CacheStatistics
from ..engine import Engine


def register_cache_routes(app: quart.Quart, engine: Engine) -> None:
    block_size = engine.cfg.cache.block_size

    @app.get("/v1/cache/stats")
    async def cache_stats():
        return cache_stats_body(engine.statistics().cache, block_size=block_size)

    @app.delete("/v1/cache")
    async def clear_cache():
        return {"dropped_blocks": await engine.clear_prefix_cache()}


def cache_stats_body(stats: CacheStatistics, *, block_size: int) -> dict:
    """The JSON of ``GET /v1/cache/stats``; ``hit_rate`` counts full and partial hits."""
    pool = stats.pool
    return {
        "enabled": stats.enabled,
        "block_size": block_size,
        "queries": pool.num_queries,
        "hits": pool.num_hits,
        "prefix_hits": pool.num_prefix_hits,
        "misses": pool.num_misses,
        "hit_rate": hit_rate(pool.num_hits + pool.num_prefix_hits, pool.num_queries),
        "tokens_saved": pool.tokens_saved,
        "evictions": pool.num_evictions,
        "blocks": {
            "total": pool.num_blocks,
            "in_use": pool.num_in_use,
            "shared": pool.num_shared,
            "free": pool.num_free,
        },
        "memory": {
            "bytes_used": pool.bytes_used,
            "bytes_limit": pool.max_bytes,
            "max_blocks": pool.max_blocks,
            "over_budget": pool.over_budget,
        },
    }


def hit_rate(hits: int, queries: int) -> float:
    """Share of lookups that reused at least one block; 0.0 before the first lookup."""
    return round(hits / queries, 4) if queries else 0.0
