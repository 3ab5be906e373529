"""The draft-model drafter on the real tiny model: its drafts are its greedy continuation, and after every settle
its cache (plus what it has not run yet) holds exactly what the target's does."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.mlx

PROMPT = list(range(40, 60))


@pytest.fixture(scope="module")
def model(float32_dir):
    from mlx_lm import load

    return load(float32_dir)[0]


def greedy_continuation(model, tokens: list[int], n: int) -> list[int]:
    import mlx.core as mx

    out = []
    for _ in range(n):
        logits = model(mx.array([tokens + out]))[:, -1, :]
        out.append(int(mx.argmax(logits, axis=-1).item()))
    return out


def held(drafter) -> int:
    return drafter._cache[0].offset + len(drafter._unfed)


def test_drafts_are_the_greedy_continuation(model):
    from vllm_mlx_trio.worker.speculative.draft_model import DraftModelDrafter

    drafter = DraftModelDrafter(model, prefill_step=8)  # the prompt goes in chunks
    drafter.start(PROMPT, None)
    assert held(drafter) == len(PROMPT)
    assert drafter.propose(7, 4) == greedy_continuation(model, [*PROMPT, 7], 4)


@pytest.mark.parametrize("prefill_step", [8, 512])
def test_the_output_head_never_runs_over_the_prompt(model, prefill_step):
    """Entering speculation runs the prompt for the draft's cache only: every forward whose logits are read (the
    drafts') takes one token, and the drafts are still the greedy continuation."""
    from vllm_mlx_trio.worker.speculative.draft_model import DraftModelDrafter

    class Spy:
        """The model, recording each forward's input length and whether its logits were sliced for a draft."""

        def __init__(self):
            self.read: list[int] = []
            self.layers = model.layers  # for make_prompt_cache

        def __call__(self, inputs, cache):
            logits = model(inputs, cache=cache)
            width = inputs.shape[1]
            spy = self

            class Logits:
                def __getitem__(self, key):
                    spy.read.append(width)
                    return logits[key]

            return Logits()

    spy = Spy()
    drafter = DraftModelDrafter(spy, prefill_step=prefill_step)
    drafter.start(PROMPT, None)
    assert drafter.propose(7, 4) == greedy_continuation(model, [*PROMPT, 7], 4)
    assert spy.read == [1, 1, 1, 1]


@pytest.mark.parametrize("num_accepted", [0, 1, 3, 4])
def test_settle_keeps_the_drafter_in_step_with_the_target(model, num_accepted):
    from vllm_mlx_trio.worker.speculative.draft_model import DraftModelDrafter

    drafter = DraftModelDrafter(model)
    drafter.start(PROMPT, None)
    target_cache = [*PROMPT]
    last = 7
    for _ in range(3):  # three rounds, each accepting num_accepted drafts then a bonus token
        drafts = drafter.propose(last, 4)
        bonus = (drafts[num_accepted] + 1) % 512 if num_accepted < 4 else 11
        accepted = [*drafts[:num_accepted], bonus]
        drafter.settle(accepted, None)
        target_cache += [last, *drafts[:num_accepted]]
        last = bonus
        assert held(drafter) == len(target_cache)
    # and what it drafts next is the greedy continuation of exactly that sequence
    assert drafter.propose(last, 3) == greedy_continuation(model, [*target_cache, last], 3)


def test_a_round_without_drafts_still_keeps_step(model):
    from vllm_mlx_trio.worker.speculative.draft_model import DraftModelDrafter

    drafter = DraftModelDrafter(model)
    drafter.start(PROMPT, None)
    assert drafter.propose(7, 0) == []
    drafter.settle([9], None)
    assert held(drafter) == len(PROMPT) + 1
    assert drafter.propose(9, 2) == greedy_continuation(model, [*PROMPT, 7, 9], 2)
    drafter.stop()
    assert drafter._cache is None


@pytest.mark.parametrize("pattern", [(4, 4, 4), (4, 2, 4), (1, 4, 0), (4, 4, 1)])
def test_drafting_a_round_ahead_keeps_the_drafter_in_step(model, pattern):
    """The pipelined round: drafts stay lazy, the next round's drafts start from the (lazy) bonus before the host
    reads this round; a round that accepts everything uses them, one that rejects any drops them."""
    import mlx.core as mx

    from vllm_mlx_trio.worker.speculative.draft_model import DraftModelDrafter

    drafter = DraftModelDrafter(model)
    drafter.start(PROMPT, None)
    target_cache, last = [*PROMPT], 7
    for num_accepted in pattern:
        drafts = drafter.propose_lazy(last, 4)
        draft_ids = drafts.tolist()
        assert draft_ids == greedy_continuation(model, [*target_cache, last], 4)
        bonus = 11 if num_accepted == 4 else (draft_ids[num_accepted] + 1) % 512
        drafter.draft_ahead(drafts, mx.array(bonus), 4)  # always: the bonus is what the verify would say
        drafter.settle([*draft_ids[:num_accepted], bonus], None)
        target_cache += [last, *draft_ids[:num_accepted]]
        last = bonus
    # the ahead drafts (if they stand) or fresh ones are the greedy continuation; a shorter budget re-drafts
    assert drafter.propose_lazy(last, 2).tolist() == greedy_continuation(model, [*target_cache, last], 2)
    drafter.settle([9], None)
    assert held(drafter) == len(target_cache) + 1
