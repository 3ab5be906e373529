"""Draining a replica behind vllm-router: SIGTERM makes it refuse new requests (503, ``/health``
503) while its in-flight stream finishes; the router sends the new requests to the other one."""

from __future__ import annotations

import contextlib
import signal

import httpx
import openai
import pytest
import trio
from replicas import ROUTER, replica, router

pytestmark = [
    pytest.mark.mlx,
    pytest.mark.skipif(not ROUTER.exists(), reason="vllm-router is not installed (the test extra has it)"),
]
MODEL = "demo:tiny"
RUNNING = "vllm:num_requests_running"
SUCCESS = "vllm:request_success_total"
#: Long enough that the stream is still running when the replica starts draining.
LONG_TOKENS = 1500
ROUTER_FLAGS = (
    "--cb-failure-threshold",
    "1",
    "--retry-max-retries",
    "3",
    "--retry-initial-backoff-ms",
    "10",
    "--health-check-interval-secs",
    "1",
    "--health-failure-threshold",
    "1",
)


async def wait_health(http: httpx.AsyncClient, url: str, status: int) -> None:
    while True:
        with contextlib.suppress(httpx.TransportError):
            if (await http.get(f"{url}/health")).status_code == status:
                return
        await trio.sleep(0.05)


async def test_draining_replica_finishes_its_stream_while_new_requests_go_to_the_other(tmp_path, demo_cache_dir):
    drain = "server.drain_timeout_s=120"
    with trio.fail_after(240):
        async with (
            replica(tmp_path, demo_cache_dir, drain) as a,
            replica(tmp_path, demo_cache_dir, drain) as b,
            router(tmp_path, [a.url, b.url], "round_robin", *ROUTER_FLAGS) as front,
            httpx.AsyncClient(timeout=10) as http,
        ):
            client = openai.AsyncOpenAI(base_url=f"{front.url}/v1", api_key="none", max_retries=0)
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "tell a long story"}],
                max_tokens=LONG_TOKENS,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            chunks = [await stream.__anext__()]
            holder, other = (a, b) if await a.metric(http, RUNNING) else (b, a)
            assert await holder.metric(http, RUNNING) == 1 and await other.metric(http, RUNNING) == 0
            served_before = await other.metric(http, SUCCESS)
            holder.proc.send_signal(signal.SIGTERM)
            await wait_health(http, holder.url, 503)  # draining: new requests are refused there
            answers = []
            for i in range(4):
                answers.append(
                    await client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": f"q{i}"}], max_tokens=4
                    )
                )
            still_running = await holder.metric(http, RUNNING)
            served = await other.metric(http, SUCCESS) - served_before
            chunks += [chunk async for chunk in stream]
            code = await holder.proc.wait()
    assert still_running == 1  # the new requests were answered while the drained stream ran
    assert [answer.choices[0].finish_reason for answer in answers] == ["length"] * 4
    assert served == 4
    finished = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finished == ["length"] and chunks[-1].usage.completion_tokens == LONG_TOKENS
    assert code == 0
