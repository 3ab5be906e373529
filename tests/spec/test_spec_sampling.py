"""worker/speculative/sampling.py: the round's verdict on the device. Greedy: the accepted prefix and the target's token
after it. Sampled (speculative rejection sampling): the emitted tokens are distributed as the target's own sampling,
checked with chi-square tests over many seeded draws (fixed seeds: deterministic, not flaky)."""

from __future__ import annotations

import attrs
import pytest

from vllm_mlx_trio.core.params import SamplingParams

pytestmark = pytest.mark.mlx

#: Chi-square critical values at significance 0.001, by degrees of freedom.
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}
DRAWS = 3000


def _logits(rows):
    import mlx.core as mx

    return mx.log(mx.array(rows, dtype=mx.float32))


def _emitted(num_accepted: int, drafts: list[int], next_token: int) -> list[int]:
    return [*drafts[:num_accepted], next_token]


def _chi2_against(counts: list[int], probs: list[float]) -> tuple[float, int]:
    total = sum(counts)
    cells = [(c, p * total) for c, p in zip(counts, probs, strict=True) if p > 0]
    assert sum(c for c, p in zip(counts, probs, strict=True) if p == 0) == 0, "a token of probability 0 came out"
    return sum((c - e) ** 2 / e for c, e in cells), len(cells) - 1


def _chi2_two_samples(a: list[int], b: list[int]) -> tuple[float, int]:
    """Homogeneity of two equal-sized samples' counts."""
    cells = [(x, y) for x, y in zip(a, b, strict=True) if x + y]
    return sum((x - y) ** 2 / (x + y) for x, y in cells), len(cells) - 1


@pytest.mark.parametrize(
    ("drafts", "target", "accepted"),
    [([], [7], 0), ([1, 2, 3], [1, 2, 3, 4], 3), ([1, 2, 3], [1, 9, 3, 4], 1), ([1, 2, 3], [8, 2, 3, 4], 0)],
)
def test_the_greedy_verdict_is_the_accepted_prefix_and_the_target_token_after_it(drafts, target, accepted):
    import mlx.core as mx

    from vllm_mlx_trio.worker.speculative.sampling import greedy_verdict

    logits = mx.full((1, len(target), 16), -5.0)
    for position, token in enumerate(target):
        logits[0, position, token] = 5.0
    num_accepted, next_token = greedy_verdict(mx.array(drafts, dtype=mx.uint32), logits)
    assert (num_accepted.item(), next_token.item()) == (accepted, target[accepted])


def test_rejection_sampling_emits_the_target_distribution():
    """Drafts from q, judged against p: the first emitted token follows p[0], the second (when the first draft
    stood) p[1], though q is far from p (rejections are frequent)."""
    import mlx.core as mx

    from vllm_mlx_trio.worker.speculative.sampling import rejection_verdict

    p = mx.array([[0.5, 0.2, 0.2, 0.1, 0.0], [0.1, 0.1, 0.1, 0.3, 0.4], [0.2, 0.2, 0.2, 0.2, 0.2]])
    q = mx.array([[0.1, 0.1, 0.3, 0.3, 0.2], [0.4, 0.3, 0.1, 0.1, 0.1]])
    first, second = [0] * 5, [0] * 5
    rejected_first = 0
    for draw in range(DRAWS):
        draft_key, verdict_key = mx.random.split(mx.random.key(draw))
        drafts = mx.random.categorical(mx.log(q), key=draft_key).astype(mx.uint32)
        num_accepted, next_token = rejection_verdict(drafts, q, p, verdict_key)
        tokens = _emitted(num_accepted.item(), drafts.tolist(), next_token.item())
        first[tokens[0]] += 1
        rejected_first += num_accepted.item() == 0
        if len(tokens) > 1:
            second[tokens[1]] += 1
    assert rejected_first > DRAWS // 4  # q really differs from p: the residual draw is exercised
    for counts, probs in ((first, p[0].tolist()), (second, p[1].tolist())):
        statistic, dof = _chi2_against(counts, probs)
        assert statistic < CHI2_999[dof], (counts, probs)


def test_a_sampled_round_matches_the_normal_samplers_draws_with_the_requests_filters():
    """The whole sampled path (SpecSampler: the request's temperature, top_p, top_k, min_p on both p and q, its own
    key) against the normal path's sampler (worker/sampling.py) on the same target logits."""
    import mlx.core as mx

    from vllm_mlx_trio.worker.sampling import make_request_sampler
    from vllm_mlx_trio.worker.speculative.sampling import SpecSampler

    vocab = 8
    target = _logits([[0.30, 0.20, 0.15, 0.12, 0.10, 0.06, 0.04, 0.03]] * 2)
    draft = _logits([[0.05, 0.30, 0.30, 0.05, 0.10, 0.10, 0.05, 0.05]])
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=5, min_p=0.05, max_tokens=4)
    logprobs = target[:1] - mx.logsumexp(target[:1], axis=-1, keepdims=True)
    normal = make_request_sampler(attrs.evolve(params, seed=1), vocab)
    speculative = SpecSampler(params, vocab, seed=2)
    normal_counts, spec_counts = [0] * vocab, [0] * vocab
    for _ in range(DRAWS):
        normal_counts[normal(logprobs).item()] += 1
        drafts = speculative.pick(draft)
        num_accepted, next_token = speculative.verdict(drafts, speculative.take_draft_probs(1), target[None])
        spec_counts[_emitted(num_accepted.item(), drafts.tolist(), next_token.item())[0]] += 1
    assert spec_counts[5:] == [0, 0, 0]  # top_k = 5 (and top_p) cut these, on the speculative path too
    statistic, dof = _chi2_two_samples(normal_counts, spec_counts)
    assert statistic < CHI2_999[dof], (normal_counts, spec_counts)


def test_several_sampled_rows_in_one_batched_verdict_each_emit_their_own_target_distribution():
    """The batched round's verdict (worker/speculative/spec_batch.py) with three sampled rows and a greedy one: each
    sampled row's emitted tokens follow its own p, though its drafts come from a q far from it; budgets cap a row."""
    import mlx.core as mx

    from vllm_mlx_trio.worker.speculative.sampling import SpecSampler
    from vllm_mlx_trio.worker.speculative.spec_batch import SpecBatch, SpecRow

    p = [
        [[0.5, 0.2, 0.2, 0.1, 0.0], [0.1, 0.1, 0.1, 0.3, 0.4], [0.2, 0.2, 0.2, 0.2, 0.2]],
        [[0.1, 0.1, 0.1, 0.1, 0.6], [0.3, 0.3, 0.2, 0.1, 0.1], [0.2, 0.2, 0.2, 0.2, 0.2]],
        [[0.25, 0.25, 0.25, 0.25, 0.0], [0.6, 0.1, 0.1, 0.1, 0.1], [0.2, 0.2, 0.2, 0.2, 0.2]],
        [[0.1, 0.7, 0.1, 0.05, 0.05], [0.1, 0.1, 0.7, 0.05, 0.05], [0.1, 0.1, 0.1, 0.1, 0.6]],  # greedy: 1, 2, 4
    ]
    q = mx.log(mx.array([[0.1, 0.1, 0.3, 0.3, 0.2], [0.4, 0.3, 0.1, 0.1, 0.1]]))
    logits = _logits(p)
    params = SamplingParams(temperature=1.0, max_tokens=8)
    budgets = [2, 2, 1, 2]
    batch = SpecBatch(None, None)
    draws = DRAWS // 3
    first, second = [[0] * 5 for _ in range(3)], [[0] * 5 for _ in range(3)]
    for draw in range(draws):
        batch.rows = [SpecRow(str(i), [], 0, SpecSampler(params, 5, seed=draw * 3 + i)) for i in range(3)]
        batch.rows.append(SpecRow("greedy", [], 0))
        drafts = [[row.sampler.pick(q[j : j + 1]) for j in range(2)] for row in batch.rows[:3]]
        drafts = mx.stack([mx.concatenate(d) for d in drafts] + [mx.array([1, 2], dtype=mx.uint32)])
        accepted, next_tokens = batch._verdict(drafts, logits, budgets)
        for i in range(3):
            tokens = _emitted(accepted[i].item(), drafts[i].tolist(), next_tokens[i].item())
            first[i][tokens[0]] += 1
            if len(tokens) > 1:
                second[i][tokens[1]] += 1
            assert len(tokens) <= budgets[i] + 1
        assert (accepted[3].item(), next_tokens[3].item()) == (2, 4)  # the greedy row: both drafts, then argmax
    for i in range(3):
        for counts, probs in ((first[i], p[i][0]), (second[i], p[i][1])):
            if sum(counts) > draws // 10:
                statistic, dof = _chi2_against(counts, probs)
                assert statistic < CHI2_999[dof], (i, counts, probs)
