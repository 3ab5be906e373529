"""A pure-Trio stand-in for the MLX executor, for deterministic actor tests.

It speaks the executor's channel protocol (StepPlan in, StepResult out, ModelInfo on
start) with a byte-level fake tokenizer and scripted tokens. A :class:`StepGate` lets a
test release steps one at a time; ``trio.sleep(step_s)`` stands in for compute time, so
under ``autojump_clock`` a test of many steps takes no real time. ``tokens_per_step`` (an
int, or a per-step script cycled by step id) makes a step give each sequence several tokens,
as a speculative runner does; they are not cut at a stop or at ``max_tokens`` here, so the
scheduler's own termination rule is what the tests exercise.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio

from ..messages import EmbedJob, ModelInfo, NewSequence, RequestId, StepPlan, StepResult, TokenLogprob

#: The fake tokenizer's special tokens; every other id is a byte value + NUM_SPECIAL.
ENDOFTEXT, IM_START, IM_END = 0, 1, 2
NUM_SPECIAL = 3
SPECIAL_TEXT = {ENDOFTEXT: "<|endoftext|>", IM_START: "<|im_start|>", IM_END: "<|im_end|>"}

TokenScript = Callable[[NewSequence, int], int]


class FakeTokenizer:
    """Byte-level: one token per UTF-8 byte, so multi-byte characters span tokens."""

    eos_token_ids = (IM_END,)
    vocab_size = 256 + NUM_SPECIAL

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = []
        rest = text
        while rest:
            special = next((t for t, s in SPECIAL_TEXT.items() if rest.startswith(s)), None)
            if special is not None:
                ids.append(special)
                rest = rest[len(SPECIAL_TEXT[special]) :]
            else:
                ids.extend(b + NUM_SPECIAL for b in rest[0].encode())
                rest = rest[1:]
        return ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        out, raw = [], bytearray()
        for t in token_ids:
            if t < NUM_SPECIAL:
                out.append(raw.decode(errors="replace"))
                raw.clear()
                out.append("" if skip_special_tokens else SPECIAL_TEXT[t])
            else:
                raw.append(t - NUM_SPECIAL)
        out.append(raw.decode(errors="replace"))
        return "".join(out)

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False, **_):
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def letters_script(seq: NewSequence, index: int) -> int:
    """Default script: lowercase letters, shifted by the prompt so requests differ."""
    return NUM_SPECIAL + ord("a") + (sum(seq.prompt_token_ids) + index) % 26


def text_script(text: str, *, then_eos: bool = True) -> TokenScript:
    """Every request generates ``text`` (as bytes), then EOS (or repeats the text)."""
    data = FakeTokenizer().encode(text)

    def script(seq: NewSequence, index: int) -> int:
        if index < len(data):
            return data[index]
        return IM_END if then_eos else data[index % len(data)]

    return script


class StepGate:
    """Steps wait here for permission: ``allow(n)`` lets n more steps run."""

    def __init__(self) -> None:
        self._permits = trio.Semaphore(0)

    def allow(self, num_steps: int = 1) -> None:
        for _ in range(num_steps):
            self._permits.release()

    async def wait(self) -> None:
        await self._permits.acquire()


class FakeExecutor:
    """Executor actor with scripted tokens; records which sequences live and on which thread."""

    def __init__(
        self,
        plan_recv: trio.MemoryReceiveChannel[StepPlan],
        result_send: trio.MemorySendChannel[StepResult],
        *,
        script: TokenScript = letters_script,
        step_s: float = 0.01,
        gate: StepGate | None = None,
        max_context_tokens: int = 4096,
        fail_at_step: int | None = None,
        kv_budget_tokens: int | None = None,
        tokens_per_step: int | Sequence[int] = 1,
    ):
        self._plan_recv = plan_recv
        self._result_send = result_send
        self._script = script
        self._step_s = step_s
        self._gate = gate
        self._max_context_tokens = max_context_tokens
        self._fail_at_step = fail_at_step
        self._kv_budget_tokens = kv_budget_tokens
        self._tokens_per_step = (tokens_per_step,) if isinstance(tokens_per_step, int) else tuple(tokens_per_step)
        #: The most KV token slots the batch held in any step (rows x longest row).
        self.peak_kv_tokens = 0
        self.sequences: dict[RequestId, tuple[NewSequence, int]] = {}
        self.plans: list[StepPlan] = []
        self.thread_ids: set[int] = set()

    async def run(self, *, task_status: trio.TaskStatus[ModelInfo] = trio.TASK_STATUS_IGNORED) -> None:
        with self._plan_recv, self._result_send:
            tokenizer = FakeTokenizer()
            task_status.started(
                ModelInfo(
                    model_path="fake",
                    max_context_tokens=self._max_context_tokens,
                    vocab_size=tokenizer.vocab_size,
                    eos_token_ids=tokenizer.eos_token_ids,
                    tokenizer=tokenizer,
                    kv_budget_tokens=self._kv_budget_tokens,
                )
            )
            async for plan in self._plan_recv:
                if isinstance(plan, EmbedJob):
                    plan.reply.close()  # no embedding model here: its caller hears the engine stopped
                    continue
                if not isinstance(plan, StepPlan):
                    continue  # a RequestWaiting hint: no run-ahead to end here
                if self._gate is not None:
                    await self._gate.wait()
                await trio.sleep(self._step_s)
                await self._result_send.send(self._execute(plan))

    def _execute(self, plan: StepPlan) -> StepResult:
        self.thread_ids.add(threading.get_ident())
        self.plans.append(plan)
        if self._fail_at_step is not None and plan.step_id >= self._fail_at_step:
            raise RuntimeError(f"injected failure at step {plan.step_id}")
        for request_id in plan.finished_ids:
            self.sequences.pop(request_id, None)
        for seq in plan.new_seqs:  # a resumed sequence continues its script where it stopped
            self.sequences[seq.request_id] = (seq, seq.num_output_tokens)
        sampled, logprobs = [], []
        k = self._tokens_per_step[plan.step_id % len(self._tokens_per_step)]
        for request_id in (*(s.request_id for s in plan.new_seqs), *plan.decode_ids):
            seq, index = self.sequences[request_id]
            tokens = tuple(self._script(as_first_run(seq), i) for i in range(index, index + k))
            sampled.append((request_id, tokens))
            if seq.params.logprobs is not None:
                logprobs.append((request_id, tuple(fake_logprob(t, seq.params.logprobs) for t in tokens)))
            self.sequences[request_id] = (seq, index + k)
        self._record_kv()
        return StepResult(
            step_id=plan.step_id,
            sampled=tuple(sampled),
            logprobs=tuple(logprobs),
            elapsed_s=self._step_s,
        )

    def _record_kv(self) -> None:
        lengths = [len(seq.prompt_token_ids) - seq.num_output_tokens + index for seq, index in self.sequences.values()]
        if lengths:
            self.peak_kv_tokens = max(self.peak_kv_tokens, len(lengths) * max(lengths))


def as_first_run(seq: NewSequence) -> NewSequence:
    """The sequence as it first entered (a resumed one carries its output in its prompt)."""
    if not seq.num_output_tokens:
        return seq
    original = seq.prompt_token_ids[: len(seq.prompt_token_ids) - seq.num_output_tokens]
    return attrs.evolve(seq, prompt_token_ids=original, num_output_tokens=0)


class SlowLoadingExecutor(FakeExecutor):
    """A FakeExecutor whose model "loads" until ``loaded`` is set; ``loading`` is set when
    the load begins (``run`` is called)."""

    def __init__(self, *args: Any, loaded: trio.Event, loading: trio.Event | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.loaded = loaded
        self.loading = loading if loading is not None else trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[ModelInfo] = trio.TASK_STATUS_IGNORED) -> None:
        self.loading.set()
        await self.loaded.wait()
        await super().run(task_status=task_status)


def fake_logprob(token_id: int, num_top: int) -> TokenLogprob:
    """A made-up but well-formed logprob: the sampled token is the most likely one at -0.25,
    followed by the next ids at -1.25, -2.25, ..."""
    top = tuple(
        (NUM_SPECIAL + (token_id - NUM_SPECIAL + i) % 256 if token_id >= NUM_SPECIAL else token_id + i, -0.25 - i)
        for i in range(num_top)
    )
    return TokenLogprob(token_id=token_id, logprob=-0.25, top=top)
