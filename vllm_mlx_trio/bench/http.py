"""``bench http``: streaming chat completions against any OpenAI-compatible server.

Works with ours, vllm-mlx and ``mlx_lm.server``. Completion tokens come from the final usage
chunk when the server sends one (we ask with ``stream_options.include_usage``), otherwise
from the number of content chunks; the ``count_from`` column says which. Each chunk's share
of tokens (for ITL) is the request's completion tokens over its content chunks.

``ignore_eos`` is not part of OpenAI's API: in ``auto`` mode a short warm-up request probes
whether the server accepts it, and it is sent only if it does.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from urllib.parse import urlsplit

import attrs
import httpx
import trio

from ..errors import VllmMlxTrioError
from .sse_client import SseConnections, StreamProtocolError
from .stats import RequestTrace, summarize
from .workload import SEED_MAX_TOKENS, SEED_PROMPTS, WARMUP_TOKENS, PromptBlocks, Workload, chat

#: Warm-up prompts come from far into the prompt sequence (no prefix shared with a measured one).
WARMUP_FIRST_PROMPT = 5000
IGNORE_EOS_MODES = ("auto", "on", "off")


class BenchError(VllmMlxTrioError):
    """A benchmark could not run (the server refused a request, or never came up)."""


@attrs.define(kw_only=True)
class HttpTarget:
    """Where to send requests, and what the server turned out to accept."""

    base_url: str
    model: str | None = None
    ignore_eos: str = "auto"
    #: Resolved by :func:`prepare`: whether requests carry ``ignore_eos: true``.
    send_ignore_eos: bool = False
    count_sources: set[str] = attrs.Factory(set)

    @property
    def chat_url(self) -> str:
        return f"{self.base_url.rstrip('/')}/v1/chat/completions"

    def body(self, prompt: str, max_tokens: int, *, ignore_eos: bool | None = None) -> dict:
        body = {
            "model": self.model,
            "messages": chat(prompt),
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.send_ignore_eos if ignore_eos is None else ignore_eos:
            body["ignore_eos"] = True
        return body


def _content(chunk: dict) -> bool:
    """Whether a streamed chunk carries generated text."""
    choices = chunk.get("choices") or []
    delta = choices[0].get("delta") or {} if choices else {}
    return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"))


@attrs.define
class BenchClient:
    """The benches' HTTP client: httpx for plain calls (``plain``), and for the streamed
    requests they time, the lean client of :mod:`.sse_client` (a pool per server): on a machine
    with few cores what the client spends per token is taken from the server it measures."""

    plain: httpx.AsyncClient
    read_timeout_s: float = 600.0
    max_streams: int = 64
    _pools: dict[str, SseConnections] = attrs.Factory(dict)

    def pool(self, base_url: str) -> SseConnections:
        if base_url not in self._pools:
            self._pools[base_url] = SseConnections(
                base_url, read_timeout_s=self.read_timeout_s, max_streams=self.max_streams
            )
        return self._pools[base_url]

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()


@contextlib.asynccontextmanager
async def open_bench_client(*, timeout_s: float, max_connections: int) -> AsyncIterator[BenchClient]:
    limits = httpx.Limits(max_connections=max_connections)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits) as http:
        client = BenchClient(http, read_timeout_s=timeout_s, max_streams=max_connections)
        try:
            yield client
        finally:
            client.close()


async def stream_chunks(client: BenchClient, target: HttpTarget, body: dict, on_chunk: Callable[[dict], None]) -> None:
    """POST a streamed chat to ``target`` and hand each parsed ``data:`` chunk to ``on_chunk``
    as it arrives, on the worker thread that reads the stream (to reach Trio from there, use
    ``trio.from_thread``); a refusal or an error chunk raises :class:`BenchError`."""
    url = target.chat_url

    def on_line(line: bytes) -> None:
        if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
            return
        chunk = json.loads(line[5:])
        if "error" in chunk:
            raise BenchError(f"{url} failed mid-stream: {chunk['error']}")
        on_chunk(chunk)

    try:
        status, text = await client.pool(target.base_url).post(urlsplit(url).path, body, on_line)
    except (StreamProtocolError, OSError) as exc:
        raise BenchError(f"{url}: {exc}") from exc
    if status != 200:
        raise BenchError(f"{url} answered {status}: {text.decode(errors='replace')[:300]}")


async def _stream(client: BenchClient, target: HttpTarget, body: dict) -> tuple[float, list[float], dict | None, float]:
    """POST a streaming request: (start, content chunk times, usage or None, end)."""
    start, times, usage = time.perf_counter(), [], None

    def on_chunk(chunk: dict) -> None:
        nonlocal usage
        if _content(chunk):
            times.append(time.perf_counter())
        if chunk.get("usage"):
            usage = chunk["usage"]

    await stream_chunks(client, target, body, on_chunk)
    return start, times, usage, time.perf_counter()


async def traced_request(http: BenchClient, target: HttpTarget, prompt: str, max_tokens: int) -> RequestTrace:
    start, times, usage, end = await _stream(http, target, target.body(prompt, max_tokens))
    if usage and usage.get("completion_tokens") is not None:
        target.count_sources.add("usage")
        completion, prompt_tokens = int(usage["completion_tokens"]), usage.get("prompt_tokens")
    else:
        target.count_sources.add("chunks")
        completion, prompt_tokens = len(times), None
    share = completion / len(times) if times else 0.0
    return RequestTrace(
        start=start,
        arrivals=tuple((t, share) for t in times),
        completion_tokens=completion,
        prompt_tokens=prompt_tokens,
        end=end,
    )


async def closed_loop(
    http: BenchClient, target: HttpTarget, prompts: Sequence[str], concurrency: int, max_tokens: int
) -> list[RequestTrace]:
    """``concurrency`` clients share the prompts; each sends one request at a time."""
    traces: list[RequestTrace] = []
    queue: Iterable[str] = iter(prompts)

    async def client() -> None:
        for prompt in queue:
            traces.append(await traced_request(http, target, prompt, max_tokens))

    async with trio.open_nursery() as nursery:
        for _ in range(min(concurrency, len(prompts))):
            nursery.start_soon(client)
    return traces


async def prepare(http: BenchClient, target: HttpTarget) -> None:
    """Name the model (the server's first, if not given) and settle ``ignore_eos``."""
    if target.model is None:
        resp = await http.plain.get(f"{target.base_url.rstrip('/')}/v1/models")
        resp.raise_for_status()
        target.model = resp.json()["data"][0]["id"]
    target.send_ignore_eos = target.ignore_eos == "on"
    if target.ignore_eos == "auto":
        probe = target.body(SEED_PROMPTS[0], WARMUP_TOKENS, ignore_eos=True)
        async with http.plain.stream("POST", target.chat_url, json=probe) as resp:
            await resp.aread()
            target.send_ignore_eos = resp.status_code == 200


def _count_from(target: HttpTarget) -> str:
    return "+".join(sorted(target.count_sources)) or "-"


async def run_levels(http: BenchClient, target: HttpTarget, workload: Workload, label: str) -> list[dict]:
    """Every concurrency level of the workload, each after a warm-up of short requests."""
    blocks, warmups = PromptBlocks(), PromptBlocks(WARMUP_FIRST_PROMPT)
    rows = []
    for concurrency in workload.concurrency:
        prompts = blocks.take(workload.num_requests(concurrency))
        await closed_loop(http, target, warmups.take(concurrency), concurrency, WARMUP_TOKENS)
        target.count_sources.clear()
        traces = await closed_loop(http, target, prompts, concurrency, workload.max_tokens)
        row = summarize(label, concurrency, traces)
        row["count_from"] = _count_from(target)
        rows.append(row)
    return rows


async def run_seeds(http: BenchClient, target: HttpTarget, label: str, max_tokens: int = SEED_MAX_TOKENS) -> dict:
    """vllm-mlx's five prompts: one at a time, then all at once; the speedup of the second."""
    await closed_loop(http, target, SEED_PROMPTS, len(SEED_PROMPTS), WARMUP_TOKENS)
    result: dict = {"prompts": list(SEED_PROMPTS), "max_tokens": max_tokens}
    for key, concurrency in (("sequential", 1), ("concurrent", len(SEED_PROMPTS))):
        target.count_sources.clear()
        traces = await closed_loop(http, target, SEED_PROMPTS, concurrency, max_tokens)
        result[key] = summarize(f"{label} seeds", concurrency, traces) | {"count_from": _count_from(target)}
    seq, conc = result["sequential"]["agg_tok_s"], result["concurrent"]["agg_tok_s"]
    result["speedup"] = round(conc / seq, 2) if seq and conc else None
    return result


async def bench_url(
    base_url: str,
    workload: Workload,
    *,
    model: str | None = None,
    ignore_eos: str = "auto",
    label: str = "http",
    seeds: bool = True,
) -> dict:
    """Run the levels and the seeds workload against ``base_url``; rows, seeds and settings."""
    target = HttpTarget(base_url=base_url, model=model, ignore_eos=ignore_eos)
    async with open_bench_client(timeout_s=600.0, max_connections=max(workload.concurrency) + 8) as http:
        await prepare(http, target)
        rows = await run_levels(http, target, workload, label)
        seeds_result = await run_seeds(http, target, label) if seeds else None
    return {
        "url": base_url,
        "model": target.model,
        "ignore_eos_sent": target.send_ignore_eos,
        "rows": rows,
        "seeds": seeds_result,
    }


async def bench_own_server(
    cfg, workload: Workload, *, ignore_eos: str = "auto", seeds: bool = True, executor_factory=None
) -> dict:
    """Start our server in-process on a free port and run :func:`bench_url` against it."""
    from ..local_server import open_local_server

    cfg = attrs.evolve(cfg, server=attrs.evolve(cfg.server, port=0, drain_timeout_s=1.0))
    async with open_local_server(cfg, executor_factory=executor_factory) as srv:
        label = f"our HTTP ({cfg.engine.mode})"
        return await bench_url(srv.url, workload, model=cfg.model_name, ignore_eos=ignore_eos, label=label, seeds=seeds)


def http_notes(result: dict) -> list[str]:
    if result["ignore_eos_sent"]:
        sent = "sent (a server may accept and ignore it: see tok_per_req)"
    else:
        sent = "not sent (not accepted or turned off): requests may stop at EOS"
    return [
        f"url {result['url']}, model {result['model']}, greedy, ignore_eos {sent}",
        "count_from: usage = the server's final usage chunk; chunks = one token per content chunk",
    ]
