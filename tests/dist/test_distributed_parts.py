"""The distributed runner's parts that need no second rank: the plan as the other ranks get it
(plain data; a sequence that cannot be sent fails alone), the combinations refused at load, the
shape of the launch, the collective watchdog (with its exit replaced)."""

from __future__ import annotations

import json
import pickle
import threading
import time

import attrs
import pytest

from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.core.constraint import ConstraintSpec
from vllm_mlx_trio.core.params import SamplingParams
from vllm_mlx_trio.errors import ConfigError, ModelLoadError
from vllm_mlx_trio.messages import NewSequence, RequestId, StepPlan
from vllm_mlx_trio.worker import distributed_runner


class _Matcher:
    """Stands for llguidance's LLMatcher: an object pickle refuses."""

    def __reduce__(self):
        raise TypeError("cannot pickle 'builtins.LLMatcher' object")


@attrs.frozen
class _Grammar:
    spec: ConstraintSpec
    matcher: _Matcher = attrs.field(factory=_Matcher)

    def new_matcher(self):
        return self.matcher


def _seq(name: str, **params) -> NewSequence:
    return NewSequence(request_id=RequestId(name), prompt_token_ids=(1, 2), params=SamplingParams(**params))


def test_the_followers_plan_carries_the_constraint_spec_not_the_compiled_grammar():
    spec = ConstraintSpec(kind="json_object", body="")
    plan = StepPlan(step_id=3, new_seqs=(_seq("a", constraint=spec, grammar=_Grammar(spec)), _seq("b", seed=7)))
    with pytest.raises(TypeError, match="LLMatcher"):
        pickle.dumps(plan)  # what ended a sharded server before
    kept, message, refused = distributed_runner.encode_plan(plan)
    sent = pickle.loads(message)
    assert kept is plan and refused == ()
    assert sent.new_seqs[0].params.constraint == spec and sent.new_seqs[0].params.grammar is None
    assert sent.new_seqs[1] == plan.new_seqs[1] and sent.step_id == 3
    plain = StepPlan(step_id=4, new_seqs=(_seq("c"),))
    assert distributed_runner.plain_plan(plain) is plain


def test_a_sequence_that_cannot_be_sent_fails_alone_and_the_step_goes_on():
    bad = attrs.evolve(_seq("bad"), media=(_Matcher(),))
    plan = StepPlan(step_id=5, new_seqs=(_seq("good"), bad), decode_ids=(RequestId("d"),))
    kept, message, refused = distributed_runner.encode_plan(plan)
    assert [seq.request_id for seq in kept.new_seqs] == ["good"] and kept.decode_ids == ("d",)
    assert pickle.loads(message) == kept
    ((rid, why),) = refused
    assert rid == "bad" and "cannot be sent to the other ranks" in why and "LLMatcher" in why


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["cache.disk_dir=/tmp/tier"], r"cache.disk_dir \(the disk tier\) cannot be used with a sharded model"),
        (["speculative.method=mtp"], r'speculative.method = "mtp" cannot run on a sharded model'),
        (
            ["speculative.method=draft", "speculative.draft_model=demo:tiny"],
            r'speculative.method = "draft" cannot run on a sharded model',
        ),
    ],
)
def test_combinations_a_sharded_model_refuses_at_config_load(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides=["engine.mode=distributed", *overrides], environ={})


def test_a_vision_language_checkpoint_is_refused_before_sharding(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_vl", "vision_config": {}}))
    cfg = load_config(None, overrides=["engine.mode=distributed", f"model.path={tmp_path}"], environ={})
    with pytest.raises(ModelLoadError, match='vision-language model: engine.mode = "distributed" shards text'):
        distributed_runner.refuse_vision_models(cfg.model)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    distributed_runner.refuse_vision_models(cfg.model)  # a text model loads


class _Group:
    def __init__(self, size):
        self._size = size

    def size(self):
        return self._size


def test_tensor_times_pipeline_must_match_the_ranks(monkeypatch):
    monkeypatch.setattr(distributed_runner.mx.distributed, "init", lambda strict, backend: _Group(4))
    cfg = load_config(None, overrides=["engine.mode=distributed", "distributed.tensor=3"])
    with pytest.raises(ConfigError, match=r"tensor \(3\) x distributed.pipeline \(1\)"):
        distributed_runner.init_group(cfg)
    ok = load_config(None, overrides=["engine.mode=distributed", "distributed.tensor=2", "distributed.pipeline=2"])
    assert distributed_runner.init_group(ok).size() == 4


def _watchdog(timeout_s: float) -> tuple[distributed_runner.CollectiveWatchdog, list[str], threading.Event]:
    """A watchdog that records the expired section instead of exiting the process."""
    expired: list[str] = []
    fired = threading.Event()

    def on_expire(what: str) -> None:
        expired.append(what)
        fired.set()

    return distributed_runner.CollectiveWatchdog(timeout_s, rank=0, on_expire=on_expire), expired, fired


def test_the_collective_watchdog_fires_at_the_deadline_not_at_a_polling_tick():
    watchdog, expired, fired = _watchdog(0.02)
    started = time.monotonic()
    with watchdog.guard("step 7"):
        assert fired.wait(timeout=10)
    waited = time.monotonic() - started
    assert expired == ["step 7"]
    assert waited < 0.4, waited  # woken by its deadline, not by a sleep loop's next look
    watchdog.close()


def test_a_section_that_ends_in_time_wakes_the_watchdog_and_is_not_fired():
    watchdog, expired, fired = _watchdog(0.2)
    for step in range(20):
        with watchdog.guard(f"step {step}"):
            pass
    watchdog.close()
    watchdog._thread.join(timeout=10)
    assert not watchdog._thread.is_alive()  # closing ends its wait at once
    assert expired == [] and not fired.is_set()
