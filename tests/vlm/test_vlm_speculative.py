"""Speculative decoding on a vision-language model (the vlm-speculative runner) on demo:vlm-mtp-tiny, a Qwen3.5
VLM carrying an MTP head, float32: greedy output identical with MTP on and off for image + text prompts alone and
in a mixed batch, drafts accepted only inside the MLLM envelope (alone, greedy, no request-local processors), the
hidden-state mode and the thinking-retirement opt-in as in text mode; a draft model drafts for a VLM too."""

from __future__ import annotations

import itertools
import sys

import attrs
import pytest
import trio
from test_vlm_runner import Driver, picture

from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.core.params import SamplingParams
from vllm_mlx_trio.messages import NewSequence

pytestmark = pytest.mark.mlx

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
QUESTION = "Describe the picture."
MTP = ("speculative.method=mtp", "speculative.num_draft_tokens=3")
#: Tokens one verify forward runs: the pending token and the drafts.
MTP_VERIFY_TOKENS = 4


def _spec_helpers():
    """tests/spec's plan driver and counters (that package imports as ``tests.spec`` from the repository root)."""
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    if root not in sys.path:
        sys.path.insert(0, root)
    from tests.spec.conftest import PlanDriver
    from tests.spec.mtp_parts import recorded_modes, spec_counts

    return PlanDriver, spec_counts, recorded_modes


PlanDriver, spec_counts, recorded_modes = _spec_helpers()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from vllm_mlx_trio.worker.demo import build_demo_model

    return str(
        build_demo_model(tmp_path_factory.mktemp("vlm-mtp") / "vlm-mtp-tiny", size="vlm-mtp-tiny", dtype="float32")
    )


class Runner(Driver):
    """A runner of the kind ``engine.mode`` (default "auto") picks, loaded, and its sequences (the vlm runner
    driver's prompt building)."""

    def __init__(self, model_dir: str, *overrides: str, **kwargs):
        from vllm_mlx_trio.worker.registry import runner_for

        overrides = ("engine.run_ahead_steps=1", "engine.mllm_prefill_step_size=8", *overrides)
        cfg = load_config(None, overrides=[f"model.path={model_dir}", *overrides], environ={})
        self.runner = runner_for(cfg)(cfg, **kwargs)
        self.info = self.runner.load()
        self.steps = itertools.count()

    def run(self, *batches: tuple[NewSequence, ...]):
        """Each batch of sequences added at once, run until done; the plan driver."""
        driver = PlanDriver(self.runner)
        for batch in batches:
            driver.step(new=batch)
            driver.run_until_done()
        return driver


@pytest.fixture(scope="module")
def runners(model_dir):
    made = [Runner(model_dir), Runner(model_dir, *MTP)]
    yield made
    for runner in made:
        runner.close()


def _requests(r: Runner, params=GREEDY) -> list[tuple[NewSequence, ...]]:
    """An image request alone, a text request alone, then an image and a text request together."""
    return [
        (r.sequence("image", QUESTION, picture(7), params=params),),
        (r.sequence("text", "Tell me about the sea.", params=params),),
        (
            r.sequence("mixed-image", QUESTION, picture(7), params=params),
            r.sequence("mixed-text", "Tell me about the sea.", params=params),
        ),
    ]


def test_auto_mode_with_mtp_serves_the_vlm_with_speculation_and_greedy_output_is_unchanged(runners):
    from vllm_mlx_trio.worker.speculative.mtp.drafter import MTPDrafter

    plain, spec = runners
    assert plain.info.runner_kind == "vlm" and spec.info.runner_kind == "vlm-speculative"
    assert isinstance(spec.runner._drafter, MTPDrafter) and spec.runner._drafter.hidden_state_mode == "post_norm"
    reference = plain.run(*_requests(plain))
    driver = PlanDriver(spec.runner)
    counts, rounds_beside = [], 0
    for batch in _requests(spec):
        driver.step(new=batch)
        while driver.active:
            beside = len(driver.active) > 1
            driver.step()
            rounds_beside += beside and driver.results[-1].spec_decode is not None
        counts.append(spec_counts(driver))
    assert dict(driver.outputs) == dict(reference.outputs)
    assert len(set(reference.outputs["image"])) > 1
    assert reference.outputs["mixed-image"] == reference.outputs["image"]
    (image_drafts, image_accepted), text, mixed = counts
    assert image_drafts > 0 and image_accepted > 0  # the image request alone speculated, drafts accepted
    assert text[0] > image_drafts
    # two requests together: the normal path while both run (the image one speculates once the text one is done)
    assert rounds_beside == 0 and mixed[0] > text[0]
    assert max(len(tokens) for r in driver.results for _, tokens in r.sampled) > 1  # runs of accepted drafts


@pytest.mark.parametrize(
    "params",
    [
        attrs.evolve(GREEDY, temperature=0.7),  # the drafter could sample; the MLLM envelope is greedy-only
        attrs.evolve(GREEDY, top_k=5),
        attrs.evolve(GREEDY, repetition_penalty=1.2),  # a request-local logits processor
    ],
)
def test_a_request_outside_the_envelope_takes_the_normal_path(runners, params):
    plain, spec = runners
    [image, *_] = _requests(spec, params)
    driver = spec.run(image)
    assert spec_counts(driver) == (0, 0) and len(driver.outputs["image"]) == GREEDY.max_tokens
    if params.temperature == 0:  # greedy with a processor: the same tokens as the plain runner
        assert driver.outputs["image"] == plain.run(image).outputs["image"]


def test_pre_norm_from_the_config_reaches_the_verify_forward_and_changes_no_token(model_dir, runners, monkeypatch):
    modes = recorded_modes(monkeypatch)
    plain, _ = runners
    spec = Runner(model_dir, *MTP, "speculative.hidden_state_mode=pre_norm")
    try:
        [image, *_] = _requests(spec)
        driver = spec.run(image)
    finally:
        spec.close()
    assert driver.outputs["image"] == plain.run(image).outputs["image"]
    assert modes and set(modes) == {"pre_norm"} and spec_counts(driver)[0] > 0


@pytest.mark.parametrize("resume", [False, True])
def test_a_thinking_image_request_speculates_after_its_reasoning_only_with_the_opt_in(
    model_dir, runners, resume, monkeypatch
):
    """The image prompt opens the thinking block; it comes back (as after a preemption) with the block closed in
    its output. Default: it never speculates; with the opt-in it does. Output identical either way."""
    monkeypatch.delenv("VLLM_MLX_ENABLE_THINKING_RETIREMENT_RESUME", raising=False)
    plain, _ = runners
    tokenizer = plain.info.tokenizer
    opener, closed = tokenizer.encode("<think>"), tokenizer.encode("some thought</think>")
    extra = ["model.reasoning_parser=qwen3", f"speculative.thinking_retirement_resume={str(resume).lower()}"]
    spec = Runner(model_dir, *MTP, *extra)

    def thinking(r: Runner, output: list[int]) -> NewSequence:
        seq = r.sequence("think", QUESTION, picture(7), params=GREEDY)
        return attrs.evolve(
            seq, prompt_token_ids=(*seq.prompt_token_ids, *opener, *output), num_output_tokens=len(output)
        )

    try:
        inside, after = spec.run((thinking(spec, []),)), spec.run((thinking(spec, closed),))
    finally:
        spec.close()
    assert inside.outputs["think"] == plain.run((thinking(plain, []),)).outputs["think"]
    assert after.outputs["think"] == plain.run((thinking(plain, closed),)).outputs["think"]
    assert spec_counts(inside)[0] == 0  # inside the block: never
    assert (spec_counts(after)[0] > 0) is resume


def test_a_draft_model_drafts_for_a_vlm(vlm32_dir):
    """demo:vlm-tiny (Qwen2-VL) drafting for itself through mlx-lm's text model: the greedy output is the vlm
    runner's; the draft model sees no image (its drafts after one are mostly rejected), but on a text prompt it is
    the target's own text model: every draft accepted."""
    plain = Runner(vlm32_dir, "engine.mode=vlm")
    spec = Runner(vlm32_dir, "engine.mode=vlm", "speculative.method=draft", f"speculative.draft_model={vlm32_dir}")
    try:
        image, text, _ = _requests(spec)
        with_image, with_text = spec.run(image), spec.run(text)
        reference = plain.run(image, text)
    finally:
        plain.close()
        spec.close()
    assert spec.info.runner_kind == "vlm-speculative"
    assert with_image.outputs["image"] == reference.outputs["image"]
    assert with_text.outputs["text"] == reference.outputs["text"]
    assert spec_counts(with_image)[0] > 0
    drafts, accepted = spec_counts(with_text)
    assert drafts > 0 and accepted == drafts


async def test_over_http_an_image_request_speculates_and_answers_as_the_plain_runner(model_dir, runners):
    """The real server on the demo with MTP on ("auto" picks vlm-speculative): the official client's greedy image
    request gets the plain runner's tokens as text, and /v1/status counts accepted drafts."""
    import httpx
    from vlm_helpers import image_url

    from vllm_mlx_trio.testing.clients import openai_client
    from vllm_mlx_trio.testing.harness import open_server

    plain, _ = runners
    [image, *_] = _requests(plain)
    expected = plain.info.tokenizer.decode(plain.run(image).outputs["image"])
    overrides = [f"model.path={model_dir}", "server.port=0", "server.drain_timeout_s=5", *MTP]
    cfg = load_config(None, overrides=overrides, environ={})
    content = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": image_url(7)}}]
    with trio.fail_after(120):
        async with open_server(cfg) as srv, openai_client(srv.url) as c, httpx.AsyncClient() as http:
            reply = await c.chat.completions.create(
                model=model_dir,
                messages=[{"role": "user", "content": content}],
                temperature=0,
                max_tokens=GREEDY.max_tokens,
                extra_body={"ignore_eos": True},
            )
            status = (await http.get(f"{srv.url}/v1/status")).json()
    assert reply.choices[0].message.content == expected
    assert status["runner"] == "vlm-speculative"
    assert status["speculative"]["method"] == "mtp" and status["speculative"]["accepted_tokens"] > 0


def test_verify_forwards_run_the_gated_delta_recurrence_token_by_token(runners, monkeypatch):
    """mlx-vlm's chunked prefill scan (64-token chunks) is for prompts: a verify forward of a few tokens, and the
    replay of the kept ones, run the per-token recurrence the decode step runs (several times cheaper here)."""
    import mlx_vlm.models.qwen3_5.gated_delta as gated_delta

    _, spec = runners
    lengths: list[int] = []
    chunked = gated_delta.gated_delta_chunked

    def recording(q, *args, **kwargs):
        lengths.append(q.shape[1])
        return chunked(q, *args, **kwargs)

    monkeypatch.setattr(gated_delta, "gated_delta_chunked", recording)
    [_, text, _] = _requests(spec)
    driver = spec.run(text)
    assert spec_counts(driver)[0] > 0
    assert lengths and min(lengths) > MTP_VERIFY_TOKENS  # the prompt's prefill only
