"""The runner kinds ``engine.mode`` names, and what the engine's wiring knows of a kind before
building it. Pure: no MLX, no Trio, nothing of the worker.

The configuration checks ``engine.mode`` and ``speculative.method`` against these names;
``worker/registry.py`` maps each name to a loader of its runner class. The two are apart
because every runner module imports the configuration's types: a table of loaders beside the
names would put the configuration and the runners in one import circle.
"""

from __future__ import annotations

import attrs

#: The default: "vlm" for a model whose config.json declares a vision or audio tower, else
#: "batched" (worker/auto_runner.py decides when the model loads).
AUTO = "auto"
SIMPLE = "simple"
BATCHED = "batched"
#: One model sharded over mlx.launch's ranks, each running "batched" on its shard (docs/distributed.md).
DISTRIBUTED = "distributed"
#: A vision-language model (mlx-vlm, the vlm extra) batched with text (worker/vlm/runner.py).
VLM = "vlm"
#: "batched" plus draft -> verify rounds for a request alone in the batch; chosen by speculative.method.
SPECULATIVE = "speculative"
#: "vlm" plus the speculative kind's rounds for a request alone in the batch (worker/vlm/speculative.py);
#: chosen by speculative.method on a vision-language model.
VLM_SPECULATIVE = "vlm-speculative"
#: An embedding model: answers embedding jobs, generates no text (worker/embed/runner.py).
EMBED = "embed"
#: The kinds the engine ships, in the order errors and docs list them.
BUILTIN_KINDS = (AUTO, SIMPLE, BATCHED, DISTRIBUTED, VLM, SPECULATIVE, VLM_SPECULATIVE, EMBED)
#: The kinds ``speculative.method`` may run with: "auto" (the model's config.json picks the speculative
#: or the vlm-speculative kind), "batched" or "vlm" (replaced by the one with speculation) or those kinds.
SPECULATIVE_BASES = (AUTO, BATCHED, VLM, SPECULATIVE, VLM_SPECULATIVE)
#: The kind with speculation of each kind it replaces when ``speculative.method`` is not "off".
_WITH_SPECULATION = {BATCHED: SPECULATIVE, VLM: VLM_SPECULATIVE}
#: ``speculative.method``'s value that leaves speculative decoding off.
SPECULATION_OFF = "off"


def kind_for(mode: str, method: str) -> str:
    """The kind a configuration runs: ``engine.mode``'s, or its kind with speculation when
    ``speculative.method`` is not "off" (the configuration has checked that the two fit). "auto"
    stays "auto": the auto runner applies this to the kind the model's config.json calls for."""
    return _WITH_SPECULATION.get(mode, mode) if method != SPECULATION_OFF else mode


@attrs.frozen
class RunnerShape:
    """How the scheduler drives a runner kind under one configuration, known without loading anything."""

    #: Plans the scheduler keeps outstanding on the executor edge (1 is lock-step).
    plans_in_flight: int
    #: Most tokens one step may give one sequence (speculative steps give several): the KV lookahead counts them.
    max_tokens_per_step: int
    #: Sequences the runner holds at once.
    max_running: int
    #: Most results one plan gives: a plan that runs several decode steps hands each step's
    #: tokens over as it ends (``StepResult.plan_continues``). The result channel holds this
    #: many per outstanding plan.
    results_per_plan: int = 1
