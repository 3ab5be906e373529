"""The vlm runner driven step by step (no scheduler) on the float32 demo VLM: per-row M-RoPE
in a mixed batch, chunked media prefill between decode steps, and the cache's delta bookkeeping."""

from __future__ import annotations

import itertools

import attrs
import mlx.core as mx
import numpy as np
import pytest
from PIL import Image

from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.core.params import SamplingParams
from vllm_mlx_trio.messages import NewSequence, RequestId, StepPlan
from vllm_mlx_trio.worker.vlm.cache import RopeBatchKVCache, RopeKVCache, row_positions

pytestmark = pytest.mark.mlx

LOADED = attrs.make_class("Loaded", ["image", "cache_key"])  # what the media loader gives, for an image
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=1)


class Driver:
    """A runner and the step plans a scheduler would send it."""

    def __init__(self, model_dir: str, *overrides: str):
        from vllm_mlx_trio.worker.vlm.runner import VlmRunner

        # One decode step per plan (no run-ahead, which is timed): the tests count steps.
        overrides = ("engine.run_ahead_steps=1", *overrides)
        cfg = load_config(None, overrides=[f"model.path={model_dir}", "engine.mode=vlm", *overrides], environ={})
        self.runner = VlmRunner(cfg)
        self.info = self.runner.load()
        self.steps = itertools.count()
        self.running: list[RequestId] = []
        self.tokens: dict[str, list[int]] = {}
        self.logprobs: dict[str, list[float]] = {}

    def sequence(self, rid: str, text: str, image: Image.Image | None = None, params=GREEDY, images=()) -> NewSequence:
        images = (image,) if image is not None else tuple(images)
        content = [{"type": "text", "text": text}] + [{"type": "image"} for _ in images]
        tokenizer = self.info.tokenizer
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
        media = ()
        if images:
            loaded = tuple(LOADED(im, f"k{i}") for i, im in enumerate(images))
            processor = self.info.media_processor
            rendered, items = processor.expand(rendered, loaded)
            ids = tokenizer.encode(rendered, add_special_tokens=False)
            media = processor.media_inputs(ids, items, loaded)
        ids = tokenizer.encode(rendered, add_special_tokens=False)
        return NewSequence(request_id=RequestId(rid), prompt_token_ids=tuple(ids), params=params, media=media)

    def step(self, *new: NewSequence) -> set[str]:
        """One step; the requests that got a token in it."""
        result = self.runner.execute(StepPlan(step_id=next(self.steps), new_seqs=new, decode_ids=tuple(self.running)))
        assert not result.failed, result.failed
        self.running += [seq.request_id for seq in new]
        for rid, tokens in result.sampled:
            self.tokens.setdefault(rid, []).extend(tokens)
        for rid, rows in result.logprobs:
            self.logprobs.setdefault(rid, []).extend(row.logprob for row in rows)
        done = [rid for rid in self.running if len(self.tokens.get(rid, ())) >= GREEDY.max_tokens]
        self.running = [rid for rid in self.running if rid not in done]
        return {rid for rid, _ in result.sampled}

    def run_out(self) -> None:
        for _ in range(200):
            if not self.running:
                return
            self.step()
        raise AssertionError("the requests never finished")

    def close(self) -> None:
        self.runner.close()


def picture(seed: int, size=(84, 112)) -> Image.Image:
    return Image.fromarray((np.random.default_rng(seed).random((*size, 3)) * 255).astype(np.uint8))


def test_an_image_row_decodes_the_same_alone_and_beside_text_and_image_rows(vlm32_dir):
    driver = Driver(vlm32_dir)
    try:
        alone = driver.sequence("alone", "What is in this picture?", picture(1))
        driver.step(alone)
        driver.run_out()
        reference = full_forward_logprobs(driver.runner._adapter.vlm, alone, driver.tokens["alone"])
        driver.step(driver.sequence("t1", "Tell me about the sea."), driver.sequence("i2", "And here?", picture(2)))
        driver.step(driver.sequence("t2", "Numbers: one two three four five six."))
        driver.step(driver.sequence("mixed", "What is in this picture?", picture(1)))
        driver.run_out()
    finally:
        driver.close()
    assert driver.tokens["mixed"] == driver.tokens["alone"] and len(driver.tokens["alone"]) == GREEDY.max_tokens
    np.testing.assert_allclose(driver.logprobs["mixed"], driver.logprobs["alone"], atol=1e-4)
    # and both are what one forward pass of the whole model over prompt + output gives
    np.testing.assert_allclose(driver.logprobs["alone"], reference, atol=1e-4)


def full_forward_logprobs(model, seq: NewSequence, output: list[int]) -> list[float]:
    """Each output token's logprob from mlx-vlm's own forward (vision + M-RoPE from scratch)."""
    [item] = seq.media
    ids = mx.array([list(seq.prompt_token_ids) + output])
    logits = model(ids, pixel_values=mx.array(item.pixels), image_grid_thw=mx.array([item.grid_thw])).logits
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    start = len(seq.prompt_token_ids) - 1
    return [logprobs[0, start + i, token].item() for i, token in enumerate(output)]


def test_a_media_prompt_prefills_in_chunks_while_a_text_row_decodes(vlm32_dir):
    stats = {}
    for chunk in ("8", "none"):
        # each encoding in one step (spreading it over steps is timed: tests/vlm/test_split_encode.py)
        driver = Driver(vlm32_dir, f"engine.mllm_prefill_step_size={chunk}", "engine.mllm_encode_step_ms=none")
        try:
            driver.step(driver.sequence("text", "Tell me a long story.", params=attrs.evolve(GREEDY, max_tokens=200)))
            while "text" not in driver.step():  # until the text row decodes
                pass
            image = driver.sequence("image", "What is in this picture?", picture(3))
            steps, text_tokens = 0, 0
            got = driver.step(image)
            while "image" not in got:
                steps += 1
                text_tokens += "text" in got
                got = driver.step()
            stats[chunk] = (steps, text_tokens, len(image.prompt_token_ids), driver.runner.vision_encode_s)
        finally:
            driver.close()
    steps, text_tokens, prompt_len, _ = stats["8"]
    # one step of vision encoding, then ceil((prompt - 1) / 8) chunks, the last one not counted:
    # it hands the row to the generator, whose step gives its first token. The text row decodes in each
    assert steps == -(-(prompt_len - 1) // 8) and text_tokens == steps
    assert stats["none"][0] == 1  # the encoding step, then the whole prompt in one chunk with the first token


def test_each_image_of_a_prompt_is_encoded_in_its_own_step(vlm32_dir):
    driver = Driver(vlm32_dir, "engine.mllm_prefill_step_size=512", "engine.mllm_encode_step_ms=none")
    try:
        driver.step(driver.sequence("text", "Tell me a long story.", params=attrs.evolve(GREEDY, max_tokens=200)))
        while "text" not in driver.step():
            pass
        seq = driver.sequence("images", "Compare these:", images=[picture(11), picture(12), picture(13)])
        encoded, steps = [], 0
        got = driver.step(seq)
        while "images" not in got:
            steps += 1
            assert "text" in got  # the text row decodes in every one of them
            pending = driver.runner._prefills
            encoded.append(pending[0].num_encoded if pending else None)
            got = driver.step()
    finally:
        driver.close()
    assert len(seq.media) == 3
    # one image per step, then the prompt in one chunk, whose step gives the first token
    assert encoded == [1, 2, 3] and steps == 3


def test_rope_deltas_stay_with_their_rows_through_merge_filter_extend_extract():
    def cache(length: int, delta: int) -> RopeKVCache:
        layer = RopeKVCache(delta)
        layer.update_and_fetch(mx.ones((1, 1, length, 2)) * length, mx.ones((1, 1, length, 2)))
        return layer

    batch = RopeKVCache.merge([cache(3, -5), cache(5, 0), cache(2, -1)])
    assert isinstance(batch, RopeBatchKVCache) and batch.rope_deltas.tolist() == [-5, 0, -1]
    # positions: each row's own token count + its delta
    assert row_positions(batch, 1)[0, :, 0].tolist() == [3 - 5, 5, 2 - 1]
    batch.filter([2, 0])
    assert batch.rope_deltas.tolist() == [-1, -5]
    batch.extend(RopeKVCache.merge([cache(4, -7)]))
    assert batch.rope_deltas.tolist() == [-1, -5, -7]
    out = batch.extract(1)
    assert isinstance(out, RopeKVCache) and out.rope_delta == -5 and out.offset == 3
    assert RopeKVCache.merge([RopeKVCache(-2), RopeKVCache(0)]).rope_deltas.tolist() == [-2, 0]


@pytest.mark.parametrize("where", ["before the image", "inside the image", "at its last token", "after it"])
def test_a_prefix_hit_anywhere_continues_as_a_cold_prefill(vlm32_dir, where):
    """A cache holding the first k tokens (as a prefix hit splices them): only the image tokens
    past k are encoded and embedded, the delta is recomputed, and the next logits are a cold
    prefill's."""
    from vllm_mlx_trio.worker.vlm.model import new_prefill

    driver = Driver(vlm32_dir)
    try:
        adapter = driver.runner._adapter
        seq = driver.sequence("r", "What is in this picture?", picture(4))
        [item] = seq.media
        k = {
            "before the image": item.start - 3,
            "inside the image": item.start + 5,
            "at its last token": item.start + item.num_tokens - 1,
            "after it": item.start + item.num_tokens + 2,
        }[where]
        cold, source = (new_prefill(seq, None, adapter, chunk=16) for _ in range(2))
        for prefill in (cold, source):
            while not prefill.done:
                prefill.step(adapter)
        spliced = adapter.make_cache()
        for layer, full in zip(spliced, source.cache, strict=True):
            layer.state = (full.keys[..., :k, :], full.values[..., :k, :], k)
        hit = new_prefill(attrs.evolve(seq, num_cached_tokens=k), spliced, adapter, chunk=16)
        while not hit.done:
            hit.step(adapter)
        last = mx.array([[seq.prompt_token_ids[-1]]])
        expected, got = adapter(last, cache=cold.cache), adapter(last, cache=hit.cache)
    finally:
        driver.close()
    assert hit.num_encoded == (1 if k < item.start + item.num_tokens else 0)
    assert hit.rope_delta == cold.rope_delta < 0
    np.testing.assert_allclose(np.array(got), np.array(expected), atol=1e-5)


def test_a_hit_whose_spilled_block_is_gone_is_prefilled_again_with_its_image(vlm32_dir, monkeypatch):
    driver = Driver(vlm32_dir)
    try:
        cold = driver.sequence("cold", "What is in this picture?", picture(9))
        driver.step(cold)
        driver.run_out()
        monkeypatch.setattr(driver.runner._prefix, "_read_back", lambda disk_blocks: 0)  # the disk lost it
        lost = attrs.evolve(
            cold, request_id=RequestId("lost"), num_cached_tokens=16, cached_block_ids=(7,), disk_blocks=((7, b"h"),)
        )
        result = driver.runner.execute(StepPlan(step_id=next(driver.steps), new_seqs=(lost,)))
        driver.running.append(lost.request_id)
        driver.run_out()
    finally:
        driver.close()
    assert result.recomputed == ((RequestId("lost"), 16),)
    assert driver.tokens["lost"] == driver.tokens["cold"]


def test_text_prompts_arriving_together_give_what_each_gives_alone(vlm32_dir, monkeypatch):
    """A burst of text prompts on the VLM's language model (worker/batched/prefill_burst.py): first tokens from their
    own
    prefills, then decoding together; tokens and logprobs as each alone."""
    from vllm_mlx_trio.worker.batched.generator_join import JoinedRows

    joins: list[int] = []
    join_sampled = JoinedRows.join_sampled

    def counted(self, *args, **kwargs):
        joins.append(1)
        return join_sampled(self, *args, **kwargs)

    monkeypatch.setattr(JoinedRows, "join_sampled", counted)
    texts = {"a": "Tell me about the sea.", "b": "Numbers: one two three four five six.", "c": "And the sky?"}
    driver = Driver(vlm32_dir)
    try:
        for key, text in texts.items():
            driver.step(driver.sequence(f"alone-{key}", text))
            driver.run_out()
        assert not joins
        driver.step(*(driver.sequence(key, text) for key, text in texts.items()))
        driver.run_out()
    finally:
        driver.close()
    assert len(joins) == 2  # all but the burst's last prompt
    for key in texts:
        assert driver.tokens[key] == driver.tokens[f"alone-{key}"], key
        np.testing.assert_allclose(driver.logprobs[key], driver.logprobs[f"alone-{key}"], atol=1e-4)
