"""The prefix cache's actor side: the cache manager actor, the scheduler's client of it, and KV events."""
