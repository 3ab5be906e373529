"""vLLM's request extension fields: parsed, honoured end to end, ignored only when listed."""

from __future__ import annotations

import json

import attrs
import httpx
import pytest
import trio

from vllm_mlx_trio.http.model_names import ServedNames
from vllm_mlx_trio.actors.admission.chat_template import ChatTemplateOptions, tokenize_prompt
from vllm_mlx_trio.core.scheduler import Scheduler
from vllm_mlx_trio.errors import InvalidRequestError
from vllm_mlx_trio.http.openai import extensions
from vllm_mlx_trio.http.openai.requests import parse_chat, parse_completion
from vllm_mlx_trio.messages import ChatMessage, TextPart
from vllm_mlx_trio.testing.harness import fake_server
from vllm_mlx_trio.testing.requests import chat_body, make_request, post_chat

MODEL = "demo:tiny"
#: The fake tokenizer's EOS as text.
EOS_TEXT = "<|im_end|>"
CHAT = [{"role": "user", "content": "hi"}]


def parsed_chat(**fields):
    return parse_chat(chat_body(**fields), model_names=ServedNames((MODEL,)), max_n=4)


def completion(**fields):
    return parse_completion({"model": MODEL, "prompt": "Say:", **fields}, model_names=ServedNames((MODEL,)), max_n=4)


# -- parsing -------------------------------------------------------------------------------


def test_router_body_with_no_stop_trim_is_accepted_and_keeps_stop_strings():
    assert parsed_chat(no_stop_trim=True).params.include_stop_str_in_output
    assert completion(include_stop_str_in_output=True).params.include_stop_str_in_output
    assert not parsed_chat(no_stop_trim=False).params.include_stop_str_in_output


def test_honoured_fields_reach_the_params():
    params = parsed_chat(skip_special_tokens=False, priority=-3, add_generation_prompt=False).params
    assert (params.skip_special_tokens, params.priority, params.add_generation_prompt) == (False, -3, False)
    params = parsed_chat(continue_final_message=True).params
    assert params.continue_final_message and not params.add_generation_prompt
    defaults = parsed_chat().params
    assert (defaults.skip_special_tokens, defaults.add_generation_prompt, defaults.priority) == (True, True, 0)


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"skip_special_tokens": 1}, "skip_special_tokens", None),
        ({"priority": "high"}, "priority", None),
        ({"add_generation_prompt": True, "continue_final_message": True}, "continue_final_message", None),
        ({"use_beam_search": True}, "use_beam_search", "unsupported_parameter"),
        ({"prompt_logprobs": 2}, "prompt_logprobs", "unsupported_parameter"),
        ({"my_own_field": 1}, "my_own_field", "unknown_parameter"),
        ({"request_id": ""}, "request_id", None),
    ],
)
def test_bad_or_unhonoured_extensions_are_a_400_naming_them(fields, param, code):
    with pytest.raises(InvalidRequestError) as caught:
        parsed_chat(**fields)
    assert (caught.value.param, caught.value.code) == (param, code)


def test_chat_only_extensions_stay_refused_on_completions():
    with pytest.raises(InvalidRequestError) as caught:
        completion(echo=True)
    assert caught.value.code == "unsupported_parameter"
    with pytest.raises(InvalidRequestError) as caught:
        completion(continue_final_message=True)
    assert caught.value.code == "unknown_parameter"


def test_listed_fields_are_ignored_and_off_values_accepted(caplog):
    caplog.set_level("DEBUG", logger=extensions.__name__)
    parsed = parsed_chat(spaces_between_special_tokens=False, kv_transfer_params={"x": 1}, use_beam_search=False)
    assert parsed.params == parsed_chat().params
    assert "ignoring spaces_between_special_tokens" in caplog.text
    assert set(extensions.IGNORED).isdisjoint(extensions.HONOURED)


def test_unknown_fields_ignore_policy_drops_them_but_still_checks_known_ones():
    body = {"model": MODEL, "messages": CHAT, "my_own_field": [1], "temperature": 0.5}
    parsed = parse_chat(body, model_names=ServedNames((MODEL,)), max_n=4, unknown_fields="ignore")
    assert parsed.params.temperature == 0.5
    with pytest.raises(InvalidRequestError):
        parse_chat({**body, "temperature": "hot"}, model_names=ServedNames((MODEL,)), max_n=4, unknown_fields="ignore")
    with pytest.raises(InvalidRequestError):
        parse_chat({**body, "use_beam_search": True}, model_names=ServedNames((MODEL,)), max_n=4, unknown_fields="ignore")


# -- behaviour -----------------------------------------------------------------------------


def test_priority_orders_the_queue_first_come_first_served_within_one():
    scheduler = Scheduler(max_running=1)
    for name, priority in [("a", 0), ("b", 5), ("c", 0), ("d", -1), ("e", 5)]:
        scheduler.add(make_request(name, prompt=(10,), max_tokens=2, priority=priority))
    assert [r.request_id for r in scheduler.waiting] == ["d", "a", "c", "b", "e"]


class TemplateTokenizer:
    """Records the chat template's keywords."""

    def __init__(self):
        self.kwargs = {}

    def apply_chat_template(self, turns, tokenize=False, **kwargs):
        self.kwargs = kwargs
        return "rendered"

    def encode(self, text, add_special_tokens=True):
        return [1, 2]


def test_template_options_reach_the_chat_template():
    prompt = (ChatMessage(role="user", content=(TextPart(text="hi"),)),)
    tokenizer = TemplateTokenizer()
    tokenize_prompt(tokenizer, prompt, ChatTemplateOptions(add_generation_prompt=False))
    assert tokenizer.kwargs == {"add_generation_prompt": False}
    tokenize_prompt(tokenizer, prompt, ChatTemplateOptions.of(parsed_chat(continue_final_message=True).params))
    assert tokenizer.kwargs == {"add_generation_prompt": False, "continue_final_message": True}
    tokenize_prompt(tokenizer, prompt)
    assert tokenizer.kwargs == {"add_generation_prompt": True}


async def test_stop_string_is_kept_with_include_stop_str_in_output(fake_cfg):
    with trio.fail_after(30):
        async with fake_server(fake_cfg, "Hello, world!") as srv, httpx.AsyncClient() as http:
            base = {"messages": CHAT, "stop": ["world"]}
            trimmed = await post_chat(http, srv.url, **base)
            kept = await post_chat(http, srv.url, **base, no_stop_trim=True)
    assert trimmed["choices"][0]["message"]["content"] == "Hello, "
    assert kept["choices"][0]["message"]["content"] == "Hello, world"


async def test_special_tokens_are_text_when_not_skipped(fake_cfg):
    with trio.fail_after(30):
        async with fake_server(fake_cfg, "a<|im_start|>b") as srv, httpx.AsyncClient() as http:
            skipped = await post_chat(http, srv.url)
            kept = await post_chat(http, srv.url, skip_special_tokens=False)
            body = {"messages": CHAT, "skip_special_tokens": False, "include_stop_str_in_output": True, "stream": True}
            async with http.stream("POST", f"{srv.url}/v1/chat/completions", json={"model": MODEL, **body}) as resp:
                streamed = (await resp.aread()).decode()
    assert skipped["choices"][0]["message"]["content"] == "ab"
    # vLLM's rule: the EOS that ended the reply is counted, not shown, unless include_stop_str_in_output
    assert kept["choices"][0]["message"]["content"] == "a<|im_start|>b"
    assert kept["usage"]["completion_tokens"] == skipped["usage"]["completion_tokens"] == 4
    assert EOS_TEXT in streamed and EOS_TEXT not in json.dumps(kept)


async def test_request_id_echo_and_token_ids(fake_cfg):
    turns = [*CHAT, {"role": "assistant", "content": "Sure: "}]
    with trio.fail_after(30):
        async with fake_server(fake_cfg, "ok") as srv, httpx.AsyncClient() as http:
            body = {
                "messages": turns,
                "echo": True,
                "request_id": "abc-1",
                "logprobs": True,
                "return_tokens_as_token_ids": True,
            }
            full = await post_chat(http, srv.url, **body)
            async with http.stream(
                "POST", f"{srv.url}/v1/chat/completions", json={"model": MODEL, **body, "stream": True}
            ) as resp:
                raw = (await resp.aread()).decode()
    assert full["id"] == "chatcmpl-abc-1"
    assert full["choices"][0]["message"]["content"] == "Sure: ok"
    tokens = [entry["token"] for entry in full["choices"][0]["logprobs"]["content"]]
    assert tokens[0].startswith("token_id:") and tokens[0] != "token_id:o"
    assert '"content": "Sure: "' in raw and '"id": "chatcmpl-abc-1"' in raw


async def test_unknown_fields_ignore_is_a_server_option(fake_cfg):
    cfg = attrs.evolve(fake_cfg, server=attrs.evolve(fake_cfg.server, unknown_fields="ignore"))
    with trio.fail_after(30):
        async with fake_server(cfg, "ok") as srv, httpx.AsyncClient() as http:
            answer = await post_chat(http, srv.url, my_extra={"a": 1})
        async with fake_server(fake_cfg, "ok") as srv, httpx.AsyncClient() as http:
            refused = await http.post(
                f"{srv.url}/v1/chat/completions", json={"model": MODEL, "messages": CHAT, "my_extra": 1}
            )
    assert answer["choices"][0]["message"]["content"] == "ok"
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "my_extra"
