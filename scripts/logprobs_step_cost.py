"""What asking for logprobs costs a batch of streams, in-process: time per token with and without.

Drives the batched runner directly on the MLX thread's code (no Trio, no HTTP): ``--streams`` fresh
50-token prompts decode ``--tokens`` tokens each through ``BatchRunner.execute`` (run-ahead plans, as
the server runs them), once with ``logprobs`` unset and once with ``--top`` alternatives asked, the
two alternating within each repetition so a slower minute of the machine weighs on both. Prints each
repetition's ratio (with logprobs over without) and their median. Before a step's logprobs were read
back together (worker/sampling.py, ``token_logprobs``) it read 1.16-1.39 on demo:tiny with 4 streams
(1.03-1.11 after; docs/benchmarks.md, tenth round).

    python scripts/logprobs_step_cost.py --model demo:tiny --streams 4 --repetitions 6
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.core.params import SamplingParams
from vllm_mlx_trio.messages import NewSequence, RequestId, StepPlan
from vllm_mlx_trio.worker.batched.runner import BatchRunner

#: Token ids drawn for the random prompts: inside every demo vocabulary, clear of the special tokens.
TOKEN_RANGE = (10, 500)
#: Tokens every stream has before the timing starts (the prompt's prefill is not what is measured).
SETTLE_TOKENS = 8


class Streams:
    """Runs bursts of streams through one runner, numbering requests and plans."""

    def __init__(self, runner: BatchRunner, args: argparse.Namespace):
        self.runner, self.args = runner, args
        self.rng = random.Random(0)
        self.step_id = 0
        self.burst_id = 0

    def _prompt(self) -> tuple[int, ...]:
        return tuple(self.rng.randrange(*TOKEN_RANGE) for _ in range(50))

    def _execute(self, **plan) -> dict[RequestId, int]:
        result = self.runner.execute(StepPlan(step_id=self.step_id, **plan))
        self.step_id += 1
        return {rid: len(tokens) for rid, tokens in result.sampled}

    def ms_per_token(self, logprobs: int | None) -> float:
        """One burst: every stream to ``--tokens``; wall ms per token after the settle tokens."""
        self.burst_id += 1
        params = SamplingParams(temperature=0.0, max_tokens=self.args.tokens, ignore_eos=True, logprobs=logprobs)
        rids = [RequestId(f"b{self.burst_id}.{i}") for i in range(self.args.streams)]
        seqs = tuple(NewSequence(request_id=rid, prompt_token_ids=self._prompt(), params=params) for rid in rids)
        got = dict.fromkeys(rids, 0)
        plan: dict = {"new_seqs": seqs}
        started = counted = None
        while min(got.values()) < self.args.tokens:
            for rid, n in self._execute(**plan).items():
                got[rid] += n
            plan = {"decode_ids": tuple(r for r in rids if got[r] < self.args.tokens)}
            if started is None and min(got.values()) >= SETTLE_TOKENS:
                started, counted = time.perf_counter(), sum(got.values())
        elapsed = time.perf_counter() - started
        self._execute(finished_ids=tuple(rids))
        return elapsed * 1000 / (sum(got.values()) - counted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="demo:tiny")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--top", type=int, default=0, help="top_logprobs asked (0: the sampled token's only)")
    parser.add_argument("--repetitions", type=int, default=6)
    args = parser.parse_args()
    cfg = load_config(None, overrides=[f"model.path={args.model}", "cache.enabled=false"], environ={})
    runner = BatchRunner(cfg)
    runner.load()
    streams = Streams(runner, args)
    try:
        streams.ms_per_token(None), streams.ms_per_token(args.top)  # warm-up
        ratios = []
        for rep in range(args.repetitions):
            without, with_logprobs = streams.ms_per_token(None), streams.ms_per_token(args.top)
            ratios.append(with_logprobs / without)
            print(f"rep {rep}: {without:.3f} ms/token without, {with_logprobs:.3f} with logprobs ({ratios[-1]:.2f}x)")
        print(f"median with / without: {statistics.median(ratios):.2f}x (spread {min(ratios):.2f}-{max(ratios):.2f})")
    finally:
        runner.close()


if __name__ == "__main__":
    main()
