"""A runner kind in pure Python (no MLX), for the real ExecutorActor and its thread bridge.

:class:`FakeRunner` is :class:`~vllm_mlx_trio.worker.runner_base.RunnerBase` with scripted
tokens instead of a model: it is the worked example of a runner kind (docs/architecture.md)
and what the runner contract tests drive. A step gives each sequence 1..4 tokens
(``tokens_per_step``, a per-step script, cycled), like a speculative runner; a plan may run
several steps (``steps_per_plan``), handing each earlier one over as it ends, like the batched
runner's run-ahead; failures and a blocking step can be injected. Everything runs on the
executor's thread, so the tests use ``threading.Event``s to meet it, never sleeps.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..messages import ModelInfo, NewSequence, StepPlan, StepResult, TokenLogprob
from ..worker.batched.run_ahead import joined
from ..worker.runner_base import Advance, Emission, LiveSequence, RunnerBase
from .fake_executor import FakeTokenizer, TokenScript, as_first_run, fake_logprob, letters_script

#: (sequence, step index) -> the failure message for that request at that step, or None.
FailureScript = Callable[[NewSequence, int], str | None]

#: The most tokens a FakeRunner step gives one sequence (a speculative runner's draft length).
MAX_FAKE_TOKENS_PER_STEP = 4


class FakeRunner(RunnerBase):
    """Scripted tokens through the shared runner bookkeeping; records what it was asked.

    Keyword options default to the class attributes, so a registered kind (which is built
    from the engine config alone) is a subclass that sets them.
    """

    plans_in_flight = 2
    max_tokens_per_step = MAX_FAKE_TOKENS_PER_STEP
    #: Defaults of the keyword options below.
    script: TokenScript = staticmethod(letters_script)
    tokens_per_step: Sequence[int] = (1,)
    #: Steps one plan runs while some sequence is left (each but the last handed over as it ends).
    steps_per_plan = 1
    max_context_tokens = 4096

    @classmethod
    def results_per_plan(cls, engine: Any) -> int:
        return cls.steps_per_plan

    def __init__(
        self,
        cfg: Any = None,
        *,
        script: TokenScript | None = None,
        tokens_per_step: Sequence[int] | None = None,
        fail_request: FailureScript | None = None,
        raise_at_step: int | None = None,
        block_at_step: int | None = None,
        request_waiting: threading.Event | None = None,
    ):
        super().__init__(cfg, request_waiting=request_waiting)
        self._script = script or type(self).script
        self._tokens_per_step = tuple(tokens_per_step or type(self).tokens_per_step)
        assert all(1 <= k <= self.max_tokens_per_step for k in self._tokens_per_step)
        self._fail_request = fail_request
        self._raise_at_step = raise_at_step
        self._block_at_step = block_at_step
        #: Set by the step that blocks (``block_at_step``); set ``release`` to let it go on.
        self.blocked = threading.Event()
        self.release = threading.Event()
        #: Set once :meth:`close` ran; ``thread_ids``: the threads that loaded, stepped, closed.
        self.closed = threading.Event()
        self.thread_ids: set[int] = set()
        self.plans: list[StepPlan] = []
        self._num_steps = 0
        self._step_index = 0  # the step being run (execute sets it for _advance)

    @property
    def live_ids(self) -> set[str]:
        return set(self._live)

    def _load(self) -> ModelInfo:
        self.thread_ids.add(threading.get_ident())
        tokenizer = FakeTokenizer()
        return ModelInfo(
            model_path="fake-runner",
            max_context_tokens=self.max_context_tokens,
            vocab_size=tokenizer.vocab_size,
            eos_token_ids=tokenizer.eos_token_ids,
            tokenizer=tokenizer,
        )

    def execute(self, plan: StepPlan) -> StepResult:
        self.thread_ids.add(threading.get_ident())
        self.plans.append(plan)
        step_index, self._num_steps = self._num_steps, self._num_steps + 1
        if step_index == self._raise_at_step:
            raise RuntimeError(f"injected failure at step {step_index}")
        if step_index == self._block_at_step:
            self.blocked.set()
            self.release.wait()
        self._step_index = step_index
        return super().execute(plan)

    def _insert(self, live: list[LiveSequence]) -> None:
        for sequence in live:  # a resumed sequence continues its script where it stopped
            sequence.handle = as_first_run(sequence.seq)

    def _advance(self, live: list[LiveSequence]) -> Advance:
        """``steps_per_plan`` steps of the sequences still live, each earlier one handed over as
        it ends (one step when nobody takes them early: no executor)."""
        advance = self._one_step(live)
        for _ in range(self.steps_per_plan - 1 if self.publish is not None else 0):
            advance = self._publish(advance)
            live = [sequence for sequence in live if sequence.request_id in self._live]
            if not live:
                break
            advance = joined(advance, self._one_step(live))
        return advance

    def _one_step(self, live: list[LiveSequence]) -> Advance:
        k = self._tokens_per_step[self._step_index % len(self._tokens_per_step)]
        emissions = []
        for sequence in live:
            if self._fail_request is not None:
                message = self._fail_request(sequence.seq, self._step_index)
                if message is not None:
                    self.failures[sequence.request_id] = message
            start = sequence.num_output_tokens
            tokens = tuple(self._script(sequence.handle, index) for index in range(start, start + k))
            emissions.append(Emission(sequence.request_id, tokens, tokens))
        return Advance(emissions)

    def _remove(self, live: list[LiveSequence]) -> None:
        """Nothing to free: a fake sequence is only its bookkeeping."""

    def _logprobs(self, rows: Sequence[Any], tokens: Sequence[int], num_tops: Sequence[int]) -> list[TokenLogprob]:
        return [fake_logprob(token, num_top) for token, num_top in zip(tokens, num_tops, strict=True)]

    def close(self) -> None:
        self.thread_ids.add(threading.get_ident())
        super().close()
        self.closed.set()


class BlockingRunner(FakeRunner):
    """A kind whose first step waits until the test releases it (``release``); every one made
    is in ``instances`` (the ``blocking_kind`` fixture registers it and clears that)."""

    instances: list[FakeRunner] = []

    def __init__(self, cfg, *, request_waiting=None):
        super().__init__(cfg, block_at_step=0, request_waiting=request_waiting)
        BlockingRunner.instances.append(self)
