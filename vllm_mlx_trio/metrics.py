"""Prometheus metrics with vLLM's names (``vllm:*``, labelled ``model_name``) so dashboards
and autoscalers built for vLLM work unchanged, plus ``vllm_mlx_trio_*`` extras.

Each engine has its own registry (several engines in one process, as in tests, never
collide). Counters and histograms are updated where things happen: the scheduler (queue,
prefill and decode times, steps), each request's stream (first token, inter-token gaps,
finish), the HTTP layer (client disconnects). Gauges are read at scrape time from the
engine's ``statistics()``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import trio
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .core.speculative import SpecDecodeCounts

#: vLLM's buckets, so the same Grafana panels and quantile queries apply.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_TIME_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
STEP_TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Reading, fetching, decoding and sampling one image or video (vllm_mlx_trio/media): a small
#: data: URL takes milliseconds, a fetched video seconds, a fetch ends at mllm.fetch_timeout_s.
MEDIA_PREPROCESS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
FINISH_REASONS = ("stop", "length", "abort", "error")
#: The HTTP routes that run requests: the ``endpoint`` label of the per-request metrics. A request
#: submitted to the engine directly (benchmarks, tests) has the empty endpoint.
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses")
#: Per-request histograms, labelled by ``endpoint`` as well as ``model_name``.
REQUEST_HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    # the scheduler's phases of a request (it carries the endpoint from the HTTP route)
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
)
DISCONNECTED = "vllm:http_requests_client_disconnected"

#: Gauge name -> (help, key in the snapshot dict the engine provides).
GAUGES = {
    "vllm:num_requests_running": ("Requests in the model batch.", "num_running"),
    "vllm:num_requests_waiting": ("Requests waiting for a batch slot.", "num_waiting"),
    "vllm:kv_cache_usage_perc": ("KV cache usage of the running requests, 0..1 of the KV budget.", "kv_cache_usage"),
    "vllm_mlx_trio_prefix_cache_usage_perc": ("Prefix-cache fill, 0..1 of its budget.", "prefix_cache_usage"),
    "vllm_mlx_trio_mlx_active_memory_bytes": ("MLX active memory.", "mlx_active_bytes"),
    "vllm_mlx_trio_mlx_peak_memory_bytes": ("MLX peak memory.", "mlx_peak_bytes"),
    "vllm_mlx_trio_mlx_cache_memory_bytes": ("MLX buffer-cache memory.", "mlx_cache_bytes"),
    "vllm_mlx_trio_prefix_cache_blocks": ("Cached prefix blocks.", "prefix_blocks"),
    "vllm_mlx_trio_prefix_cache_bytes": ("Bytes of cached prefix blocks.", "prefix_bytes"),
    "vllm_mlx_trio_admission_queue_depth": ("Admissions waiting for the scheduler.", "admit_depth"),
    "vllm_mlx_trio_plans_in_flight": ("Step plans sent to the executor, not yet answered.", "plans_in_flight"),
    "vllm_mlx_trio_running_kv_tokens": (
        "KV token slots the running batch holds (rows x longest; a prefix rows share in the batch counted once).",
        "kv_tokens_held",
    ),
}


def token_buckets(max_tokens: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_tokens`` (vLLM's build_1_2_5_buckets)."""
    buckets, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_tokens:
                return tuple(buckets)
            buckets.append(value)
        exponent += 1


class _SnapshotGauges(Collector):
    """Gauges read from the engine when Prometheus scrapes."""

    def __init__(self, model_name: str, snapshot: Callable[[], dict[str, float]]):
        self._model_name = model_name
        self._snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily]:
        values = self._snapshot()
        for name, (help_text, key) in GAUGES.items():
            gauge = GaugeMetricFamily(name, help_text, labels=["model_name"])
            gauge.add_metric([self._model_name], float(values.get(key, 0.0)))
            yield gauge


class EngineMetrics:
    """One engine's metrics. Every method is cheap and never blocks."""

    def __init__(self, model_name: str, max_model_len: int):
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        tokens = token_buckets(max_model_len)
        self._counters = {
            name: Counter(name, help_text, ["model_name"], registry=self.registry).labels(model_name)
            for name, help_text in (
                ("vllm:prompt_tokens", "Prompt tokens processed."),
                ("vllm:generation_tokens", "Tokens generated."),
                ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache."),
                ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache."),
                ("vllm:num_preemptions", "Requests preempted to stay within the KV budget."),
                ("vllm_mlx_trio_steps", "Model steps run."),
                ("vllm_mlx_trio_images_processed", "Images loaded and decoded for requests."),
                ("vllm_mlx_trio_videos_processed", "Videos loaded and sampled for requests."),
            )
        }
        self._success = Counter(
            "vllm:request_success",
            "Requests finished, by reason.",
            ["model_name", "finished_reason", "endpoint"],
            registry=self.registry,
        )
        self._disconnected = Counter(
            DISCONNECTED, "HTTP requests whose client left first.", ["model_name", "endpoint"], registry=self.registry
        )
        for endpoint in ENDPOINTS:
            self._disconnected.labels(model_name, endpoint).inc(0)
        self._histograms = {
            name: Histogram(
                name,
                help_text,
                ["model_name", "endpoint"] if name in REQUEST_HISTOGRAMS else ["model_name"],
                buckets=buckets,
                registry=self.registry,
            )
            for name, help_text, buckets in (
                ("vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS),
                ("vllm:inter_token_latency_seconds", "Time between output tokens.", ITL_BUCKETS),
                ("vllm:e2e_request_latency_seconds", "Request latency, arrival to finish.", REQUEST_TIME_BUCKETS),
                ("vllm:request_queue_time_seconds", "Time waiting for a batch slot.", REQUEST_TIME_BUCKETS),
                ("vllm:request_prefill_time_seconds", "Batch entry to first token.", REQUEST_TIME_BUCKETS),
                ("vllm:request_decode_time_seconds", "First token to finish.", REQUEST_TIME_BUCKETS),
                ("vllm:request_prompt_tokens", "Prompt tokens per request.", tokens),
                ("vllm:request_generation_tokens", "Generated tokens per request.", tokens),
                ("vllm:iteration_tokens_total", "Tokens per model step.", ITERATION_TOKEN_BUCKETS),
                ("vllm_mlx_trio_step_seconds", "Time of one model step on the MLX thread.", STEP_TIME_BUCKETS),
                (
                    "vllm_mlx_trio_media_preprocess_seconds",
                    "Time to read, fetch, decode and sample one image or video, off the event loop.",
                    MEDIA_PREPROCESS_BUCKETS,
                ),
                # VLM: the vision tower's time for one prompt's images / videos
                ("vllm_mlx_trio_vision_encode_seconds", "Vision encoding of one media prompt.", STEP_TIME_BUCKETS),
            )
        }
        #: Each histogram's child per label values, looked up once (``labels()`` validates and
        #: locks at every call, and a streamed token observes at least one histogram).
        self._histogram_children: dict[tuple[str, str], Any] = {}
        self._counters["vllm:num_preemptions"].inc(0)
        self._spec_decode_metrics()

    def _spec_decode_metrics(self) -> None:
        """Speculative decoding's counters, vLLM's names; zero while speculation is off."""
        for name, help_text in (
            ("vllm:spec_decode_num_drafts", "Speculative verify rounds (one sequence each)."),
            ("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed."),
            ("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted."),
        ):
            self._counters[name] = Counter(name, help_text, ["model_name"], registry=self.registry).labels(
                self.model_name
            )
        self._accepted_per_position = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted, by position in the draft (from 0).",
            ["model_name", "position"],
            registry=self.registry,
        )
        #: The totals since start, for /v1/status's running acceptance rate.
        self.spec_decode = SpecDecodeCounts()

    def on_spec_decode(self, counts: SpecDecodeCounts) -> None:
        """What speculation did in one step (``StepResult.spec_decode``)."""
        self.spec_decode += counts
        self.count("vllm:spec_decode_num_drafts", counts.num_drafts)
        self.count("vllm:spec_decode_num_draft_tokens", counts.num_draft_tokens)
        self.count("vllm:spec_decode_num_accepted_tokens", counts.num_accepted_tokens)
        for position, accepted in enumerate(counts.accepted_per_position):
            self._accepted_per_position.labels(self.model_name, str(position)).inc(accepted)

    def read_gauges_from(self, snapshot: Callable[[], dict[str, float]]) -> None:
        """Serve the gauges from ``snapshot`` (called at each scrape), once the engine's actors
        exist to answer it."""
        self.registry.register(_SnapshotGauges(self.model_name, snapshot))

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)

    def request_timer(self, arrival_time: float, endpoint: str = "") -> RequestTimer:
        return RequestTimer(self, arrival_time, endpoint)

    def observe(self, name: str, value: float, *, endpoint: str = "") -> None:
        """One value of a histogram; ``endpoint`` only for the per-request ones (REQUEST_HISTOGRAMS)."""
        child = self._histogram_children.get((name, endpoint))
        if child is None:
            labels = (self.model_name, endpoint) if name in REQUEST_HISTOGRAMS else (self.model_name,)
            child = self._histogram_children[name, endpoint] = self._histograms[name].labels(*labels)
        child.observe(value)

    def count(self, name: str, amount: float = 1.0) -> None:
        self._counters[name].inc(amount)

    def finished(self, reason: str, *, endpoint: str = "") -> None:
        self._success.labels(self.model_name, reason, endpoint).inc()

    def client_disconnected(self, endpoint: str) -> None:
        self._disconnected.labels(self.model_name, endpoint).inc()

    def on_step(self, num_tokens: int, elapsed_s: float) -> None:
        self.count("vllm_mlx_trio_steps")
        self.observe("vllm_mlx_trio_step_seconds", elapsed_s)
        if num_tokens:
            self.observe("vllm:iteration_tokens_total", num_tokens)
            self.count("vllm:generation_tokens", num_tokens)

    def on_vision_encode(self, seconds: tuple[float, ...]) -> None:
        for value in seconds:
            self.observe("vllm_mlx_trio_vision_encode_seconds", value)

    def on_preemption(self) -> None:
        self.count("vllm:num_preemptions")

    def on_media_loaded(self, media: Iterable[Any]) -> None:
        """The images and videos one request loaded (``media.LoadedImage`` / ``LoadedVideo``):
        one count each, by kind, and each one's preprocessing seconds."""
        for item in media:
            self.count(f"vllm_mlx_trio_{item.kind}s_processed")
            self.observe("vllm_mlx_trio_media_preprocess_seconds", item.seconds)

    def on_prefix_lookup(self, num_prompt_tokens: int, num_cached_tokens: int) -> None:
        self.count("vllm:prefix_cache_queries", num_prompt_tokens)
        self.count("vllm:prefix_cache_hits", num_cached_tokens)


class RequestTimer:
    """A request's client-side clock: first token, gaps between tokens, finish."""

    __slots__ = ("_metrics", "_arrival", "_endpoint", "_last", "_done")

    def __init__(self, metrics: EngineMetrics, arrival_time: float, endpoint: str = ""):
        self._metrics = metrics
        self._arrival = arrival_time
        self._endpoint = endpoint
        self._last: float | None = None
        self._done = False

    def tokens(self, num_tokens: int) -> None:
        """Tokens reached the client: the first output gives TTFT, later ones the ITL."""
        if num_tokens <= 0:
            return
        now = trio.current_time()
        if self._last is None:
            self._metrics.observe("vllm:time_to_first_token_seconds", now - self._arrival, endpoint=self._endpoint)
        else:
            gap = (now - self._last) / num_tokens
            for _ in range(num_tokens):
                self._metrics.observe("vllm:inter_token_latency_seconds", gap, endpoint=self._endpoint)
        self._last = now

    def finish(self, reason: str, *, prompt_tokens: int, completion_tokens: int) -> None:
        """Once per request: its reason, latency and token counts."""
        if self._done:
            return
        self._done = True
        metrics, endpoint = self._metrics, self._endpoint
        metrics.finished(reason, endpoint=endpoint)
        metrics.observe("vllm:e2e_request_latency_seconds", trio.current_time() - self._arrival, endpoint=endpoint)
        metrics.observe("vllm:request_prompt_tokens", prompt_tokens, endpoint=endpoint)
        metrics.observe("vllm:request_generation_tokens", completion_tokens, endpoint=endpoint)
        metrics.count("vllm:prompt_tokens", prompt_tokens)


def engine_snapshot(scheduler: Any, cache: Any, *, kv_capacity_tokens: int) -> dict[str, float]:
    """The gauges' values from the scheduler's and the cache manager's statistics.

    ``vllm:kv_cache_usage_perc`` is what vLLM means by it: the KV the running requests hold
    over the KV they may hold. Here that is the batch's token slots (rows x longest row) over
    the KV budget, or, with no budget, over what the context length allows the batch
    (``max_num_seqs`` x ``max_context_tokens``), the ceiling it can grow to either way.
    """
    pool = cache.pool
    limit = pool.max_bytes or 0
    prefix_usage = pool.bytes_used / limit if limit else (pool.num_blocks / pool.max_blocks if pool.max_blocks else 0.0)
    kv_usage = scheduler.kv_tokens_held / kv_capacity_tokens if kv_capacity_tokens > 0 else 0.0
    return {
        "num_running": scheduler.num_running,
        "num_waiting": scheduler.num_waiting,
        "kv_cache_usage": min(kv_usage, 1.0),
        "prefix_cache_usage": min(prefix_usage, 1.0),
        "prefix_blocks": pool.num_blocks,
        "prefix_bytes": pool.bytes_used,
        "mlx_active_bytes": scheduler.mlx_active_bytes,
        "mlx_peak_bytes": scheduler.mlx_peak_bytes,
        "mlx_cache_bytes": scheduler.mlx_cache_bytes,
        "admit_depth": scheduler.admit_queue_depth,
        "plans_in_flight": scheduler.plans_in_flight,
        "kv_tokens_held": scheduler.kv_tokens_held,
    }
