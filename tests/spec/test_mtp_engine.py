"""MTP through the whole engine on demo:mtp-tiny: the same text, tokens and finish reason as without speculation
(also with a stop string cut inside a run), and the rounds counted in the metrics."""

from __future__ import annotations

import attrs
import pytest
import trio

from vllm_mlx_trio import SamplingParams, open_engine

from .conftest import spec_config
from .mtp_parts import generate

pytestmark = pytest.mark.mlx

TIMEOUT_S = 180
GREEDY = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
CHAT = [{"role": "user", "content": "Tell me about the sea and the ships."}]


@pytest.fixture(scope="module")
def mtp_dir(tmp_path_factory) -> str:
    from vllm_mlx_trio.worker.demo import build_demo_model

    return str(build_demo_model(tmp_path_factory.mktemp("mtp-engine") / "mtp-tiny", size="mtp-tiny"))


async def _generate(engine, params) -> tuple[str, list[int], str | None]:
    return await generate(engine, CHAT, params)


async def test_mtp_through_the_engine_changes_no_token(mtp_dir):
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(spec_config(mtp_dir, None)) as engine:
            reference = await _generate(engine, GREEDY)
            stop = reference[0][len(reference[0]) // 2 : len(reference[0]) // 2 + 3]
            with_stop = attrs.evolve(GREEDY, stop=(stop,))
            reference_stopped = await _generate(engine, with_stop)
        mtp = spec_config(mtp_dir, None, "speculative.method=mtp", "speculative.num_draft_tokens=3")
        async with open_engine(mtp) as engine:
            got = await _generate(engine, GREEDY)
            got_stopped = await _generate(engine, with_stop)
            counts = engine.metrics.spec_decode
    assert got == reference and got[2] == "length"
    assert got_stopped == reference_stopped and got_stopped[2] == "stop"
    assert counts.num_drafts > 0 and counts.num_accepted_tokens > 0
