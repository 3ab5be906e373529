"""``bench ceiling``: mlx-lm's own loops, the figures the engine is measured against."""
