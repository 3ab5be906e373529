"""Operating the server: /metrics, /v1/status, /version, X-Request-Id, request logs, startup line."""

from __future__ import annotations

import importlib.metadata
import io
import json
import logging

import httpx
import pytest
import trio
import trio.testing
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from vllm_mlx_trio.config import LoggingConfig, load_config
from vllm_mlx_trio.http.ops_routes import ThroughputMeter
from vllm_mlx_trio.http.request_log import MAX_REQUEST_ID_CHARS, request_id_from
from vllm_mlx_trio.logs import FIELDS, TextFormatter, configure_logging, escape_control, logfmt, make_formatter
from vllm_mlx_trio.testing.fake_executor import StepGate
from vllm_mlx_trio.testing.harness import FAKE_TEXT, fake_server
from vllm_mlx_trio.testing.polling import wait_until
from vllm_mlx_trio.testing.requests import chat_body

MODEL = "demo:tiny"
TEXT = FAKE_TEXT  # what fake_server generates
SECRET = "SECRET-PROMPT-TEXT"
REQUEST_LOGGER = "vllm_mlx_trio.http.request_log"
CHAT = {"endpoint": "/v1/chat/completions"}


def config(*overrides: str):
    return load_config(None, overrides=["server.port=0", "server.drain_timeout_s=5", *overrides], environ={})


def metric(text: str, name: str, **labels: str) -> float | None:
    """One sample's value from a Prometheus text exposition (None when absent)."""
    labels.setdefault("model_name", MODEL)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


async def scrape(http: httpx.AsyncClient, url: str) -> str:
    resp = await http.get(f"{url}/metrics")
    assert resp.status_code == 200
    return resp.text


async def poll(fetch, predicate, interval: float = 0.01):
    """``await fetch()`` until ``predicate`` holds for its value; that value."""
    return await wait_until(fetch, until=predicate, poll_s=interval)


def request_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == REQUEST_LOGGER and r.getMessage().startswith("request finished")]


# --- /metrics -------------------------------------------------------------------------------


async def test_metrics_expose_vllm_names_and_move_after_requests():
    with trio.fail_after(20):
        async with fake_server(config()) as srv, httpx.AsyncClient() as http:
            before = await scrape(http, srv.url)
            for _ in range(2):
                assert (await http.post(f"{srv.url}/v1/chat/completions", json=chat_body())).status_code == 200
            resp = await http.get(f"{srv.url}/metrics")
    after = resp.text
    assert resp.headers["content-type"] == CONTENT_TYPE_LATEST
    assert metric(after, "vllm:num_requests_running") == 0.0
    assert metric(after, "vllm:num_requests_waiting") == 0.0
    assert metric(before, "vllm:prompt_tokens_total") == 0.0
    assert metric(after, "vllm:prompt_tokens_total") > 0
    assert metric(after, "vllm:generation_tokens_total") >= 2 * (len(TEXT) + 1)
    assert metric(after, "vllm:request_success_total", finished_reason="stop", **CHAT) == 2.0
    assert metric(after, "vllm:time_to_first_token_seconds_bucket", le="+Inf", **CHAT) == 2.0
    assert metric(after, "vllm:time_to_first_token_seconds_count", **CHAT) == 2.0
    assert metric(after, "vllm:e2e_request_latency_seconds_count", **CHAT) == 2.0
    assert metric(after, "vllm:http_requests_client_disconnected_total", **CHAT) == 0.0


async def test_metrics_disabled_is_a_404():
    with trio.fail_after(20):
        async with fake_server(config("metrics.enabled=false")) as srv, httpx.AsyncClient() as http:
            resp = await http.get(f"{srv.url}/metrics")
            status = await http.get(f"{srv.url}/v1/status")
    assert resp.status_code == 404
    assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
    assert status.status_code == 200  # only /metrics goes


async def test_request_metrics_carry_the_endpoint_label():
    """Each route's requests count under its own ``endpoint``; the others stay at zero."""
    messages = {"model": MODEL, "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
    with trio.fail_after(20):
        async with fake_server(config()) as srv, httpx.AsyncClient() as http:
            for _ in range(2):
                assert (await http.post(f"{srv.url}/v1/messages", json=messages)).status_code == 200
            for path, body in (("/v1/completions", {"prompt": "hi"}), ("/v1/responses", {"input": "hi"})):
                assert (await http.post(f"{srv.url}{path}", json={"model": MODEL, **body})).status_code == 200
            text = await scrape(http, srv.url)
    counts = {"/v1/messages": 2.0, "/v1/completions": 1.0, "/v1/responses": 1.0}
    for endpoint, count in counts.items():
        assert metric(text, "vllm:request_success_total", finished_reason="stop", endpoint=endpoint) == count
        assert metric(text, "vllm:e2e_request_latency_seconds_count", endpoint=endpoint) == count
        assert metric(text, "vllm:time_to_first_token_seconds_count", endpoint=endpoint) == count
        assert metric(text, "vllm:request_generation_tokens_count", endpoint=endpoint) == count
        for phase in ("queue", "prefill", "decode"):  # the scheduler's phases carry it too
            assert metric(text, f"vllm:request_{phase}_time_seconds_count", endpoint=endpoint) == count
        assert metric(text, "vllm:http_requests_client_disconnected_total", endpoint=endpoint) == 0.0
    assert metric(text, "vllm:e2e_request_latency_seconds_count", **CHAT) is None


async def test_streaming_disconnect_counts_and_logs_aborted(caplog):
    caplog.set_level(logging.INFO, logger=REQUEST_LOGGER)
    body = chat_body(stream=True, max_tokens=4000)
    with trio.fail_after(20):
        async with fake_server(config(), then_eos=False) as srv, httpx.AsyncClient() as http:
            headers = {"X-Request-Id": "leaving-early"}
            async with http.stream("POST", f"{srv.url}/v1/chat/completions", json=body, headers=headers) as resp:
                lines = resp.aiter_lines()
                for _ in range(6):
                    await lines.__anext__()
            text = await poll(
                lambda: scrape(http, srv.url),
                lambda t: metric(t, "vllm:http_requests_client_disconnected_total", **CHAT) == 1.0,
            )
    assert metric(text, "vllm:request_success_total", finished_reason="abort", **CHAT) == 1.0
    (record,) = request_lines(caplog)
    fields = getattr(record, FIELDS)
    assert fields["request_id"] == "leaving-early" and fields["status"] == "aborted"
    assert fields["completion_tokens"] > 0 and fields["ttft_s"] is not None


async def test_non_streaming_disconnect_counts():
    gate = StepGate()
    with trio.fail_after(20):
        async with fake_server(config(), gate=gate) as srv, httpx.AsyncClient() as http:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: http.post(f"{srv.url}/v1/chat/completions", json=chat_body()))
                await poll(lambda: status(http, srv.url), lambda s: s["running"] == 1)
                nursery.cancel_scope.cancel()  # the client gives up: its connection closes
            text = await poll(
                lambda: scrape(http, srv.url),
                lambda t: metric(t, "vllm:http_requests_client_disconnected_total", **CHAT) == 1.0,
            )
            gate.allow(1000)
    assert metric(text, "vllm:request_success_total", finished_reason="abort", **CHAT) == 1.0


# --- /v1/status and /version ----------------------------------------------------------------


async def status(http: httpx.AsyncClient, url: str) -> dict:
    resp = await http.get(f"{url}/v1/status")
    assert resp.status_code == 200
    return resp.json()


def by_id(snapshot: dict) -> dict[str, dict]:
    return {r["id"]: r for r in snapshot["requests"]}


async def test_status_shows_phases_while_a_gate_holds_steps():
    gate = StepGate()
    replies = {}
    with trio.fail_after(20):
        async with fake_server(config("engine.mode=simple"), gate=gate) as srv, httpx.AsyncClient() as http:
            async with trio.open_nursery() as nursery:
                for name in ("first", "second"):

                    async def ask(name=name):
                        headers = {"X-Request-Id": name}
                        url = f"{srv.url}/v1/chat/completions"
                        replies[name] = await http.post(url, json=chat_body(), headers=headers)

                    nursery.start_soon(ask)
                    await poll(lambda: status(http, srv.url), lambda s, name=name: name in by_id(s))
                held = await status(http, srv.url)
                gate.allow(1)  # the first request's prefill step: its first token
                decoding = await poll(lambda: status(http, srv.url), lambda s: by_id(s)["first"]["phase"] == "decode")
                gate.allow(1000)
            idle = await status(http, srv.url)
    assert (held["running"], held["waiting"]) == (1, 1)
    first, second = by_id(held)["first"], by_id(held)["second"]
    assert first["phase"] == "prefill" and second["phase"] == "queued"
    assert first["prompt_tokens"] > 0 and first["output_tokens"] == 0 and first["ttft_s"] is None
    assert first["age_s"] >= 0 and first["cached_tokens"] == 0
    now_first = by_id(decoding)["first"]
    assert now_first["output_tokens"] >= 1 and now_first["ttft_s"] is not None
    assert held["mode"] == "simple" and held["uptime_s"] >= 0
    assert held["model"] == {"name": MODEL, "path": MODEL, "max_context_tokens": 4096}
    assert set(held["memory"]) == {"mlx_active_bytes", "mlx_peak_bytes", "mlx_cache_bytes"}
    assert {"enabled", "queries", "hit_rate", "blocks", "memory"} <= set(held["cache"])
    assert held["tokens_per_s"] >= 0
    assert held["kv"] == {
        "budget_tokens": None,
        "held_tokens": first["prompt_tokens"],
        "bytes_per_token": 0,
        "held_bytes": 0,
        "unshared_bytes": 0,
        "shared_bytes_saved": 0,
        "shared_prefix_in_batch": "off (this runner keeps a copy per row)",
        "preemptions": 0,
    }
    assert first["preemptions"] == 0
    assert idle["requests"] == [] and idle["running"] == 0
    assert all(r.status_code == 200 for r in replies.values())


async def test_version():
    with trio.fail_after(20):
        async with fake_server(config()) as srv, httpx.AsyncClient() as http:
            resp = await http.get(f"{srv.url}/version")
    body = resp.json()
    assert set(body) == {"version", "mlx", "mlx_lm"}
    assert body["version"] == "0.1.0" or body["version"] == importlib.metadata.version("vllm-mlx-trio")
    for key, dist in (("mlx", "mlx"), ("mlx_lm", "mlx-lm")):
        try:
            assert body[key] == importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            assert body[key] is None


async def test_throughput_meter_window(autojump_clock):
    tokens = [0.0]
    meter = ThroughputMeter(lambda: tokens[0], started_at=trio.current_time(), window_s=10, sample_s=1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(meter.run)
        await trio.sleep(5.5)
        tokens[0] = 55.0
        assert meter.tokens_per_s() == 10.0  # since start, the window is not full yet
        await trio.sleep(20)  # 55 tokens long ago, none since
        assert meter.tokens_per_s() == 0.0
        tokens[0] = 155.0
        assert meter.tokens_per_s() == pytest.approx(10.0, rel=0.11)  # 100 tokens over ~10 s
        nursery.cancel_scope.cancel()


# --- X-Request-Id ---------------------------------------------------------------------------


async def test_request_id_is_honoured_and_echoed_everywhere():
    long_id = "x" * (MAX_REQUEST_ID_CHARS + 1)
    with trio.fail_after(20):
        async with fake_server(config()) as srv, httpx.AsyncClient() as http:
            url = f"{srv.url}/v1/chat/completions"
            plain = await http.post(url, json=chat_body(), headers={"X-Request-Id": "client-7"})
            async with http.stream("POST", url, json=chat_body(stream=True), headers={"X-Request-Id": "s-1"}) as resp:
                await resp.aread()
                streamed = resp.headers
            error = await http.post(url, json={"model": "nope", "messages": []}, headers={"X-Request-Id": "e-1"})
            missing = await http.get(f"{srv.url}/v2/none", headers={"X-Request-Id": "404"})
            bad = await http.post(url, json=chat_body(), headers={"X-Request-Id": long_id})
            latin = await http.post(url, json=chat_body(), headers={"X-Request-Id": "caf\xe9".encode("latin-1")})
            none = await http.get(f"{srv.url}/health")
    assert plain.headers["x-request-id"] == "client-7"
    assert streamed["x-request-id"] == "s-1"
    assert error.status_code == 404 and error.headers["x-request-id"] == "e-1"
    assert missing.status_code == 404 and missing.headers["x-request-id"] == "404"
    for generated in (bad, latin, none):
        rid = generated.headers["x-request-id"]
        assert rid.startswith("req-") and len(rid) <= MAX_REQUEST_ID_CHARS
    assert bad.headers["x-request-id"] != latin.headers["x-request-id"]


def test_request_id_sanitising():
    assert request_id_from("abc-123") == "abc-123"
    assert request_id_from("  spaced id ") == "spaced id"
    assert request_id_from("x" * MAX_REQUEST_ID_CHARS) == "x" * MAX_REQUEST_ID_CHARS
    for bad in (None, "", "   ", "x" * (MAX_REQUEST_ID_CHARS + 1), "a\nb", "tab\there", "caf\u00e9", "\x1b[31m"):
        assert request_id_from(bad).startswith("req-"), bad


async def test_engine_ids_follow_the_header_and_stay_unique():
    gate = StepGate()
    with trio.fail_after(20):
        async with fake_server(config(), gate=gate) as srv, httpx.AsyncClient() as http:
            async with trio.open_nursery() as nursery:
                for rid, n in (("dup", 1), ("dup", 1), ("multi", 2)):
                    nursery.start_soon(
                        lambda rid=rid, n=n: http.post(
                            f"{srv.url}/v1/chat/completions", json=chat_body(n=n), headers={"X-Request-Id": rid}
                        )
                    )
                    await trio.testing.wait_all_tasks_blocked()
                held = await poll(lambda: status(http, srv.url), lambda s: len(s["requests"]) == 4)
                gate.allow(1000)
    assert set(by_id(held)) == {"dup", "dup~2", "multi-0", "multi-1"}


# --- logs -----------------------------------------------------------------------------------


async def test_request_log_line_has_the_fields_and_no_text(caplog):
    caplog.set_level(logging.INFO)
    with trio.fail_after(20):
        async with fake_server(config()) as srv, httpx.AsyncClient() as http:
            url = f"{srv.url}/v1/chat/completions"
            await http.post(url, json=chat_body(SECRET), headers={"X-Request-Id": "log-1"})
            async with http.stream("POST", url, json=chat_body(SECRET, stream=True, n=2)) as resp:
                await resp.aread()
            await http.post(url, json={"model": "nope", "messages": [{"role": "user", "content": SECRET}]})
    plain, streamed, failed = (getattr(r, FIELDS) for r in request_lines(caplog))
    assert plain["request_id"] == "log-1" and plain["status"] == "ok" and plain["finish_reason"] == "stop"
    assert plain["endpoint"] == "/v1/chat/completions"
    assert plain["completion_tokens"] == len(TEXT) + 1 and plain["prompt_tokens"] > 0
    assert plain["cached_tokens"] == 0 and plain["error"] is None
    assert 0 <= plain["ttft_s"] <= plain["duration_s"]
    assert streamed["status"] == "ok" and streamed["finish_reason"] == "stop,stop"
    assert streamed["completion_tokens"] == 2 * (len(TEXT) + 1)
    assert failed["status"] == "error" and failed["error"] == "model_not_found"
    assert failed["prompt_tokens"] == 0 and failed["ttft_s"] is None
    message = request_lines(caplog)[0].getMessage()
    assert "request_id=log-1 " in message and "status=ok " in message and "finish_reason=stop" in message
    assert SECRET not in caplog.text and TEXT not in caplog.text


async def test_startup_summary_line(caplog):
    caplog.set_level(logging.INFO, logger="vllm_mlx_trio.serve")
    with trio.fail_after(20):
        async with fake_server(config("cache.memory_mb=64")) as srv:
            pass
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ready:")]
    assert f"model={MODEL} mode=auto max_num_seqs=32 kv_budget_tokens=None prefix_cache_bytes={64 * 2**20}" in line
    assert line.endswith(f"listening={srv.url}")


def test_startup_line_names_the_speculative_method():
    from vllm_mlx_trio.serve import speculative_label

    spec = ["speculative.method=draft", "speculative.draft_model=demo:spec-draft"]
    assert speculative_label(load_config(None, overrides=spec, environ={})) == " speculative=draft"
    assert speculative_label(load_config(None, environ={})) == ""


async def test_json_log_lines_parse(caplog):
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(make_formatter("json"))
    package = logging.getLogger("vllm_mlx_trio")
    package.addHandler(handler)
    caplog.set_level(logging.INFO)
    try:
        with trio.fail_after(20):
            async with fake_server(config()) as srv, httpx.AsyncClient() as http:
                await http.post(f"{srv.url}/v1/chat/completions", json=chat_body(), headers={"X-Request-Id": "j-1"})
    finally:
        package.removeHandler(handler)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    (request,) = [line for line in lines if line["message"].startswith("request finished")]
    assert request["request_id"] == "j-1" and request["status"] == "ok" and request["level"] == "INFO"
    assert request["logger"] == REQUEST_LOGGER and request["completion_tokens"] == len(TEXT) + 1
    assert any(line["message"].startswith("ready:") for line in lines)


def test_control_characters_are_escaped():
    assert escape_control("a\nb\x1b[31m\u2028") == "a\\nb\\x1b[31m\\u2028"
    assert escape_control("café ok") == "café ok"
    assert logfmt({"id": "a b", "n": 3, "t": 0.5, "none": None, "nl": "x\ny"}) == (
        'id="a b" n=3 t=0.5000 none=- nl=x\\ny'
    )
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "evil %s", ("a\nINFO forged",), None)
    assert "\n" not in TextFormatter("%(message)s").format(record)
    line = make_formatter("json").format(record)
    assert "\n" not in line and json.loads(line)["message"] == "evil a\nINFO forged"


def test_configure_logging_sets_the_root_format():
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure_logging(LoggingConfig(level="warning", format="json"))
        (handler,) = root.handlers
        assert root.level == logging.WARNING and type(handler.formatter).__name__ == "JsonFormatter"
        configure_logging(LoggingConfig())
        assert root.level == logging.INFO and isinstance(root.handlers[0].formatter, TextFormatter)
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
