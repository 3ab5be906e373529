"""Operating routes: ``GET /metrics`` (Prometheus), ``GET /v1/status`` and ``GET /version``.

Extensions, not OpenAI API. ``/metrics`` is the engine's registry in the text exposition
format (vLLM's ``vllm:*`` names); ``/v1/status`` is a JSON snapshot for people and scripts;
``/version`` names the package and the MLX versions installed (read from package metadata:
MLX itself is only imported on the executor's thread).
"""

from __future__ import annotations

import collections
import importlib
import importlib.metadata
import pathlib
import tomllib
from collections.abc import Callable

import quart
import trio
from prometheus_client import CONTENT_TYPE_LATEST

from ..actors.scheduler.stats import RequestSnapshot
from ..core.speculative import SpecDecodeCounts
from ..engine import Engine
from .cache_routes import cache_stats_body

#: ``/v1/status``'s ``tokens_per_s`` is measured over this many seconds (at most).
THROUGHPUT_WINDOW_S = 10.0
#: How often the serving loop samples the generated-token counter for that window.
THROUGHPUT_SAMPLE_S = 1.0
PACKAGE = "vllm-mlx-trio"


class ThroughputMeter:
    """Output tokens per second over the last ``window_s``, from samples of a counter.

    :meth:`run` samples the engine's cumulative ``vllm:generation_tokens`` every
    ``sample_s``; :meth:`tokens_per_s` compares the counter now with the oldest sample still
    inside the window. Until the first sample leaves the window (just after start, or when
    nothing runs :meth:`run`) the rate is over the time since the engine started.
    """

    def __init__(
        self,
        read_tokens: Callable[[], float],
        *,
        started_at: float,
        window_s: float = THROUGHPUT_WINDOW_S,
        sample_s: float = THROUGHPUT_SAMPLE_S,
    ):
        self._read_tokens = read_tokens
        self._window_s = window_s
        self._sample_s = sample_s
        self._samples: collections.deque[tuple[float, float]] = collections.deque([(started_at, 0.0)])

    @classmethod
    def for_engine(cls, engine: Engine) -> ThroughputMeter:
        metrics = engine.metrics
        labels = {"model_name": metrics.model_name}

        def read_tokens() -> float:
            return metrics.registry.get_sample_value("vllm:generation_tokens_total", labels) or 0.0

        return cls(read_tokens, started_at=engine.started_at)

    def sample(self) -> None:
        now = trio.current_time()
        self._samples.append((now, self._read_tokens()))
        while len(self._samples) > 1 and self._samples[0][0] < now - self._window_s:
            self._samples.popleft()

    def tokens_per_s(self) -> float:
        now, tokens = trio.current_time(), self._read_tokens()
        then, before = self._samples[0]
        return round((tokens - before) / (now - then), 2) if now > then else 0.0

    async def run(self) -> None:
        """Sample forever (run it in the server's nursery)."""
        while True:
            await trio.sleep(self._sample_s)
            self.sample()


def register_ops_routes(app: quart.Quart, engine: Engine, throughput: ThroughputMeter) -> None:
    if engine.cfg.metrics.enabled:

        @app.get("/metrics")
        async def metrics():
            return quart.Response(engine.metrics.render(), content_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/status")
    async def status():
        return status_body(engine, throughput)

    versions = version_body()

    @app.get("/version")
    async def version():
        return versions


def status_body(engine: Engine, throughput: ThroughputMeter) -> dict:
    """The JSON of ``GET /v1/status``; times in seconds on the server's clock."""
    cfg, stats, now = engine.cfg, engine.statistics(), trio.current_time()
    scheduler = stats.scheduler
    return {
        "uptime_s": round(now - engine.started_at, 3),
        "model": {
            "name": cfg.model_name,
            "path": cfg.model.path,
            "max_context_tokens": engine.model_info.max_context_tokens,
        },
        "mode": cfg.engine.mode,
        "runner": engine.model_info.runner_kind or cfg.engine.mode,
        "running": scheduler.num_running,
        "waiting": scheduler.num_waiting,
        "tokens_per_s": throughput.tokens_per_s(),
        "memory": {
            "mlx_active_bytes": scheduler.mlx_active_bytes,
            "mlx_peak_bytes": scheduler.mlx_peak_bytes,
            "mlx_cache_bytes": scheduler.mlx_cache_bytes,
        },
        "kv": {
            "budget_tokens": scheduler.kv_budget_tokens,
            "held_tokens": scheduler.kv_tokens_held,
            "bytes_per_token": engine.model_info.kv_bytes_per_token,
            **_shared_kv_json(scheduler, engine.model_info),
            "preemptions": scheduler.num_preemptions,
        },
        "cache": cache_stats_body(stats.cache, block_size=cfg.cache.block_size),
        "requests": [_request_json(request, now) for request in scheduler.requests],
        "speculative": _speculative_json(cfg.speculative.method, engine.metrics.spec_decode),
    }


def _shared_kv_json(scheduler, model_info) -> dict:
    """The running KV in bytes with rows sharing a cached prefix once, what that saves against a copy per row, and
    whether the model's rows share one (or why not)."""
    per_token = model_info.kv_bytes_per_token
    held, unshared = scheduler.kv_tokens_held, max(scheduler.kv_tokens_unshared, scheduler.kv_tokens_held)
    return {
        "held_bytes": held * per_token,
        "unshared_bytes": unshared * per_token,
        "shared_bytes_saved": (unshared - held) * per_token,
        "shared_prefix_in_batch": model_info.shared_prefix_in_batch or "off (this runner keeps a copy per row)",
    }


def _speculative_json(method: str, counts: SpecDecodeCounts) -> dict:
    """The method and what it achieved since start (acceptance: accepted over proposed draft tokens)."""
    rate, length = counts.acceptance_rate, counts.mean_accepted_length
    return {
        "method": method,
        "drafts": counts.num_drafts,
        "draft_tokens": counts.num_draft_tokens,
        "accepted_tokens": counts.num_accepted_tokens,
        "acceptance_rate": None if rate is None else round(rate, 4),
        "mean_accepted_length": None if length is None else round(length, 3),
    }


def _request_json(request: RequestSnapshot, now: float) -> dict:
    ttft = request.time_to_first_token
    return {
        "id": request.request_id,
        "phase": request.phase,
        "prompt_tokens": request.num_prompt_tokens,
        "output_tokens": request.num_output_tokens,
        "cached_tokens": request.num_cached_tokens,
        "age_s": round(now - request.arrival_time, 3),
        "ttft_s": None if ttft is None else round(ttft, 4),
        "preemptions": request.num_preemptions,
    }


def version_body() -> dict:
    """The package's version and the installed mlx / mlx-lm (null when not installed)."""
    package = importlib.import_module(__name__.partition(".")[0])
    version = getattr(package, "__version__", None) or _installed(PACKAGE) or _checkout_version()
    return {"version": version, "mlx": _installed("mlx"), "mlx_lm": _installed("mlx-lm")}


def _checkout_version() -> str | None:
    """The version in pyproject.toml when running from a source checkout (not installed)."""
    path = pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        project = tomllib.loads(path.read_text(encoding="utf-8")).get("project", {})
    except (OSError, ValueError):
        return None
    return project.get("version") if project.get("name") == PACKAGE else None


def _installed(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
