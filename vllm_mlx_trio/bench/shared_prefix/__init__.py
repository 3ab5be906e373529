"""``vllm-mlx-trio bench shared-prefix``."""
