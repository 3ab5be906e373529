"""The batched runner: continuous batching on mlx-lm's BatchGenerator, prefill, run-ahead plans."""
