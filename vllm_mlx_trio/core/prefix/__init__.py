"""The prefix cache's bookkeeping: block hashes, the block pool, its entries, leases and lookups (pure)."""
