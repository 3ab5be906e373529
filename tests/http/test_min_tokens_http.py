"""``min_tokens`` holds off stop strings over HTTP, as in vLLM (stop strings count only past
``min_tokens`` output tokens); streamed and plain answers agree."""

from __future__ import annotations

import json

import httpx
import trio

from vllm_mlx_trio.testing.fake_executor import text_script
from vllm_mlx_trio.testing.harness import fake_executor_factory, open_server

TEXT = "a b c d e f g h i j k l m n o p q r s t u v w x y z a b c d e f g h"
BODY = {"model": "demo:tiny", "prompt": "Say:", "min_tokens": 30, "stop": [" "], "max_tokens": 60}


async def test_min_tokens_holds_off_a_stop_string(fake_cfg):
    factory = fake_executor_factory(script=text_script(TEXT), step_s=0.001, tokens_per_step=(1, 3))
    with trio.fail_after(20):
        async with open_server(fake_cfg, executor_factory=factory) as srv, httpx.AsyncClient() as http:
            plain = (await http.post(f"{srv.url}/v1/completions", json=BODY)).json()
            without = (await http.post(f"{srv.url}/v1/completions", json={**BODY, "min_tokens": 0})).json()
            async with http.stream("POST", f"{srv.url}/v1/completions", json={**BODY, "stream": True}) as resp:
                raw = (await resp.aread()).decode()
    choice = plain["choices"][0]
    assert choice["text"] == TEXT[:31] and choice["finish_reason"] == "stop"  # the 31st token is 'p'
    assert plain["usage"]["completion_tokens"] == 32  # the space that stopped it is counted
    assert without["choices"][0]["text"] == "a"  # today's behaviour without min_tokens
    events = [json.loads(e[6:]) for e in raw.split("\n\n") if e and e != "data: [DONE]"]
    choices = [c for e in events for c in e["choices"]]
    assert "".join(c["text"] for c in choices) == choice["text"]
    assert choices[-1]["finish_reason"] == "stop"
