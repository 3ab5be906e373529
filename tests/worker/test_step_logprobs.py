"""A step's logprobs are computed together: one ``_logprobs`` call for the whole step.

A row at a time cost a round trip to MLX's compute thread per token (several per step once plans
run ahead), so the runner gathers every requested logprob of a step first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm_mlx_trio import SamplingParams
from vllm_mlx_trio.messages import NewSequence, RequestId, StepPlan
from vllm_mlx_trio.testing.fake_executor import fake_logprob, letters_script
from vllm_mlx_trio.testing.fake_runner import FakeRunner


class CountingRunner(FakeRunner):
    """Records each ``_logprobs`` call as (tokens asked, their top counts)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    def _logprobs(self, rows: Sequence[Any], tokens: Sequence[int], num_tops: Sequence[int]):
        self.calls.append((tuple(tokens), tuple(num_tops)))
        return super()._logprobs(rows, tokens, num_tops)


def new_seq(rid: str, **params) -> NewSequence:
    params.setdefault("max_tokens", 50)
    return NewSequence(request_id=RequestId(rid), prompt_token_ids=(10, 11), params=SamplingParams(**params))


def test_one_call_for_the_whole_step():
    runner = CountingRunner(tokens_per_step=(3,))
    runner.load()
    seqs = [
        new_seq("a", logprobs=2),
        new_seq("b", logprobs=2),
        new_seq("c", logprobs=0),
        new_seq("d"),
        new_seq("e", logprobs=2, max_tokens=2),
    ]
    result = runner.execute(StepPlan(step_id=0, new_seqs=tuple(seqs)))
    runner.close()
    tokens = dict(result.sampled)
    assert len(tokens["a"]) == 3 and len(tokens["e"]) == 2  # e ends at max_tokens
    asked = tokens["a"] + tokens["b"] + tokens["c"] + tokens["e"]
    assert runner.calls == [(asked, (2, 2, 2, 2, 2, 2, 0, 0, 0, 2, 2))]
    logprobs = dict(result.logprobs)
    assert set(logprobs) == {"a", "b", "c", "e"}  # d asked for none
    for rid, top in (("a", 2), ("b", 2), ("c", 0), ("e", 2)):
        assert logprobs[rid] == tuple(fake_logprob(t, top) for t in tokens[rid])
    assert tokens["a"] == tuple(letters_script(seqs[0], i) for i in range(3))


def test_no_call_when_no_request_wants_logprobs():
    runner = CountingRunner(tokens_per_step=(2,))
    runner.load()
    result = runner.execute(StepPlan(step_id=0, new_seqs=(new_seq("a"), new_seq("b"))))
    runner.close()
    assert runner.calls == [] and result.logprobs == ()
