"""The prefix cache's MLX side: the block store, per-layer KV state, and the disk tier."""
