"""The streamed ceiling: mlx-lm's generate_step writing every token as its own SSE event to a
socket this process reads (bench/ceiling/sse_sink.py, worker/ceiling.py ``single_streamed``)."""

from __future__ import annotations

import json
import socket

import pytest

from vllm_mlx_trio.bench.ceiling.process import CeilingProcess
from vllm_mlx_trio.bench.ceiling.sse_sink import SseSink, count_content_events
from vllm_mlx_trio.bench.latency.command import CEILING_SSE
from vllm_mlx_trio.cli import main
from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.worker.ceiling import sse_chunk

ROLE = b'data: {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}\n\n'


class Pieces:
    """Stands in for a socket whose reads return ``size`` bytes at a time, then the end."""

    def __init__(self, data: bytes, size: int):
        self._pieces = [data[i : i + size] for i in range(0, len(data), size)]

    def recv(self, _max_bytes: int) -> bytes:
        return self._pieces.pop(0) if self._pieces else b""


@pytest.mark.parametrize("size", [1, 7, 1 << 16])
def test_the_sink_counts_content_events_however_the_bytes_are_split(size):
    stream = ROLE + sse_chunk("Hello") + sse_chunk("") + sse_chunk(" sea") + b"data: [DONE]\n\n"
    assert count_content_events(Pieces(stream, size)) == 3  # an empty piece is content; the role and [DONE] are not


def test_the_sink_reads_each_connection_to_its_end():
    with SseSink(2) as sink:
        for pieces in (3, 1):
            with socket.create_connection(("127.0.0.1", sink.port)) as conn:
                conn.sendall(b"".join(sse_chunk(str(i)) for i in range(pieces)) + b"data: [DONE]\n\n")
    assert sink.events == [3, 1] and sink.error is None
    assert json.loads(sse_chunk("x")[6:])["object"] == "chat.completion.chunk"


@pytest.mark.mlx
def test_the_streamed_loop_gives_the_loops_tokens_each_as_an_event(demo_cache_dir):
    cfg = load_config(None, overrides=[f"model.demo_cache_dir={demo_cache_dir}", "model.path=demo:tiny"], environ={})
    prompts = [[{"role": "user", "content": f"Tell me about number {i} and the sea."}] for i in range(2)]
    with CeilingProcess(cfg) as ceiling:
        plain = ceiling.single(prompts, num_tokens=6)
        streamed = ceiling.single_streamed(prompts, num_tokens=6)  # raises if the reader missed an event
    assert [run.token_ids for run in streamed] == [run.token_ids for run in plain]
    assert all(len(run.token_times) == 6 for run in streamed)


@pytest.mark.mlx
def test_bench_latency_with_the_streamed_ceiling_alone(tmp_path, demo_cache_dir):
    out = tmp_path / "latency.json"
    argv = ["bench", "latency", "--set", f"model.demo_cache_dir={demo_cache_dir}", "--model-dir", "demo:tiny"]
    argv += ["--peers", CEILING_SSE, "--levels", "1", "--lengths", "20", "--max-tokens", "4", "--repetitions", "1"]
    assert main([*argv, "--json", str(out)]) == 0
    table = json.loads(out.read_text())["table"]
    tokens = {r["path"]: r["tok_per_req"] for r in table}
    assert tokens == {"mlx-lm generate_step": "4", "mlx-lm generate_step + SSE": "4"}
