"""The VLM zoo: every architecture the vlm runner serves, each as a tiny random-weight demo in
its real architecture (float32, so a greedy row's tokens do not depend on its batch).

Per architecture: an image + text prompt gives mlx-vlm's own greedy ``stream_generate``
tokens, alone and in a batch beside text and image rows; over HTTP a repeated image request
reuses its cached prefix past the image (the content-keyed prefix cache, with the
architecture's position scheme) and answers as the cold one did."""

from __future__ import annotations

import pathlib

import pytest
import trio
from test_vlm_runner import GREEDY, Driver, picture
from vlm_helpers import image_message, image_url, video_url

from vllm_mlx_trio.config import DEMO_SIZES, load_config
from vllm_mlx_trio.testing.clients import openai_client
from vllm_mlx_trio.testing.harness import open_server

pytestmark = pytest.mark.mlx

#: Every served architecture's demo (worker/demo/vlm.py, vlm_llava.py).
QUESTION = "Describe the picture."
TIMEOUT_S = 120


#: Every vision-language demo, one per served architecture (vlm-deep-tower is vlm-tiny's
#: architecture with a deeper tower, for a benchmark; vlm-mtp-tiny is vlm-qwen3_5's with an MTP head,
#: for speculation: tests/vlm/test_vlm_speculative.py).
ZOO = tuple(size for size in DEMO_SIZES if size.startswith("vlm-") and size not in ("vlm-deep-tower", "vlm-mtp-tiny"))
#: Where mlx-vlm 0.7.10's ``stream_generate`` cannot prepare the inputs under transformers 5 (it
#: passes ``padding`` on to CLIP's image processor): the reference runs mlx-vlm's processor call
#: and its ``generate_step`` directly.
PROCESSOR_CALL = {"vlm-llava"}
#: The demos whose video parts are served (the others' are refused before decoding).
VIDEO_MODELS = {"vlm-tiny", "vlm-qwen2_5_vl", "vlm-qwen3_vl", "vlm-qwen3_vl_moe", "vlm-qwen3_5", "vlm-qwen3_5_moe"}
#: A video request's sampling: 3 s at 10 fps sampled at 2 fps gives 6 frames, 3 temporal groups.
VIDEO_SAMPLING = {"video_fps": 2.0, "video_max_frames": 8}


@pytest.fixture(scope="module", params=ZOO)
def zoo_dir(request, tmp_path_factory) -> str:
    from vllm_mlx_trio.worker.demo import build_demo_model

    out = tmp_path_factory.mktemp("zoo") / request.param
    return str(build_demo_model(out, size=request.param, dtype="float32"))


def mlx_vlm_greedy(model_dir: str, model, tokenizer, text: str, image) -> list[int]:
    """mlx-vlm's own greedy tokens for one user turn of ``text`` then ``image``."""
    import mlx_vlm
    from mlx_vlm.generate.ar import generate_step
    from mlx_vlm.generate.dispatch import stream_generate

    processor = mlx_vlm.load(model_dir)[1]
    content = [{"type": "text", "text": text}, {"type": "image"}]
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    if pathlib.Path(model_dir).name in PROCESSOR_CALL:
        inputs = processor(images=[image], text=[rendered])
        steps = generate_step(
            inputs["input_ids"], model, inputs["pixel_values"], None, max_tokens=GREEDY.max_tokens, temperature=0.0
        )
        return [int(token) for token, _ in steps][: GREEDY.max_tokens]
    steps = stream_generate(model, processor, rendered, image=[image], max_tokens=GREEDY.max_tokens, temperature=0.0)
    return [step.token for step in steps][: GREEDY.max_tokens]


def test_greedy_output_is_mlx_vlms_alone_and_in_a_mixed_batch(zoo_dir):
    # 8-token prefill chunks: the image's tokens (and their positions, deepstack features) span several
    driver = Driver(zoo_dir, "engine.mllm_prefill_step_size=8")
    try:
        driver.step(driver.sequence("alone", QUESTION, picture(7)))
        driver.run_out()
        driver.step(
            driver.sequence("text", "Tell me about the sea."), driver.sequence("other", "And here?", picture(2))
        )
        driver.step(driver.sequence("mixed", QUESTION, picture(7)))
        driver.run_out()
        reference = mlx_vlm_greedy(zoo_dir, driver.runner._adapter.vlm, driver.info.tokenizer, QUESTION, picture(7))
    finally:
        driver.close()
    assert len(set(reference)) > 1, "a demo whose greedy output is one token repeated tests nothing"
    assert driver.tokens["alone"] == reference
    assert driver.tokens["mixed"] == reference


async def test_a_repeated_image_reuses_its_prefix_and_answers_the_same(zoo_dir):
    cfg = load_config(
        None,
        overrides=[f"model.path={zoo_dir}", "server.port=0", "server.drain_timeout_s=5", "cache.block_size=16"],
        environ={},
    )
    messages = [image_message("Look at this picture closely, then answer in a few words.", image_url(3))]
    with trio.fail_after(TIMEOUT_S):
        async with open_server(cfg) as srv, openai_client(srv.url) as c:
            replies = [
                await c.chat.completions.create(model=zoo_dir, messages=messages, temperature=0, max_tokens=6)
                for _ in range(2)
            ]
            [card] = (await c.models.list()).data
    video = pathlib.Path(zoo_dir).name in VIDEO_MODELS
    assert card.model_extra["input_modalities"] == ["text", "image", *(["video"] if video else [])]
    cold, repeat = replies
    assert repeat.choices[0].message.content == cold.choices[0].message.content
    assert cold.usage.prompt_tokens_details is None or not cold.usage.prompt_tokens_details.cached_tokens
    # the image sits inside the prompt: a hit past it shows its tokens were cached under its content
    assert repeat.usage.prompt_tokens_details.cached_tokens >= cold.usage.prompt_tokens - 16


async def test_a_video_request_answers_as_mlx_vlm(zoo_dir, tmp_path):
    """A video part (sampled as mlx-vlm samples it; Qwen3-VL / Qwen3.5: a time marker per frame
    group in the prompt) gives mlx-vlm's own greedy tokens for the same clip and sampling."""
    import base64

    import mlx_vlm
    from mlx_vlm.generate.dispatch import stream_generate

    if pathlib.Path(zoo_dir).name not in VIDEO_MODELS:
        pytest.skip("images only")
    clip = video_url()
    path = tmp_path / "clip.mp4"
    path.write_bytes(base64.b64decode(clip.split(",", 1)[1]))
    model, processor = mlx_vlm.load(zoo_dir)
    content = [{"type": "text", "text": QUESTION}, {"type": "video"}]
    rendered = processor.tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    steps = stream_generate(
        model,
        processor,
        rendered,
        video=[str(path)],
        fps=VIDEO_SAMPLING["video_fps"],
        max_frames=VIDEO_SAMPLING["video_max_frames"],
        max_tokens=GREEDY.max_tokens,
        temperature=0.0,
    )
    tokens = [step.token for step in steps][: GREEDY.max_tokens]
    assert len(set(tokens)) > 1, "a greedy output of one token repeated tests nothing"
    reference = processor.tokenizer.decode(tokens)
    cfg = load_config(
        None, overrides=[f"model.path={zoo_dir}", "server.port=0", "server.drain_timeout_s=5"], environ={}
    )
    message = {
        "role": "user",
        "content": [{"type": "text", "text": QUESTION}, {"type": "video_url", "video_url": {"url": clip}}],
    }
    with trio.fail_after(TIMEOUT_S):
        async with open_server(cfg) as srv, openai_client(srv.url) as c:
            reply = await c.chat.completions.create(
                model=zoo_dir,
                messages=[message],
                temperature=0,
                max_tokens=GREEDY.max_tokens,
                extra_body={**VIDEO_SAMPLING, "ignore_eos": True},
            )
    assert reply.choices[0].message.content == reference
