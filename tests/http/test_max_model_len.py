"""``model.max_model_len``: the context capped below the model's, reported in ``/v1/models`` and
enforced with vLLM's 400 on the three APIs."""

from __future__ import annotations

import anthropic
import openai
import pytest
import trio

from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.errors import ModelLoadError
from vllm_mlx_trio.testing.clients import anthropic_client, openai_client
from vllm_mlx_trio.testing.harness import fake_server, open_fake_engine

MODEL = "demo:tiny"
#: The fake tokenizer gives a token per character: 40 characters of chat plus the template.
LONG = "x" * 40
CAP = 32


def capped_cfg(cap: int = CAP):
    return load_config(
        None, overrides=["server.port=0", "server.drain_timeout_s=5", f"model.max_model_len={cap}"], environ={}
    )


async def test_models_reports_the_cap_and_the_three_apis_refuse_past_it():
    cfg = capped_cfg()
    with trio.fail_after(30):
        async with fake_server(cfg) as srv:
            async with openai_client(srv.url) as oa, anthropic_client(srv.url) as an:
                models = await oa.models.list()
                with pytest.raises(openai.BadRequestError) as chat:
                    await oa.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": LONG}])
                with pytest.raises(openai.BadRequestError) as too_many:
                    await oa.completions.create(model=MODEL, prompt="hi", max_tokens=CAP)
                with pytest.raises(openai.BadRequestError) as responses:
                    await oa.responses.create(model=MODEL, input=LONG)
                with pytest.raises(anthropic.BadRequestError) as messages:
                    await an.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": LONG}])
                fits = await oa.completions.create(model=MODEL, prompt="hi", max_tokens=CAP - 2)
    assert models.data[0].model_extra["max_model_len"] == CAP
    for refused in (chat, responses):
        error = refused.value.body
        assert error["code"] == "context_length_exceeded" and error["type"] == "invalid_request_error"
        assert error["message"].startswith(f"This model's maximum context length is {CAP} tokens. However, your")
        assert error["message"].endswith("input tokens. Please reduce the length of the input messages.")
    assert too_many.value.body["message"] == (
        f"'max_tokens' or 'max_completion_tokens' is too large: {CAP}. This model's maximum context length "
        f"is {CAP} tokens and your request has 2 input tokens ({CAP} > {CAP} - 2)."
    )
    assert too_many.value.body["param"] == "max_tokens"
    anthropic_error = messages.value.body
    assert anthropic_error["type"] == "error" and anthropic_error["error"]["type"] == "invalid_request_error"
    assert f"This model's maximum context length is {CAP} tokens" in anthropic_error["error"]["message"]
    assert fits.usage.prompt_tokens + fits.usage.completion_tokens <= CAP


async def test_default_max_tokens_is_the_room_under_the_cap(autojump_clock):
    with trio.fail_after(10):
        async with open_fake_engine(capped_cfg(16)) as fake:
            stream = await fake.engine.submit("x" * 6)
            with stream:
                assert stream.max_tokens == 10


async def test_a_cap_above_the_models_context_fails_at_startup(autojump_clock):
    with trio.fail_after(10), pytest.raises(BaseExceptionGroup) as caught:
        async with open_fake_engine(capped_cfg(5000), max_context_tokens=4096):
            pass
    refused = caught.value.subgroup(ModelLoadError)
    assert refused is not None
    assert "model.max_model_len (5000) is greater than the model's own context length (4096" in str(
        refused.exceptions[0]
    )


async def test_clamp_max_tokens_lowers_a_max_tokens_past_the_room_left():
    """Claude Code's max_tokens 32000 on a small context: lowered to the room, not refused."""
    cfg = load_config(
        None,
        overrides=["server.port=0", f"model.max_model_len={CAP}", "limits.clamp_max_tokens=true"],
        environ={},
    )
    with trio.fail_after(30):
        async with fake_server(cfg, then_eos=False) as srv:
            async with openai_client(srv.url) as oa, anthropic_client(srv.url) as an:
                completion = await oa.completions.create(model=MODEL, prompt="hi", max_tokens=32000)
                async with an.messages.stream(
                    model=MODEL, max_tokens=32000, messages=[{"role": "user", "content": "hi"}]
                ) as stream:  # the SDK streams a request this large, as Claude Code does
                    message = await stream.get_final_message()
                with pytest.raises(openai.BadRequestError):  # no room at all stays a 400
                    await oa.completions.create(model=MODEL, prompt="x" * CAP, max_tokens=32000)
    assert completion.usage.completion_tokens == CAP - 2 and completion.choices[0].finish_reason == "length"
    assert message.usage.input_tokens + message.usage.output_tokens == CAP and message.stop_reason == "max_tokens"
