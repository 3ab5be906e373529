"""The examples run, against the real demo model, so they cannot rot."""

from __future__ import annotations

import importlib.util
import pathlib
import shutil

import pytest
import trio

from vllm_mlx_trio.testing.harness import open_server

pytestmark = pytest.mark.mlx
EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_embed_engine_example(demo_cache_dir):
    example = load_example("embed_engine")
    config = str(EXAMPLES.parent / "config" / "demo.toml")
    with trio.fail_after(120):
        result = await example.main(config, (f"model.demo_cache_dir={demo_cache_dir}",))
    assert result["text"] and result["cancelled"] and result["num_requests"] == 0


async def test_openai_and_curl_examples(demo_cfg):
    example = load_example("stream_openai")
    with trio.fail_after(120):
        async with open_server(demo_cfg) as srv:
            text = await trio.to_thread.run_sync(example.main, f"{srv.url}/v1")
            if shutil.which("curl"):
                result = await trio.run_process(
                    ["bash", str(EXAMPLES / "curl.sh"), srv.url], capture_stdout=True
                )
                assert result.stdout.decode().rstrip().endswith("data: [DONE]")
    assert text
