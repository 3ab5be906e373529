"""The demo VLM (tiny Qwen2-VL, M-RoPE) over HTTP with the openai client, on MLX on the CPU."""

from __future__ import annotations

import httpx
import pytest
import trio
from vlm_helpers import MODEL, image_message, image_url, media_position, video_message, video_url

from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.testing.clients import openai_client
from vllm_mlx_trio.testing.harness import open_server

pytestmark = pytest.mark.mlx

TIMEOUT_S = 180
#: Text before the image: more than two 16-token cache blocks.
PREAMBLE = "You are a careful assistant. Look at the picture below and answer in one short sentence. " * 2


async def chat(c, messages, model=MODEL, **kwargs):
    kwargs = {"temperature": 0, "max_tokens": 8, **kwargs}
    return await c.chat.completions.create(model=model, messages=messages, **kwargs)


async def test_image_streams_and_a_repeat_hits_the_cache_past_the_image(vlm_cfg):
    messages = [image_message(PREAMBLE, image_url(1))]
    with trio.fail_after(TIMEOUT_S):
        async with open_server(vlm_cfg) as srv, openai_client(srv.url) as c:
            stream = await c.chat.completions.create(
                model=MODEL,
                messages=messages,
                temperature=0,
                max_tokens=8,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [chunk async for chunk in stream]
            again = await chat(c, messages)
            models = await c.models.list()
            metrics = await http_get(f"{srv.url}/metrics")
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    usage = chunks[-1].usage
    assert text and text == again.choices[0].message.content  # greedy: the hit continues exactly
    assert usage.completion_tokens == 8 and usage.prompt_tokens > 12
    cached = again.usage.prompt_tokens_details.cached_tokens
    # the image's 12 tokens sit after the preamble; the repeat reuses KV past all of them
    assert cached >= usage.prompt_tokens - 16 and cached > len(PREAMBLE) // 8 + 12
    [model] = models.data
    assert model.model_extra.get("input_modalities") == ["text", "image", "video"]
    assert 'vllm_mlx_trio_images_processed_total{model_name="demo:vlm-tiny"} 2.0' in metrics
    # the repeat's image is wholly in the cached prefix: it is not encoded again
    assert 'vllm_mlx_trio_vision_encode_seconds_count{model_name="demo:vlm-tiny"} 1.0' in metrics


async def http_get(url: str) -> str:
    async with httpx.AsyncClient() as http:
        return (await http.get(url)).text


async def test_same_text_with_another_image_reuses_only_the_text_before_it(vlm_cfg, demo_cache_dir):
    first = [image_message(PREAMBLE, image_url(1))]
    other = [image_message(PREAMBLE, image_url(2))]
    with trio.fail_after(TIMEOUT_S):
        async with open_server(vlm_cfg) as srv, openai_client(srv.url) as c:
            await chat(c, first)
            again = await chat(c, other)
    image_position = media_position(demo_cache_dir, PREAMBLE)
    cached = again.usage.prompt_tokens_details.cached_tokens
    # the text before the image is shared (its full blocks, and a tail up to the image at
    # most); no token from the image on
    assert 0 < image_position // 16 * 16 <= cached <= image_position


async def test_video_sampling_options_key_the_cache(vlm_cfg, demo_cache_dir):
    clip = video_url()
    messages = [video_message(PREAMBLE, clip)]
    with trio.fail_after(TIMEOUT_S):
        async with open_server(vlm_cfg) as srv, openai_client(srv.url) as c:
            first = await chat(c, messages, extra_body={"video_fps": 2, "video_max_frames": 4})
            same = await chat(c, messages, extra_body={"video_fps": 2, "video_max_frames": 4})
            slower = await chat(c, messages, extra_body={"video_fps": 1, "video_max_frames": 4})
    prompt = first.usage.prompt_tokens
    assert first.choices[0].message.content == same.choices[0].message.content
    assert same.usage.prompt_tokens_details.cached_tokens >= prompt - 16
    # another fps samples other frames: a miss from the video on
    video_position = media_position(demo_cache_dir, PREAMBLE)
    assert prompt >= video_position + 8  # 4 frames of 56x56: 2 x 2 x 2 merged patches
    assert video_position // 16 * 16 <= slower.usage.prompt_tokens_details.cached_tokens <= video_position


async def test_a_greedy_image_request_alone_equals_it_inside_a_batch(vlm32_dir):
    cfg = load_config(
        None,
        overrides=[
            "server.port=0",
            f"model.path={vlm32_dir}",
            "engine.mode=vlm",
            "cache.enabled=false",
            f"server.served_model_name={MODEL}",
        ],
        environ={},
    )
    target = [image_message("What is in this picture?", image_url(5))]
    others = [
        [{"role": "user", "content": "Tell me about the sea."}],
        [image_message("And in this one?", image_url(6, size=(140, 84)))],
        [{"role": "user", "content": "Count: one two three four five."}],
        [image_message("Once more:", image_url(7))],
    ]
    with trio.fail_after(TIMEOUT_S):
        async with open_server(cfg) as srv, openai_client(srv.url) as c:
            alone = await chat(c, target, max_tokens=12)
            results = {}

            async def one(key, messages):
                results[key] = await chat(c, messages, max_tokens=12)

            async with trio.open_nursery() as nursery:
                for i, messages in enumerate(others):
                    nursery.start_soon(one, i, messages)
                nursery.start_soon(one, "target", target)
    assert results["target"].choices[0].message.content == alone.choices[0].message.content
    assert alone.usage.completion_tokens == 12


async def test_a_hit_past_the_image_continues_exactly(vlm32_dir, demo_cache_dir):
    """The same image with other text after it: the hit covers the image (not encoded again),
    the M-RoPE delta is recomputed, and the answer equals a cold prefill's, logprobs included."""
    picture = image_url(8, size=(168, 224))  # 6 x 8 = 48 image tokens
    first = [image_message(PREAMBLE, picture, " Describe it.")]
    second = [image_message(PREAMBLE, picture, " What colour is it?")]

    def cfg(*overrides):
        base = ["server.port=0", f"model.path={vlm32_dir}", "engine.mode=vlm", f"server.served_model_name={MODEL}"]
        return load_config(None, overrides=[*base, "cache.block_size=16", *overrides], environ={})

    answers = {}
    with trio.fail_after(TIMEOUT_S):
        async with open_server(cfg()) as srv, openai_client(srv.url) as c:
            await chat(c, first)
            answers["hit"] = await chat(c, second, logprobs=True)
        async with open_server(cfg("cache.enabled=false")) as srv, openai_client(srv.url) as c:
            answers["cold"] = await chat(c, second, logprobs=True)
    image_position = media_position(demo_cache_dir, PREAMBLE)
    assert answers["hit"].usage.prompt_tokens_details.cached_tokens > image_position + 48
    hit, cold = (answers[k].choices[0] for k in ("hit", "cold"))
    assert hit.message.content == cold.message.content
    for a, b in zip(hit.logprobs.content, cold.logprobs.content, strict=True):
        assert a.token == b.token and abs(a.logprob - b.logprob) < 1e-4
