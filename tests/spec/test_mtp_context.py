"""The MTP head's context when a sequence enters speculation from the batched path: the target's hidden states of
its latest ``speculative.mtp_context_tokens`` positions (prompt and output), as mlx-vlm and vLLM feed the prompt's,
recorded by the runner's prefill and the batch's decode steps (worker/speculative/entry_hidden.py)."""

from __future__ import annotations

import contextlib

import pytest

from vllm_mlx_trio.core.params import SamplingParams
from vllm_mlx_trio.messages import NewSequence, RequestId

from .conftest import PlanDriver
from .mtp_parts import build_runner, mtp_config

pytestmark = pytest.mark.mlx

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPT = tuple(range(40, 70))


@pytest.fixture(scope="module")
def mtp_dir(tmp_path_factory) -> str:
    from vllm_mlx_trio.worker.demo import build_demo_model

    return str(build_demo_model(tmp_path_factory.mktemp("mtp") / "mtp-tiny", size="mtp-tiny"))


@contextlib.contextmanager
def _mtp_runner(mtp_dir: str, *overrides: str, one_row: bool = False):
    """An MTP runner over ``mtp_dir``, closed after; ``one_row``: on its one-row path (the head made unable to draft
    for a batch), where a sequence enters speculation alone, after decoding in the batch."""
    with pytest.MonkeyPatch.context() as patch:
        if one_row:
            from vllm_mlx_trio.worker.speculative.mtp.drafter import MTPDrafter

            patch.setattr(MTPDrafter, "batch", lambda self: None)
        runner = build_runner(mtp_config(mtp_dir, *overrides))
    try:
        yield runner
    finally:
        runner.close()


def _entries(runner) -> list[tuple[list[int], object]]:
    """Every (tokens, hidden) the runner's drafter is started with from now on (rows joining the speculative batch,
    or the one-row drafter's start)."""
    if runner._spec_batch is not None:
        heads, rows = runner._spec_batch._draft, []
        real_add = heads.add

        def add(rows_tokens, tails, hiddens):
            rows.extend((list(tokens), hidden) for tokens, hidden in zip(rows_tokens, hiddens, strict=True))
            real_add(rows_tokens, tails, hiddens)

        heads.add = add
        return rows
    drafter, entries = runner._drafter, []
    real = drafter.start

    def start(tokens, target_hidden):
        entries.append((list(tokens), target_hidden))
        real(tokens, target_hidden)

    drafter.start = start
    return entries


def _reference_hidden(runner, tokens: list[int]):
    """The target's hidden states over ``tokens`` in one forward from an empty cache (float32)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from vllm_mlx_trio.worker.speculative.hidden import target_forward

    model = runner._target
    _, hidden = target_forward(model, mx.array([tokens]), make_prompt_cache(model), mode="post_norm")
    return hidden.astype(mx.float32)


def _assert_matches_reference(runner, tokens: list[int], hidden, expected_rows: int) -> None:
    import mlx.core as mx

    assert hidden is not None and hidden.shape[:2] == (1, expected_rows)
    reference = _reference_hidden(runner, tokens)[:, -expected_rows:]
    error = mx.abs(hidden.astype(mx.float32) - reference).max().item()
    scale = mx.abs(reference).max().item()
    assert error <= 0.05 * scale, (error, scale)  # a shifted position differs by the order of the values


def _run_alone(runner, prompt=PROMPT, params=GREEDY) -> PlanDriver:
    driver = PlanDriver(runner)
    driver.step(new=[NewSequence(request_id=RequestId("a"), prompt_token_ids=prompt, params=params)])
    driver.run_until_done()
    return driver


@pytest.mark.parametrize(("limit", "rows"), [(2048, None), (8, 8), (1, 1)])
def test_a_sequence_enters_with_its_prompts_hidden_states_and_the_head_reads_them(mtp_dir, limit, rows):
    with _mtp_runner(mtp_dir, f"speculative.mtp_context_tokens={limit}", one_row=True) as runner:
        entries = _entries(runner)
        heads = []
        runner._drafter.propose_lazy = _after(
            runner._drafter.propose_lazy, lambda: heads.append(runner._drafter.cached_positions)
        )
        driver = _run_alone(runner)
        tokens, hidden = entries[0]
        assert tokens == [*PROMPT, driver.outputs["a"][0]]  # entered right after its first token
        expected = rows or len(tokens)
        _assert_matches_reference(runner, tokens, hidden, expected)
        assert heads[0] == expected - 1  # the head's cache holds the context pairs before its first draft
        assert runner._entry_hidden.num_tracked == 0


def _after(method, hook):
    def wrapped(*args, **kwargs):
        hook()
        return method(*args, **kwargs)

    return wrapped


def test_mlx_lms_own_prompt_path_gives_the_context_from_the_prompts_last_token(mtp_dir):
    with _mtp_runner(mtp_dir, "engine.prefill_time_ratio=none") as runner:
        entries = _entries(runner)
        _run_alone(runner)
        tokens, hidden = entries[0]
        _assert_matches_reference(runner, tokens, hidden, len(tokens) - len(PROMPT) + 1)


def test_a_sequence_left_alone_in_the_batch_enters_with_its_prompt_and_batched_steps(mtp_dir):
    with _mtp_runner(mtp_dir, one_row=True) as runner:
        entries = _entries(runner)
        driver = PlanDriver(runner)
        short = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
        long = NewSequence(request_id=RequestId("a"), prompt_token_ids=PROMPT, params=GREEDY)
        driver.step(new=[long, NewSequence(request_id=RequestId("b"), prompt_token_ids=PROMPT[:17], params=short)])
        driver.run_until_done()
        tokens, hidden = entries[0]
        assert len(tokens) > len(PROMPT) + 2  # it decoded in the batch beside "b" before entering
        _assert_matches_reference(runner, tokens, hidden, len(tokens))
        assert runner._entry_hidden.num_tracked == 0


def test_a_request_that_never_speculates_leaves_no_record(mtp_dir):
    with _mtp_runner(mtp_dir) as runner:
        entries = _entries(runner)
        logprobs = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=0)  # outside the envelope
        driver = _run_alone(runner, params=logprobs)
        assert len(driver.outputs["a"]) == 5 and not entries
        assert runner._entry_hidden.num_tracked == 0


@pytest.mark.parametrize(("limit", "rows"), [(2048, None), (8, 8)])
def test_rows_joining_the_speculative_batch_bring_their_prompts_hidden_states(mtp_dir, limit, rows):
    """The batched path: each row joins with the same context, and the head's batched cache holds its pairs."""
    from vllm_mlx_trio.worker.speculative.ragged import row_lengths

    with _mtp_runner(mtp_dir, f"speculative.mtp_context_tokens={limit}") as runner:
        assert runner._spec_batch is not None
        entries, heads = _entries(runner), runner._spec_batch._draft
        lengths = []
        heads.propose = _after(heads.propose, lambda: lengths.append(row_lengths(heads._cache)))
        driver = PlanDriver(runner)
        other = tuple(range(100, 125))
        driver.step(
            new=[
                NewSequence(request_id=RequestId(r), prompt_token_ids=p, params=GREEDY)
                for r, p in (("a", PROMPT), ("b", other))
            ]
        )
        driver.run_until_done()
        assert len(entries) == 2
        for (tokens, hidden), prompt in zip(entries, (PROMPT, other), strict=True):
            assert tokens[: len(prompt)] == list(prompt)
            _assert_matches_reference(runner, tokens, hidden, rows or len(tokens))
        # the head's rows hold the context pairs when they first draft ("b" joins a round or more after "a")
        expected = [(rows or len(tokens)) - 1 for tokens, _ in entries]
        assert lengths[0] == expected[:1] and next(n for n in lengths if len(n) == 2)[1] == expected[1]
        assert runner._entry_hidden.num_tracked == 0
