"""The one-row decode path (worker/single_row.py) on the real demo model: a row alone in the batch decodes
outside the generator's batch machinery, and what it produces (tokens, logprobs, finishes at max_tokens, a stop
token or a stop string, seeded draws, a preempted request's resumption) is what the generator gives; a second
request arriving mid-stream, or the row being cancelled, hands the batch back as it was."""

from __future__ import annotations

from collections import defaultdict

import pytest
import trio

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.messages import NewSequence, RequestId, StepPlan
from vllm_mlx_trio.worker.batch_runner import BatchRunner
from vllm_mlx_trio.worker.single_row import SingleRow

pytestmark = pytest.mark.mlx

TIMEOUT_S = 240
EOS = 2  # <|im_end|> in the demo tokenizer
GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, logprobs=2)
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=5, max_tokens=40, ignore_eos=True, presence_penalty=0.3)


def _new(name: str, start: int, params: SamplingParams = GREEDY) -> NewSequence:
    return NewSequence(request_id=RequestId(name), prompt_token_ids=tuple(range(start, start + 30)), params=params)


class Driver:
    """Plans for a runner as the scheduler sends them, one step a plan: every live sequence decodes
    until it has its ``max_tokens``."""

    def __init__(self, model_dir: str, *overrides: str):
        cfg = load_config(None, overrides=[f"model.path={model_dir}", "engine.run_ahead_steps=1", *overrides],
                          environ={})  # fmt: skip
        self.runner = BatchRunner(cfg)
        self.runner.load()
        self.step_id = 0
        self.live: dict[RequestId, int] = {}  # request -> its max_tokens
        self.tokens: dict[RequestId, list[int]] = defaultdict(list)
        self.logprobs: dict[RequestId, list] = defaultdict(list)

    def plan(self, *new: NewSequence, finished: tuple[RequestId, ...] = ()) -> None:
        for rid in finished:
            del self.live[rid]
        decode = tuple(self.live)
        self.live.update((seq.request_id, seq.params.max_tokens) for seq in new)
        result = self.runner.execute(StepPlan(step_id=self.step_id, new_seqs=new, decode_ids=decode,
                                              finished_ids=finished))  # fmt: skip
        self.step_id += 1
        assert not result.failed
        for rid, tokens in result.sampled:
            self.tokens[rid].extend(tokens)
        for rid, logprobs in result.logprobs:
            self.logprobs[rid].extend(logprobs)
        for rid, max_tokens in list(self.live.items()):
            if len(self.tokens[rid]) >= max_tokens:
                del self.live[rid]

    def until(self, rid: RequestId, count: int) -> None:
        while len(self.tokens[rid]) < count:
            self.plan()

    def finish(self) -> None:
        while self.live:
            self.plan()
        assert self.runner.num_sequences == 0

    @property
    def single(self) -> SingleRow | None:
        return self.runner._single

    def close(self) -> None:
        self.runner.close()


def solo(model_dir: str, seq: NewSequence, *overrides: str) -> tuple[list[int], list]:
    """``seq``'s tokens and logprobs run alone, through the generator (the one-row path off)."""
    driver = Driver(model_dir, "engine.single_row_decode=false", *overrides)
    try:
        driver.plan(seq)
        driver.finish()
        assert driver.single is None
        return driver.tokens[seq.request_id], driver.logprobs[seq.request_id]
    finally:
        driver.close()


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy-logprobs", "seeded-penalty"])
def test_a_row_alone_decodes_on_the_one_row_path_with_the_generators_output(float32_dir, params):
    seq = _new("a", 10, params)
    expected = solo(float32_dir, seq)
    driver = Driver(float32_dir)
    try:
        driver.plan(seq)
        driver.finish()
        assert driver.single is not None
        # every token came through it, and the row's last prompt token (it joined the batch with it)
        assert driver.single.steps == params.max_tokens + 1
        assert (driver.tokens[seq.request_id], driver.logprobs[seq.request_id]) == expected
        assert len(expected[0]) == params.max_tokens
        assert len(expected[1]) == (params.max_tokens if params.logprobs else 0)
    finally:
        driver.close()


def test_a_request_arriving_mid_stream_takes_the_row_back_into_the_batch(float32_dir):
    first, second = _new("a", 10), _new("b", 100, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    expected = {seq.request_id: solo(float32_dir, seq) for seq in (first, second)}
    driver = Driver(float32_dir)
    try:
        driver.plan(first)
        driver.until(first.request_id, 10)
        assert driver.single is not None and driver.single.uid is not None  # alone: on the one-row path
        alone_steps = driver.single.steps
        driver.plan(second)
        assert driver.single.uid is None  # both rows in the generator's batch
        while second.request_id in driver.live:
            driver.plan()
            assert driver.single.steps == alone_steps  # no one-row step while both decode
        driver.finish()
        assert driver.single.steps > alone_steps  # alone again once the second one finished
        for rid, (tokens, logprobs) in expected.items():
            assert driver.tokens[rid] == tokens, rid
            assert driver.logprobs[rid] == logprobs, rid
    finally:
        driver.close()


def test_a_row_cancelled_on_the_one_row_path_leaves_nothing_behind(float32_dir):
    first, second = _new("a", 10), _new("c", 200)
    expected = solo(float32_dir, second)
    driver = Driver(float32_dir)
    try:
        driver.plan(first)
        driver.until(first.request_id, 5)
        assert driver.single is not None and driver.single.uid is not None
        driver.plan(finished=(first.request_id,))  # the client went away
        assert driver.runner.num_sequences == 0 and driver.single.uid is None
        generator = driver.runner._generator
        assert len(generator._generation_batch) == 0 and not generator._unprocessed_sequences
        driver.plan(second)
        driver.finish()
        assert (driver.tokens[second.request_id], driver.logprobs[second.request_id]) == expected
    finally:
        driver.close()


# -- through the engine: the finishes, stop strings, preemption -----------------------------------------------


def chat(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Tell me about number {i} and the sea."}]


JOBS = {
    "greedy": (chat(1), SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)),
    "logprobs": (chat(2), SamplingParams(temperature=0.0, max_tokens=12, logprobs=2, ignore_eos=True)),
    "eos": (chat(3), SamplingParams(temperature=0.0, max_tokens=30, logit_bias=((EOS, 100.0),), min_tokens=5)),
    "seeded": (chat(4), SamplingParams(temperature=0.8, seed=3, max_tokens=30, ignore_eos=True,
                                       frequency_penalty=0.5)),  # fmt: skip
    "one": (chat(5), SamplingParams(temperature=0.0, max_tokens=1)),
}


@pytest.fixture
def single_row_steps(monkeypatch) -> list[int]:
    """Counts one-row steps in every runner of the test (one entry per step)."""
    steps: list[int] = []
    original = SingleRow.next

    def counted(self):
        steps.append(1)
        return original(self)

    monkeypatch.setattr(SingleRow, "next", counted)
    return steps


async def one_by_one(model_dir: str, jobs: dict, *overrides: str) -> dict[str, list]:
    """Each job's deltas, one job at a time (each alone in the batch)."""
    cfg = load_config(None, overrides=[f"model.path={model_dir}", *overrides], environ={})
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cfg) as engine:
            return {key: [d async for d in engine.generate(prompt, params)] for key, (prompt, params) in jobs.items()}


def tokens(deltas: list) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


async def test_finishes_logprobs_and_stop_strings_match_the_generators(float32_dir, single_row_steps):
    reference = await one_by_one(float32_dir, JOBS, "engine.single_row_decode=false")
    assert single_row_steps == []
    text = "".join(d.text for d in reference["greedy"])
    stop = text[len(text) // 2 : len(text) // 2 + 3]  # a stop string met mid-stream
    stopping = {"stop": (chat(1), SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop=(stop,)))}
    reference |= await one_by_one(float32_dir, stopping, "engine.single_row_decode=false")
    assert single_row_steps == []
    ours = await one_by_one(float32_dir, JOBS | stopping)
    # each request decoded alone: most of its steps on the one-row path (a request waiting to start may keep a
    # row in the generator for a plan)
    assert len(single_row_steps) >= sum(len(tokens(deltas)) for deltas in ours.values()) // 2
    for key, deltas in reference.items():
        assert tokens(ours[key]) == tokens(deltas), key
        assert [lp for d in ours[key] for lp in d.logprobs] == [lp for d in deltas for lp in d.logprobs], key
        assert ours[key][-1].finish_reason == deltas[-1].finish_reason, key
    assert len(tokens(ours["eos"])) == 6 and tokens(ours["eos"])[-1] == EOS and ours["eos"][-1].finish_reason == "stop"
    assert ours["stop"][-1].finish_reason == "stop" and len(tokens(ours["stop"])) < 40
    assert "".join(d.text for d in ours["stop"]) == text[: text.index(stop)]


async def test_a_preempted_request_resumes_on_the_one_row_path_with_its_tokens(float32_dir, single_row_steps):
    """Three rows of ~750 tokens do not fit 2048 tokens of KV: one is preempted, resumes from prompt + output
    once another finishes, and ends alone on the one-row path (its seeded draws carried on)."""
    params = [SamplingParams(temperature=0.0, max_tokens=700, ignore_eos=True),
              SamplingParams(temperature=0.9, top_p=0.95, seed=11, max_tokens=700, ignore_eos=True,
                             presence_penalty=0.3)]  # fmt: skip

    async def three(*overrides: str) -> tuple[dict[int, list[int]], int]:
        cfg = load_config(None, overrides=[f"model.path={float32_dir}", *overrides], environ={})
        outputs: dict[int, list[int]] = {}
        with trio.fail_after(TIMEOUT_S):
            async with open_engine(cfg) as engine:

                async def one(i: int) -> None:
                    outputs[i] = tokens([d async for d in engine.generate(chat(i), params[i % 2])])

                async with trio.open_nursery() as nursery:
                    for i in range(3):
                        nursery.start_soon(one, i)
                return outputs, engine.statistics().scheduler.num_preemptions

    roomy, preempted = await three("engine.single_row_decode=false")
    assert preempted == 0 and single_row_steps == []
    tight, preempted = await three("engine.kv_memory_mb=1")  # float32 tiny: 2048 tokens
    assert preempted > 0 and single_row_steps
    assert tight == roomy
