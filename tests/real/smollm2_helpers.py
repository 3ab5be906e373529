"""Shared helpers for the tests on the real trained demo model ``demo:smollm2``: its config, the
same model loaded in the test process as a reference (mlx-lm's own generation and a direct
forward pass), and the chat requests the tests send.

(A module of its own, not a conftest.py: test modules import it by name, as tests/agent does.)
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Sequence
from typing import Any

import attrs
import trio

from vllm_mlx_trio.config import EngineConfig, load_config
from vllm_mlx_trio.testing.harness import open_server

MODEL = "demo:smollm2"
CHAT_ROUTE = "/v1/chat/completions"
#: Every async test's limit: a reply here is at most 32 tokens (~1 s), a server starts in ~5-10 s.
TIMEOUT_S = 120
#: Replies are at most this long: the whole folder runs in a few minutes on two cores.
MAX_TOKENS = 32

FRANCE = "What is the capital of France?"
#: Questions with short greedy replies that end on EOS, clear-cut: at every step the chosen token
#: leads the runner-up by 0.08 nats or more, far above float32 rounding between batch shapes.
QUESTIONS = (FRANCE, "What is 2+2?", "Where is the Eiffel Tower?")
#: What SmolLM2-135M-Instruct answers (the first question's reply must contain it).
PARIS = "Paris"


def smollm2_config(demo_cache_dir: str, *overrides: str) -> EngineConfig:
    """The server's config for demo:smollm2 (default options otherwise), on a free port."""
    base = [
        "server.port=0",
        "server.drain_timeout_s=5",
        f"model.path={MODEL}",
        f"model.demo_cache_dir={demo_cache_dir}",
    ]
    return load_config(None, overrides=[*base, *overrides], environ={})


def chat(question: str) -> list[dict[str, str]]:
    """A one-question chat (no system turn: SmolLM2's template adds its default one)."""
    return [{"role": "user", "content": question}]


def body(messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    """A chat-completions body on demo:smollm2: greedy and MAX_TOKENS unless ``fields`` say otherwise."""
    return {"model": MODEL, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, **fields}


async def post_chat(http: Any, url: str, messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    """POST a chat completion (``httpx.AsyncClient``); it must answer 200: its JSON."""
    resp = await http.post(f"{url}{CHAT_ROUTE}", json=body(messages, **fields))
    assert resp.status_code == 200, resp.text
    return resp.json()


#: The fields that make a reply spell its tokens' ids in ``logprobs`` (vLLM's extension).
WITH_TOKEN_IDS = {"logprobs": True, "return_tokens_as_token_ids": True}


def token_id(spelled: str) -> int:
    """``"token_id:504"`` -> 504 (``return_tokens_as_token_ids``)."""
    prefix, _, number = spelled.partition(":")
    assert prefix == "token_id", spelled
    return int(number)


def reply_token_ids(choice: dict[str, Any]) -> list[int]:
    """The token ids of a choice asked with :data:`WITH_TOKEN_IDS`."""
    return [token_id(entry["token"]) for entry in choice["logprobs"]["content"]]


def assert_reply_is(choice: dict[str, Any], expected: Greedy, eos_token_ids: set[int]) -> None:
    """A choice asked with :data:`WITH_TOKEN_IDS` is the reference's reply: its tokens (plus the
    EOS it stopped on, which logprobs list), its text and its finish reason."""
    ids = reply_token_ids(choice)
    if expected.finish_reason == "stop":
        assert ids and ids[-1] in eos_token_ids, ids
        ids = ids[:-1]
    assert ids == list(expected.token_ids)
    assert choice["message"]["content"] == expected.text
    assert choice["finish_reason"] == expected.finish_reason


@attrs.frozen
class Greedy:
    """mlx-lm's greedy generation: the token ids (no EOS), the text, and why it ended."""

    token_ids: tuple[int, ...]
    text: str
    finish_reason: str


class Reference:
    """demo:smollm2 loaded in the test process exactly as the server loads it
    (``load_model(cfg.model)``, the same gguf_dtype), to compare the server's replies with."""

    def __init__(self, cfg: EngineConfig):
        from vllm_mlx_trio.worker.loading import load_model  # imports mlx

        self.model, self.tokenizer, _config = load_model(cfg.model)
        self._greedy: dict[tuple[str, int], Greedy] = {}

    @property
    def eos_token_ids(self) -> set[int]:
        return set(self.tokenizer.eos_token_ids)

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """The prompt the server builds: the chat template's text, tokenized without specials."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def greedy(self, messages: list[dict[str, Any]], max_tokens: int = MAX_TOKENS) -> Greedy:
        """``mlx_lm.stream_generate`` (what ``mlx_lm.generate`` runs) at temperature 0 on the
        chat's prompt; remembered, the model being deterministic."""
        import mlx_lm

        key = (json.dumps(messages), max_tokens)
        if key not in self._greedy:
            ids, text, finish = [], [], None
            for response in mlx_lm.stream_generate(
                self.model, self.tokenizer, self.prompt_ids(messages), max_tokens=max_tokens
            ):
                text.append(response.text)
                finish = response.finish_reason
                if finish != "stop":  # the last response of a stopped reply carries the EOS
                    ids.append(response.token)
            self._greedy[key] = Greedy(tuple(ids), "".join(text), finish)
        return self._greedy[key]

    def logprobs(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> Any:
        """Log-softmax of the model's logits for each output token's position, from one forward
        pass over prompt + output (no KV cache): an ``(len(output_ids), vocab)`` float32 array."""
        import mlx.core as mx

        tokens = mx.array([*prompt_ids, *output_ids][:-1])[None]
        logits = self.model(tokens)[0, len(prompt_ids) - 1 :].astype(mx.float32)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        mx.eval(logprobs)
        return logprobs


class ThreadServer:
    """The real server (``open_server``) in a Trio loop of its own on a background thread, so
    that one server (one model load) serves every test of the folder; each test talks to it
    over HTTP from its own Trio loop.

    pytest-trio's async fixtures are function-scoped only, hence the thread.
    """

    def __init__(self, cfg: EngineConfig):
        self._cfg = cfg
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="smollm2-server", daemon=True)
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None
        self.url: str | None = None

    def start(self, timeout_s: float) -> str:
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError(f"the demo:smollm2 server did not start within {timeout_s} s")
        if self._error is not None:
            raise RuntimeError("the demo:smollm2 server failed to start") from self._error
        assert self.url is not None
        return self.url

    def stop(self, timeout_s: float) -> None:
        """Drain and stop the server (again: nothing more)."""
        if not self._thread.is_alive():
            return
        if self._token is not None and self._stop is not None:
            with contextlib.suppress(trio.RunFinishedError):  # it ended by itself meanwhile
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), f"the demo:smollm2 server did not stop within {timeout_s} s"
        if self._error is not None:
            raise RuntimeError("the demo:smollm2 server failed") from self._error

    def _run(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # handed to the test session's thread: start() or stop() raises it
            self._error = exc
        finally:
            self._ready.set()
            from vllm_mlx_trio.worker.thread_streams import leave_mlx_thread

            leave_mlx_thread()  # this thread's MLX streams, if any: none may outlive it

    async def _serve(self) -> None:
        async with open_server(self._cfg) as srv:
            self.url = srv.url
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            self._ready.set()
            await self._stop.wait()


#: Prometheus counters of the server's work (GET /metrics).
GENERATED = "vllm:generation_tokens_total"
STEPS = "vllm_mlx_trio_steps_total"


async def counters(http: Any, url: str) -> dict[str, float]:
    """The server's generated-token and model-step counters now."""
    resp = await http.get(f"{url}/metrics")
    assert resp.status_code == 200, resp.text
    found = {}
    for line in resp.text.splitlines():
        name, _, value = line.partition("{")
        if name in (GENERATED, STEPS):
            found[name] = float(value.rpartition(" ")[2])
    assert set(found) == {GENERATED, STEPS}, found
    return found
