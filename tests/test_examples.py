"""The examples run, against the real demo model, so they cannot rot."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import trio

from vllm_mlx_trio.cli import _parser
from vllm_mlx_trio.testing.harness import open_server

REPO = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.mlx
async def test_embed_engine_example(demo_cache_dir):
    example = load_example("embed_engine")
    config = str(EXAMPLES.parent / "config" / "demo.toml")
    with trio.fail_after(120):
        result = await example.main(config, (f"model.demo_cache_dir={demo_cache_dir}", "model.path=demo:tiny"))
    assert result["text"] and result["cancelled"] and result["num_requests"] == 0


@pytest.mark.mlx
async def test_openai_and_curl_examples(demo_cfg):
    example = load_example("stream_openai")
    with trio.fail_after(120):
        async with open_server(demo_cfg) as srv:
            text = await trio.to_thread.run_sync(example.main, f"{srv.url}/v1")
            if shutil.which("curl"):
                command = ["bash", str(EXAMPLES / "curl.sh"), srv.url, demo_cfg.model.path]
                result = await trio.run_process(command, capture_stdout=True)
                assert result.stdout.decode().rstrip().endswith("data: [DONE]")
    assert text


@pytest.mark.mlx
async def test_load_batching_example(demo_cache_dir, capsys):
    example = load_example("load_batching")
    args = example.parse_args(
        ["--requests", "3", "--max-tokens", "8", "--set", f"model.demo_cache_dir={demo_cache_dir}"]
    )
    with trio.fail_after(120):
        rates = await example.run(args)
    out = capsys.readouterr().out
    assert re.search(r"one at a time: 24 tokens in [0-9.]+ s = [0-9.]+ tok/s", out)
    assert re.search(r"all at once: 24 tokens in [0-9.]+ s = [0-9.]+ tok/s", out)
    assert re.search(r"^speedup: [0-9.]+x", out, re.MULTILINE)
    assert rates["sequential"] > 0 and rates["concurrent"] > 0  # no timing asserts


@pytest.mark.mlx
def test_cancellation_example_passes_under_pytest(demo_cache_dir):
    """examples/test_cancellation.py is outside testpaths: run it the way a user would."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "VLLM_MLX_TRIO_MODEL_DEMO_CACHE_DIR": demo_cache_dir,  # its real-model test
    }
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "examples/test_cancellation.py"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"\b\d+ passed\b", result.stdout), result.stdout
    assert "skipped" not in result.stdout and "deselected" not in result.stdout, result.stdout


def code_blocks(doc: pathlib.Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", doc.read_text(), re.MULTILINE | re.DOTALL)


def test_testing_cancellation_doc_quotes_the_example_verbatim():
    example = (EXAMPLES / "test_cancellation.py").read_text()
    blocks = code_blocks(REPO / "docs" / "testing-cancellation.md", "python")
    assert len(blocks) >= 3
    for block in blocks:
        assert block.strip() in example, f"not in examples/test_cancellation.py:\n{block}"


@pytest.mark.parametrize(
    "doc",
    ["README.md", "docs/getting-started.md", "docs/embedding.md", "docs/testing-cancellation.md"],
)
def test_commands_in_the_docs_are_real(doc):
    """Every vllm-mlx-trio command parses; every file a command names exists."""
    checked = 0
    for block in code_blocks(REPO / doc, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value prefixes
                words.pop(0)
            if not words:
                continue
            if words[0] == "vllm-mlx-trio":
                _parser().parse_args(words[1:])  # SystemExit on a wrong command or option
                checked += 1
            for word in words:
                if word.startswith(("config/", "examples/")):
                    assert (REPO / word).exists(), f"{doc}: {line}"
    assert checked or doc not in ("README.md", "docs/getting-started.md")
