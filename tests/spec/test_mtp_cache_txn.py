"""The cache transaction for hybrid (linear-attention + attention) targets: after a verify of ``[last, d1..dk]`` with
``j`` drafts accepted, the cache is exactly the cache of a plain forward of the kept tokens."""

from __future__ import annotations

import mlx.core as mx
import mlx_lm
import pytest
from mlx_lm.models.cache import ArraysCache, KVCache

from vllm_mlx_trio.worker.demo import resolve_demo_model
from vllm_mlx_trio.worker.speculative.cache_txn import needs_transaction, open_transaction

pytestmark = pytest.mark.mlx

PROMPT = [17, 230, 45, 99, 301, 12, 7, 88]
VERIFIED = [140, 51, 260, 33, 410]  # [last, d1..d4]


@pytest.fixture(scope="module")
def hybrid(demo_cache_dir):
    model, _ = mlx_lm.load(str(resolve_demo_model("demo:mtp-tiny", demo_cache_dir)))
    return model


def _prefilled(model):
    cache = model.make_cache()
    model(mx.array([PROMPT]), cache=cache)
    return cache


def _arrays(cache) -> list[mx.array]:
    """Every array a cache holds for the sequence (KV up to the offset, conv and recurrent state)."""
    out = []
    for layer_cache in cache:
        if isinstance(layer_cache, ArraysCache):
            out.extend(layer_cache.cache)
        else:
            end = layer_cache.offset
            out.extend([layer_cache.keys[..., :end, :], layer_cache.values[..., :end, :]])
    mx.eval(out)
    return out


def _assert_same(cache, expected) -> None:
    got, want = _arrays(cache), _arrays(expected)
    assert [a.shape for a in got] == [b.shape for b in want]
    for a, b in zip(got, want, strict=True):
        assert mx.array_equal(a, b).item()
    assert [c.offset for c in cache if isinstance(c, KVCache)] == [c.offset for c in expected if isinstance(c, KVCache)]


def test_the_demo_target_is_hybrid_and_needs_the_transaction(hybrid):
    cache = hybrid.make_cache()
    assert {type(c) for c in cache} == {ArraysCache, KVCache}
    assert needs_transaction(cache)
    assert not needs_transaction([KVCache(), KVCache()])


class _CountingModel:
    """The target as the transaction sees it, counting forwards; ``with_layers=False`` hides its layers (so no
    mixer can be replayed and the transaction re-forwards the model)."""

    def __init__(self, model, *, with_layers: bool):
        self._model = model
        self.forwards = 0
        if with_layers:
            self.layers = model.layers

    def __call__(self, *args, **kwargs):
        self.forwards += 1
        return self._model(*args, **kwargs)


@pytest.mark.parametrize("path", ["replay", "re-forward"])
@pytest.mark.parametrize("kept", [0, 1, 3, len(VERIFIED)])
def test_keep_equals_a_plain_forward_of_the_kept_tokens(hybrid, kept, path):
    cache = _prefilled(hybrid)
    model = _CountingModel(hybrid, with_layers=path == "replay")
    txn = open_transaction(model, cache, VERIFIED)
    model(mx.array([VERIFIED]), cache=cache)  # the verify forward writes all k + 1 tokens
    txn.keep(kept)
    replayed_forward = path == "re-forward" and 0 < kept < len(VERIFIED)
    assert model.forwards == 1 + replayed_forward  # replay runs only the linear-attention mixers again
    assert {type(layer.linear_attn).__name__ for layer in hybrid.layers if layer.is_linear} == {"GatedDeltaNet"}

    expected = _prefilled(hybrid)
    if kept:
        hybrid(mx.array([VERIFIED[:kept]]), cache=expected)
    _assert_same(cache, expected)

    # and the next step sees the same cache: identical logits for the following token
    nxt = mx.array([[5]])
    assert mx.array_equal(hybrid(nxt, cache=cache), hybrid(nxt, cache=expected)).item()


def test_trimming_alone_would_leave_the_rejected_tokens_in_the_linear_state(hybrid):
    """Why the transaction exists: trimming only the attention layers is not a rollback on this model."""
    cache = _prefilled(hybrid)
    hybrid(mx.array([VERIFIED]), cache=cache)
    for layer_cache in cache:
        if layer_cache.is_trimmable():
            layer_cache.trim(len(VERIFIED) - 1)
    expected = _prefilled(hybrid)
    hybrid(mx.array([VERIFIED[:1]]), cache=expected)
    assert not all(mx.array_equal(a, b).item() for a, b in zip(_arrays(cache), _arrays(expected), strict=True))


def test_a_transaction_settles_once(hybrid):
    cache = _prefilled(hybrid)
    txn = open_transaction(hybrid, cache, VERIFIED)
    hybrid(mx.array([VERIFIED]), cache=cache)
    with pytest.raises(ValueError):
        txn.keep(len(VERIFIED) + 1)
    txn.keep(2)
    with pytest.raises(RuntimeError):
        txn.keep(2)


# -- the load-time check: a target whose cache cannot drop rejected drafts is refused ----------------------------------


class _StatelessLayer(KVCache):
    """A non-trimmable attention cache whose ``state`` cannot be set back (as mlx-lm's deepseek_v41 ``LayerCache``)."""

    def is_trimmable(self) -> bool:
        return False

    @property
    def state(self):
        return super().state

    @state.setter
    def state(self, value):
        raise ValueError("this cache cannot be restored")


class _ForgetfulLayer(KVCache):
    """A non-trimmable attention cache whose snapshot is empty and whose restore does nothing."""

    def is_trimmable(self) -> bool:
        return False

    @property
    def state(self):
        return []

    @state.setter
    def state(self, value):
        pass

    @property
    def meta_state(self):
        return ""

    @meta_state.setter
    def meta_state(self, value):
        pass


def _with_layers(model, layer_type):
    """``model`` whose cache makes ``layer_type`` layers where it made ``KVCache`` ones."""

    class Wrapped(type(model)):
        def make_cache(self):
            return [layer_type() if type(c) is KVCache else c for c in super().make_cache()]

    model.__class__ = Wrapped
    return model


def test_the_hybrid_demo_and_a_trimmable_target_pass_the_load_check(hybrid, float32_dir):
    from vllm_mlx_trio.worker.speculative.cache_txn import rollback_problem

    assert rollback_problem(hybrid) is None  # the transaction restores GatedDeltaNet state and trims attention
    assert rollback_problem(mlx_lm.load(float32_dir)[0]) is None


@pytest.mark.parametrize(
    ("layer_type", "says"), [(_StatelessLayer, "cannot be rolled back"), (_ForgetfulLayer, "does not restore it")]
)
def test_a_cache_that_cannot_be_restored_is_named_at_load(demo_cache_dir, layer_type, says):
    from vllm_mlx_trio.worker.speculative.cache_txn import rollback_problem

    model, _ = mlx_lm.load(str(resolve_demo_model("demo:mtp-tiny", demo_cache_dir)))
    problem = rollback_problem(_with_layers(model, layer_type))
    assert problem is not None and says in problem and layer_type.__name__ in problem


def test_the_speculative_runner_refuses_such_a_target(monkeypatch, demo_cache_dir):
    from vllm_mlx_trio.errors import ModelLoadError
    from vllm_mlx_trio.worker.batched import runner as batch_runner

    from .mtp_parts import build_runner, mtp_config

    real = batch_runner.load_for_serving

    def loading(model_cfg, engine_cfg):
        model, info = real(model_cfg, engine_cfg)
        return _with_layers(model, _StatelessLayer), info

    monkeypatch.setattr(batch_runner, "load_for_serving", loading)
    with pytest.raises(ModelLoadError, match="needs to drop rejected drafts, but the model's cache"):
        build_runner(mtp_config(str(resolve_demo_model("demo:mtp-tiny", demo_cache_dir))))
