"""While the model loads, the server already answers: /health 503 "loading", the API 503."""

from __future__ import annotations

import functools

import attrs
import httpx
import trio

from vllm_mlx_trio.serve import serve
from vllm_mlx_trio.testing.harness import free_port, slow_loading_factory


async def test_health_says_loading_until_the_model_is_ready(fake_cfg):
    port = free_port()
    cfg = attrs.evolve(fake_cfg, server=attrs.evolve(fake_cfg.server, port=port))
    loading, loaded, stop = trio.Event(), trio.Event(), trio.Event()
    factory = slow_loading_factory(loading, loaded)
    url = f"http://127.0.0.1:{port}"
    serving = trio.Event()  # serve() reports started once the real app listens

    async def run_server(nursery: trio.Nursery) -> None:
        await nursery.start(functools.partial(serve, cfg, shutdown_trigger=stop.wait, executor_factory=factory))
        serving.set()

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_server, nursery)
            async with httpx.AsyncClient(timeout=5) as client:
                await loading.wait()  # the model load has begun: the loading app listens
                while_loading = await client.get(f"{url}/health")
                models = await client.get(f"{url}/v1/models")
                loaded.set()
                await serving.wait()
                ready = await _health(client, url)
            stop.set()
    assert (while_loading.status_code, while_loading.json()) == (503, {"status": "loading"})
    assert models.status_code == 503 and models.headers["retry-after"]
    assert models.json()["error"]["code"] == "model_loading"
    assert ready is not None and ready.status_code == 200
    assert ready.json() == {"status": "ok"}


async def _health(client: httpx.AsyncClient, url: str) -> httpx.Response | None:
    try:
        return await client.get(f"{url}/health")
    except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError):
        return None  # between the loading app and the real one
