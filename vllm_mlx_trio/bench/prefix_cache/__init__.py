"""``bench prefix-cache``: the prefix cache's pass/fail table and its TTFT against mlx_lm.server."""
