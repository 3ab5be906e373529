"""A constrained row that is preempted resumes with a fresh matcher replaying its tokens, and
ends with exactly the output it has with room to spare."""

from __future__ import annotations

import json

import pytest
import trio

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.core.constraint import ConstraintSpec, canonical_json

pytestmark = pytest.mark.mlx

TIMEOUT_S = 300
#: A long free string: random weights rarely close it, so rows run long enough to be preempted.
SCHEMA = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}


def params(i: int) -> SamplingParams:
    constraint = ConstraintSpec(kind="json_schema", body=canonical_json(SCHEMA))
    return SamplingParams(temperature=0.9, seed=i, max_tokens=300, constraint=constraint)


async def run_batch(engine) -> dict[int, tuple[str, str | None]]:
    outputs: dict[int, tuple[str, str | None]] = {}

    async def one(i: int) -> None:
        text, finish = [], None
        async for delta in engine.generate([{"role": "user", "content": f"Story {i}."}], params(i)):
            text.append(delta.text)
            finish = delta.finish_reason or finish
        outputs[i] = ("".join(text), finish)

    async with trio.open_nursery() as nursery:
        for i in range(8):
            nursery.start_soon(one, i)
    return outputs


async def test_preempted_constrained_rows_finish_as_with_room(float32_dir):
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(load_config(None, overrides=[f"model.path={float32_dir}"], environ={})) as engine:
            roomy = await run_batch(engine)
        tight_cfg = load_config(None, overrides=[f"model.path={float32_dir}", "engine.kv_memory_mb=1"], environ={})
        async with open_engine(tight_cfg) as engine:
            tight = await run_batch(engine)
            preemptions = engine.statistics().scheduler.num_preemptions
    assert preemptions > 0
    assert tight == roomy
    for text, finish in roomy.values():
        assert text.startswith('{"story":"')
        if finish == "stop":
            assert set(json.loads(text)) == {"story"}
