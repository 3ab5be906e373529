"""A vision encoding evaluated block by block over several steps (worker/vlm/encode.py): the
same features as in one piece, and the text rows decoding between its pieces."""

from __future__ import annotations

import attrs
import mlx.core as mx
import numpy as np
import pytest
from test_vlm_runner import GREEDY, Driver, picture

pytestmark = pytest.mark.mlx

#: Towers of two blocks: Qwen2.5-VL's (called directly) and LLaVA's CLIP (through get_input_embeddings).
ARCHS = ("vlm-qwen2_5_vl", "vlm-llava")


@pytest.fixture(scope="module", params=ARCHS)
def arch_dir(request, tmp_path_factory) -> str:
    from vllm_mlx_trio.worker.demo import build_demo_model

    out = tmp_path_factory.mktemp("split") / request.param
    return str(build_demo_model(out, size=request.param, dtype="float32"))


def test_the_tower_blocks_are_found_and_a_split_encoding_gives_the_same_features(arch_dir):
    from vllm_mlx_trio.worker.vlm.encode import SplitEncode, block_list
    from vllm_mlx_trio.worker.vlm.model import new_prefill

    driver = Driver(arch_dir)
    try:
        adapter = driver.runner._adapter
        owner, name = block_list(adapter.tower)
        blocks = len(getattr(owner, name))
        seq = driver.sequence("r", "What is in this picture?", picture(4))
        prefill = new_prefill(seq, None, adapter, chunk=512)
        prefill._start(adapter)
        [item] = seq.media
        whole = SplitEncode(lambda: prefill._features(adapter, item), adapter.tower, None)
        split = SplitEncode(lambda: prefill._features(adapter, item), adapter.tower, 1e-9)
        while not whole.step():
            pass
        while not split.step():
            pass
    finally:
        driver.close()
    assert blocks == 2 and getattr(owner, name)[0].__class__.__name__ != "_Recorded"  # put back
    assert whole.steps == 1 and split.steps == blocks + 1  # one block a step, then the rest of the graph
    np.testing.assert_array_equal(np.array(split.result[0]), np.array(whole.result[0]))


def test_text_rows_decode_between_the_pieces_and_the_image_row_is_unchanged(arch_dir):
    tokens = {}
    for budget in ("none", "0.001"):
        driver = Driver(arch_dir, f"engine.mllm_encode_step_ms={budget}")
        try:
            long_text = attrs.evolve(GREEDY, max_tokens=200)
            driver.step(driver.sequence("text", "Tell me a long story.", params=long_text))
            while "text" not in driver.step():
                pass
            encoding_steps, got = 0, driver.step(driver.sequence("image", "What is in this picture?", picture(5)))
            while (
                driver.runner._prefills
                and driver.runner._prefills[0].embeds is not None
                and (driver.runner._prefills[0].to_encode or driver.runner._prefills[0].encoding is not None)
            ):
                assert "text" in got  # the text row got its token in every encoding step
                encoding_steps += 1
                got = driver.step()
            driver.running.remove("text")
            driver.run_out()
        finally:
            driver.close()
        tokens[budget] = (driver.tokens["image"], encoding_steps)
    assert tokens["0.001"][0] == tokens["none"][0] and len(tokens["none"][0]) == GREEDY.max_tokens
    # in one piece: encoded in the step the request arrived; split: a block in that step, the
    # second block in the next, the rest of the graph (merger, projector) in the one after
    assert tokens["none"][1] == 0 and tokens["0.001"][1] == 2
    mx.clear_cache()
