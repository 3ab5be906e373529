"""The one termination rule, and the scheduler's Request applying it to k >= 1 tokens a step."""

from __future__ import annotations

import pytest

from vllm_mlx_trio.core.params import SamplingParams
from vllm_mlx_trio.core.request import RequestStatus
from vllm_mlx_trio.core.termination import LENGTH, STOP, Termination, stop_strings_from
from vllm_mlx_trio.messages import TokenLogprob
from vllm_mlx_trio.testing.requests import make_request

EOS = 2


def rule(**params) -> Termination:
    return Termination.of(SamplingParams(**params), (EOS,))


@pytest.mark.parametrize(
    ("params", "before", "tokens", "expected"),
    [
        ({"max_tokens": 10}, 0, (5, 6, 7), (3, None)),
        ({"max_tokens": 10}, 0, (5, EOS, 7, 8), (2, STOP)),  # EOS mid-step: kept, the rest dropped
        ({"max_tokens": 10}, 8, (5, 6, 7), (2, LENGTH)),  # max_tokens mid-step
        ({"max_tokens": 10, "min_tokens": 3}, 0, (EOS, 5, EOS, EOS), (4, STOP)),  # the 4th is past min
        ({"max_tokens": 10, "min_tokens": 5}, 0, (EOS, EOS, EOS, EOS), (4, None)),
        ({"max_tokens": 10, "ignore_eos": True}, 0, (EOS, 5), (2, None)),
        ({"max_tokens": 10, "ignore_eos": True, "stop_token_ids": (9,)}, 0, (EOS, 9, 5), (2, STOP)),
        ({"max_tokens": 3}, 2, (EOS,), (1, STOP)),  # both at once: a stop is a stop
    ],
)
def test_scan(params, before, tokens, expected):
    assert rule(**params).scan(before, tokens) == expected


@pytest.mark.parametrize(
    ("min_tokens", "before", "new", "expected"),
    [(0, 0, 4, 0), (3, 0, 4, 3), (3, 2, 4, 1), (3, 3, 4, 0), (10, 0, 4, 4), (10, 8, 1, 1)],
)
def test_stop_strings_count_only_past_min_tokens(min_tokens, before, new, expected):
    assert stop_strings_from(min_tokens, before, new) == expected


def logprobs(tokens) -> tuple[TokenLogprob, ...]:
    return tuple(TokenLogprob(token_id=t, logprob=-1.0) for t in tokens)


def test_request_keeps_every_token_of_a_step_until_one_ends_it():
    request = make_request(eos_token_ids=(EOS,), max_tokens=6, logprobs=0)
    request.append_tokens((5, 6, 7), logprobs((5, 6, 7)))
    assert request.status == RequestStatus.WAITING and request.num_output_tokens == 3
    request.append_tokens((8, 9, 10, 11), logprobs((8, 9, 10, 11)))
    assert request.status == RequestStatus.FINISHED_LENGTH
    assert request.output_token_ids == [5, 6, 7, 8, 9, 10]
    assert request.take_undelivered() == ((5, 6, 7, 8, 9, 10), logprobs((5, 6, 7, 8, 9, 10)))


def test_request_stop_id_mid_step_drops_the_rest_and_their_logprobs():
    request = make_request(eos_token_ids=(EOS,), max_tokens=20, min_tokens=2)
    request.append_tokens((EOS, 5, EOS, 6), logprobs((EOS, 5, EOS, 6)))
    assert request.status == RequestStatus.FINISHED_STOPPED and request.finish_reason == "stop"
    assert request.take_undelivered() == ((EOS, 5, EOS), logprobs((EOS, 5, EOS)))
    assert request.num_tokens == 2 + 3  # the KV it holds counts accepted tokens only
