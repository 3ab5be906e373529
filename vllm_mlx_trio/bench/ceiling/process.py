"""mlx-lm's own loops (the ceiling) in a child process, driven from the benchmark.

The child is ``python -m vllm_mlx_trio.worker.ceiling``: it loads the model on its own main
thread and answers one JSON command per line (see ``worker/ceiling.py``). The benchmark's
process imports no MLX for the ceiling, and its only MLX thread stays the engine's executor.
Calls block; from Trio, run them with ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
from typing import Any

import attrs

from ...config import EngineConfig, config_to_dict
from ..http import BenchError
from ..machine import machine_info
from ..peers import OUR_PYTHON
from .sse_sink import SseSink

#: Seconds the child gets to exit once its stdin is closed, before it is killed.
EXIT_TIMEOUT_S = 30.0


@attrs.frozen(kw_only=True)
class CeilingRun:
    """One greedy generation: its tokens and timings (seconds, ``time.perf_counter``)."""

    token_ids: tuple[int, ...]
    num_prompt_tokens: int
    ttft_s: float
    total_s: float
    #: When the request started (for a batch: when it was inserted).
    start: float = 0.0
    #: When each token became available, one entry per token.
    token_times: tuple[float, ...] = ()

    @classmethod
    def from_reply(cls, run: dict) -> CeilingRun:
        return cls(**{**run, "token_ids": tuple(run["token_ids"]), "token_times": tuple(run["token_times"])})


class CeilingProcess:
    """The ceiling's model, loaded in a child process; close it (or use ``with``) to free it.

    ``machine`` is the child's machine info: the device and BLAS of the process that ran MLX.
    """

    def __init__(self, cfg: EngineConfig):
        self._child = subprocess.Popen(
            [*OUR_PYTHON, "-m", "vllm_mlx_trio.worker.ceiling"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=_child_environ(),
        )
        try:
            loaded = self._call("load", config=config_to_dict(cfg))
            self.machine: dict = machine_info(server_pid=self._child.pid, device=loaded["device"])
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int:
        """The child's process id (``bench latency`` reads its CPU time)."""
        return self._child.pid

    def encode(self, messages: list[dict]) -> list[int]:
        return self._call("encode", messages=messages)

    def single(self, prompts: list[list[dict]], *, num_tokens: int) -> list[CeilingRun]:
        """One request at a time with ``generate_step``, after one short warm-up request."""
        return [CeilingRun.from_reply(r) for r in self._call("single", prompts=prompts, num_tokens=num_tokens)]

    def single_streamed(self, prompts: list[list[dict]], *, num_tokens: int) -> list[CeilingRun]:
        """As :meth:`single`, every token also sent as its own SSE event to a reader in this
        process (:class:`SseSink`), which parses each event as a streaming client does."""
        with SseSink(len(prompts)) as sink:
            replies = self._call("single_streamed", prompts=prompts, num_tokens=num_tokens, port=sink.port)
        runs = [CeilingRun.from_reply(r) for r in replies]
        if sink.error is not None or sink.events != [len(run.token_ids) for run in runs]:
            raise BenchError(f"the streamed ceiling's reader got {sink.events} events ({sink.error or 'no error'})")
        return runs

    def batch(self, prompts: list[list[dict]], *, num_tokens: int, warmup: bool = True) -> list[CeilingRun]:
        """All prompts inserted at once into one ``BatchGenerator``, after a short warm-up batch."""
        runs = self._call("batch", prompts=prompts, num_tokens=num_tokens, warmup=warmup)
        return [CeilingRun.from_reply(r) for r in runs]

    def first_token_seconds(self, prompt_ids: list[int]) -> float:
        """Seconds from the call to ``generate_step``'s first token (prefill + one sample)."""
        return self._call("first_token_seconds", prompt_ids=prompt_ids)

    def _call(self, op: str, **arguments: Any) -> Any:
        try:
            self._child.stdin.write(json.dumps({"op": op, **arguments}) + "\n")
            self._child.stdin.flush()
            line = self._child.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            raise BenchError(f"the ceiling process exited (status {self._child.wait()}); see its stderr above")
        reply = json.loads(line)
        if "error" in reply:
            raise BenchError(f"the ceiling process failed on {op!r}: {reply['error']}")
        return reply["result"]

    def close(self) -> None:
        """End the child (closing its stdin ends its loop); the model's memory goes with it."""
        if self._child.stdin and not self._child.stdin.closed:
            self._child.stdin.close()
        try:
            self._child.wait(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.wait()
        if self._child.stdout:
            self._child.stdout.close()

    def __enter__(self) -> CeilingProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _child_environ() -> dict[str, str]:
    """This environment, with this package's directory first on the path: the child runs the
    same code as the benchmark (a source checkout, not another installed copy)."""
    package_root = str(pathlib.Path(__file__).resolve().parents[3])
    path = [package_root, *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
