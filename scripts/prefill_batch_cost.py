"""Prefill cost per prompt when prompts are prefilled one at a time or batched together, on a demo model.

Decides whether a burst of fresh prompts gains from being prefilled in batched groups (mlx-lm's way) rather than
one by one (the runner's way, each first token as early as alone). For each ``--batch`` size, ``--tokens`` random
tokens a prompt from an empty cache, seconds divided by the prompts:

- ``logits``: the runner's burst chunk, the whole prompt with its last position's logits
  (``PromptPrefill._last_position_only``: the last decoder layer, final norm and head on that position only);
- ``cache``: what mlx-lm's ``BatchGenerator`` prefill evaluates, the prompt but its last token, cache only (that
  token then goes through a decode step of the whole batch).

Modes and batch sizes alternate within each repetition, so a slower minute of the machine weighs on all alike.

    python scripts/prefill_batch_cost.py --model demo:small --tokens 50 --batch 1,5 --repetitions 6
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.worker.batched.prefill import PromptPrefill
from vllm_mlx_trio.worker.loading import load_for_serving

#: ``logits``: the runner's burst chunk; ``cache``: mlx-lm's prefill (see the module's docstring).
MODES = ("logits", "cache")
#: Token ids drawn for the random prompts: inside every demo vocabulary, clear of the special tokens.
TOKEN_RANGE = (10, 500)


def per_prompt_s(model, prefill: PromptPrefill, batch: int, tokens: int, mode: str, rng: random.Random) -> float:
    prompts = mx.array([[rng.randrange(*TOKEN_RANGE) for _ in range(tokens)] for _ in range(batch)])
    cache = make_prompt_cache(model)
    started = time.perf_counter()
    if mode == "logits":
        with prefill._last_position_only(True):
            outputs = [model(prompts, cache=cache)]
    else:
        model(prompts[:, :-1], cache=cache)
        outputs = []
    mx.eval(outputs, [layer.state for layer in cache])
    return (time.perf_counter() - started) / batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="demo:small")
    parser.add_argument("--tokens", type=int, default=50)
    parser.add_argument("--batch", default="1,2,3,5", help="batch sizes, comma-separated")
    parser.add_argument("--repetitions", type=int, default=5)
    args = parser.parse_args()
    cfg = load_config(None, overrides=[f"model.path={args.model}"], environ={})
    model, _info = load_for_serving(cfg.model, cfg.engine)
    prefill = PromptPrefill(model, mx.default_stream(mx.default_device()))
    cases = [(mode, int(size)) for size in args.batch.split(",") for mode in MODES]
    rng = random.Random(0)
    for mode, size in cases:  # warm-up: each shape once
        per_prompt_s(model, prefill, size, args.tokens, mode, rng)
    runs: dict[tuple[str, int], list[float]] = {case: [] for case in cases}
    for _ in range(args.repetitions):
        for mode, size in cases:
            runs[mode, size].append(per_prompt_s(model, prefill, size, args.tokens, mode, rng))
    alone, (base_mode, base_size) = statistics.median(runs[cases[0]]), cases[0]
    print(f"model {args.model}, {args.tokens}-token prompts, {args.repetitions} repetitions; ms per prompt")
    for (mode, size), seconds in runs.items():
        median = statistics.median(seconds)
        spread = ", ".join(f"{s * 1000:.0f}" for s in seconds)
        ratio = f"{median / alone:.2f}x {base_mode} batch {base_size}"
        print(f"{mode:6} batch {size}: {median * 1000:.1f} ms ({spread}); {ratio}")


if __name__ == "__main__":
    main()
