"""The ceiling for benchmarks: mlx-lm's own generation loop, no server around it.

Runs on whatever thread calls it (the benchmark calls it before the engine starts, or on a
thread of its own); it never shares MLX state with an engine.
"""

from __future__ import annotations

import time

import attrs
import mlx.core as mx
from mlx_lm.generate import generate_step

from ..config import ModelConfig
from .loading import load_model


@attrs.frozen(kw_only=True)
class CeilingRun:
    """One greedy generation: its tokens and timings (seconds)."""

    token_ids: tuple[int, ...]
    num_prompt_tokens: int
    ttft_s: float
    total_s: float


def run_ceiling(model_cfg: ModelConfig, prompts: list[list[dict]], *, num_tokens: int) -> list[CeilingRun]:
    """Greedy-generate exactly ``num_tokens`` for each chat prompt with mlx-lm's loop."""
    model, tokenizer, _config = load_model(model_cfg)
    stream = mx.new_stream(mx.default_device())
    runs = []
    for messages in [prompts[0], *prompts]:  # the first prompt twice: one warm-up run
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer.encode(text, add_special_tokens=False)
        start = time.perf_counter()
        ttft, token_ids = 0.0, []
        for token, _logprobs in generate_step(
            mx.array(prompt_ids, dtype=mx.uint32), model, stream=stream, max_tokens=num_tokens
        ):
            if not token_ids:
                ttft = time.perf_counter() - start
            token_ids.append(int(token))
        runs.append(
            CeilingRun(
                token_ids=tuple(token_ids),
                num_prompt_tokens=len(prompt_ids),
                ttft_s=ttft,
                total_s=time.perf_counter() - start,
            )
        )
    return runs[1:]
