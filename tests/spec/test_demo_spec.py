"""``demo:spec-target`` / ``demo:spec-draft``: the draft is the target's embedding, first layer and head, the target's
other layers add nothing to the residual stream, so the two agree."""

from __future__ import annotations

import pathlib

import pytest

pytestmark = pytest.mark.mlx


def weights(directory: str) -> dict:
    import mlx.core as mx

    return mx.load(str(pathlib.Path(directory) / "model.safetensors"))


def test_the_draft_is_the_targets_first_layer_and_the_rest_write_nothing(spec_pair):
    import mlx.core as mx

    from vllm_mlx_trio.worker.demo.spec import TARGET_LAYERS

    target, draft = (weights(d) for d in spec_pair)
    assert set(draft) < set(target)
    assert {name.split(".")[2] for name in draft if name.startswith("model.layers.")} == {"0"}
    assert all(mx.array_equal(draft[name], target[name]).item() for name in draft)
    for layer in range(1, TARGET_LAYERS):
        for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
            assert not mx.any(target[f"model.layers.{layer}.{name}"]).item()
        assert mx.any(target[f"model.layers.{layer}.self_attn.q_proj.weight"]).item()  # they still cost compute


def test_the_pair_agrees_on_greedy_tokens(spec_pair):
    import mlx.core as mx
    from mlx_lm import load

    (target, tokenizer), (draft, _) = (load(d)[:2] for d in spec_pair)
    tokens = tokenizer.encode("The ships came into the harbour at night")

    def greedy(model, n: int = 16) -> list[int]:
        out: list[int] = []
        for _ in range(n):
            logits = model(mx.array([tokens + out]))[:, -1, :]
            out.append(int(mx.argmax(logits, axis=-1).item()))
        return out

    assert greedy(target) == greedy(draft)
