"""Two ranks on loopback (ring backend), pipeline-parallel (``distributed.pipeline = 2``) over a
tiny qwen2 (an architecture mlx-lm can pipeline): every request kind answers as one process does."""

from __future__ import annotations

import pathlib

import pytest
import trio
from pipeline_model import build_qwen2
from replicas import replica
from test_sharded import answers, same_answers, two_ranks

pytestmark = pytest.mark.mlx


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory, float32_dir) -> str:
    return str(build_qwen2(tmp_path_factory.mktemp("qwen2") / "tiny", pathlib.Path(float32_dir)))


async def test_two_ranks_pipeline_parallel_match_one_process(tmp_path, qwen2_dir, demo_cache_dir):
    with trio.fail_after(300):
        pipelined = ("distributed.pipeline=2", "distributed.tensor=1")
        async with two_ranks(tmp_path, qwen2_dir, *pipelined) as (rank0, rank1):
            sharded = await answers(rank0.url, qwen2_dir)
        async with replica(tmp_path, demo_cache_dir, f"model.path={qwen2_dir}") as single:
            reference = await answers(single.url, qwen2_dir)
    same_answers(sharded, reference)
    # rank 1 runs the first two layers, rank 0 the last two (mlx-lm's split), then follows rank 0
    assert "rank 1: pipeline stage with layers 0-1" in rank1.output()
    assert "rank 0: pipeline stage with layers 2-3" in rank0.output()
    assert "loaded its shard; following rank 0" in rank1.output()
