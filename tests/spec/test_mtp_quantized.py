"""Quantized MTP heads on the quantized MTP demos (demo:mtp-tiny-q4/-q8, demo:mtp-dsv3-q4/-q8): the checkpoints'
layout, the head quantized as their config says (per-layer overrides, float norms), greedy output with speculation
on equal to off with drafts from the quantized head accepted and counted, and a head whose tensors disagree with the
config refused at load with an error naming the key."""

from __future__ import annotations

import json
import re
import shutil

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import pytest
import trio

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.cli import main
from vllm_mlx_trio.errors import ModelLoadError
from vllm_mlx_trio.worker.demo import DEMO_MARKER, resolve_demo_model
from vllm_mlx_trio.worker.demo.mtp_quant import QUANTIZED_MTP_DEMOS, QuantizedMTPDemo, write_quantized
from vllm_mlx_trio.worker.speculative.mtp.drafter import MTPDrafter
from vllm_mlx_trio.worker.speculative.mtp.head import safetensors_shapes
from vllm_mlx_trio.worker.speculative.mtp.head_deepseek import _same
from vllm_mlx_trio.worker.speculative.mtp.quantized import head_quantization

from .conftest import spec_config
from .mtp_parts import (
    alone,
    generate,
    mtp_config,
    plain_and_mtp_runners,
    plain_greedy,
    spec_counts,
    speculative_greedy,
)

pytestmark = pytest.mark.mlx

GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
PROMPT = tuple(range(40, 60))
TIMEOUT_S = 180
#: demo -> (the file holding its MTP tensors, their checkpoint prefix, its input projection: the overridden layer)
LAYOUT = {
    "mtp-tiny": ("model.safetensors", "mtp.", "fc"),
    "mtp-dsv3": ("mtp.safetensors", "model.layers.2.", "eh_proj"),
}


@pytest.fixture(scope="module", params=sorted(QUANTIZED_MTP_DEMOS))
def quantized(request, demo_cache_dir):
    """(demo name, its directory)."""
    return request.param, resolve_demo_model(f"demo:{request.param}", demo_cache_dir)


def _layout(name):
    return LAYOUT[QUANTIZED_MTP_DEMOS[name].base]


def test_the_checkpoint_stores_the_head_packed_with_its_config_and_the_target_loads_in_float(quantized):
    name, directory = quantized
    demo = QUANTIZED_MTP_DEMOS[name]
    shard, prefix, projection = _layout(name)
    config = json.loads((directory / "config.json").read_text())
    quantization = config["quantization"]
    assert (quantization["bits"], quantization["group_size"]) == (demo.bits, demo.group_size)
    assert config["quantization_config"] == quantization and prefix + projection in quantization
    header = _header(directory / shard)
    packed = {k for k, v in header.items() if v["dtype"] == "U32"}
    assert packed and all(k.startswith(prefix) and k.endswith(".weight") for k in packed)
    assert all(f"{k[: -len('weight')]}scales" in header for k in packed)
    assert any(k.endswith("norm.weight") and header[k]["dtype"] in ("F32", "BF16") for k in header)
    model, _ = mlx_lm.load(str(directory))
    assert not any(isinstance(m, nn.QuantizedLinear) for _, m in model.named_modules())


def _head_modules_of(drafter):
    """(path, module) of the drafter's head (the DeepSeek-V3 layer behind its adapter)."""
    return getattr(drafter.head, "layer", drafter.head).named_modules()


def _header(path):
    """A safetensors file's header: tensor name -> dtype, shape, offsets."""
    data = path.read_bytes()
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    return {k: v for k, v in header.items() if k != "__metadata__"}


def test_the_loaded_head_is_quantized_as_the_config_says(quantized):
    name, directory = quantized
    demo = QUANTIZED_MTP_DEMOS[name]
    _, prefix, projection = _layout(name)
    model, _ = mlx_lm.load(str(directory))
    drafter = MTPDrafter.for_target(model, directory, hidden_state_mode=None)
    head = getattr(drafter.head, "layer", drafter.head)
    layers = dict(head.named_modules())
    quantized_layers = {path: m for path, m in layers.items() if isinstance(m, nn.QuantizedLinear)}
    override = demo.overrides[projection]
    if override is False:
        assert type(layers[projection]) is nn.Linear
    else:
        assert (layers[projection].bits, layers[projection].group_size) == (override["bits"], override["group_size"])
    others = [m for path, m in quantized_layers.items() if path != projection]
    assert others and all((m.bits, m.group_size) == (demo.bits, demo.group_size) for m in others)
    assert all(m.weight.dtype != mx.uint32 for path, m in layers.items() if isinstance(m, nn.RMSNorm))
    if demo.base == "mtp-dsv3":  # the MoE experts and the checkpoint's own (quantized) embedding and head
        assert type(layers["mlp.switch_mlp.gate_proj"]).__name__ == "QuantizedSwitchLinear"
        assert isinstance(drafter._embed, nn.QuantizedEmbedding) and drafter._embed is head.embed_tokens


# -- greedy identity with the quantized head drafting -------------------------------------------------------------


@pytest.fixture(scope="module")
def runners(quantized):
    yield from plain_and_mtp_runners(str(quantized[1]))


def test_greedy_output_with_the_quantized_head_equals_speculation_off_and_drafts_are_accepted(runners):
    plain, spec = runners
    reference, _ = alone(plain, PROMPT, GREEDY)
    output, driver = alone(spec, PROMPT, GREEDY)
    assert output == reference
    proposed, accepted = spec_counts(driver)
    assert proposed > 0 and accepted > 0  # the quantized head still agrees with the target (q4 ~0.4-0.7, q8 ~0.65)
    assert any(type(m).__name__.startswith("Quantized") for _, m in _head_modules_of(spec._drafter))


async def test_through_the_engine_speculation_changes_no_token_and_reports_acceptance(demo_cache_dir):
    directory = str(resolve_demo_model("demo:mtp-tiny-q4", demo_cache_dir))
    chat = [{"role": "user", "content": "Tell me about the sea and the ships."}]
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(spec_config(directory, None)) as engine:
            reference = await generate(engine, chat, GREEDY)
        async with open_engine(mtp_config(directory)) as engine:
            got = await generate(engine, chat, GREEDY)
            counts = engine.metrics.spec_decode
            exposition = engine.metrics.render().decode()
    assert got == reference
    assert counts.num_drafts > 0 and 0 < counts.num_accepted_tokens <= counts.num_draft_tokens
    accepted = re.search(r"^vllm:spec_decode_num_accepted_tokens_total(?:\{[^}]*\})? (\S+)$", exposition, re.M)
    assert accepted is not None and float(accepted[1]) == counts.num_accepted_tokens


@pytest.mark.parametrize(("base", "mode", "bits"), [("mtp-tiny", "mxfp4", 4), ("mtp-dsv3", "mxfp8", 8)])
def test_a_head_in_a_microscaling_mode_loads_and_drafts(base, mode, bits, tmp_path):
    """MLX's other modes (uint8 scales, no biases) through the same path: the mode comes from the config."""
    demo = QuantizedMTPDemo(base, bits=bits, group_size=32, mode=mode)
    write_quantized(demo, tmp_path, name=f"{base}-{mode}", seed=0, dtype="float32")
    model, tokenizer = mlx_lm.load(str(tmp_path))
    drafter = MTPDrafter.for_target(model, tmp_path, hidden_state_mode=None)
    layers = [m for _, m in _head_modules_of(drafter) if isinstance(m, nn.QuantizedLinear)]
    assert layers and all(m.mode == mode and "biases" not in m for m in layers)
    ids = tokenizer.encode("Once upon a time")
    output, proposed, accepted = speculative_greedy(model, drafter, ids, 24, 3)
    assert output == plain_greedy(model, ids, 24) and 0 < accepted <= proposed


# -- tensors that do not fit the config ----------------------------------------------------------------------------


def _broken_copy(name, demo_cache_dir, tmp_path, *, drop=(), config_update=None):
    """A copy of ``demo:<name>`` without the tensors ``drop`` and with ``config_update`` merged into its config."""
    directory = shutil.copytree(resolve_demo_model(f"demo:{name}", demo_cache_dir), tmp_path / name)
    shard = directory / _layout(name)[0]
    tensors = mx.load(str(shard))
    mx.save_safetensors(str(shard), {k: v for k, v in tensors.items() if k not in drop})
    config = json.loads((directory / "config.json").read_text())
    for key, value in (config_update or {}).items():
        config[key] = None if value is None else {**config[key], **value}
        config = {k: v for k, v in config.items() if v is not None}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _load(directory):
    model, _ = mlx_lm.load(str(directory))
    return MTPDrafter.for_target(model, directory, hidden_state_mode=None)


BROKEN = {
    "scales of an overridden layer missing": (
        "mtp-tiny-q4",
        {"drop": ("mtp.fc.scales",)},
        r"mtp\.fc\.scales is missing: the config's quantization makes mtp\.fc 8-bit, group size 64",
    ),
    "scales of a layer missing, its weight packed": (
        "mtp-dsv3-q4",
        {"drop": ("model.layers.2.self_attn.q_a_proj.scales",)},
        r"model\.layers\.2\.self_attn\.q_a_proj\.weight is packed \(uint32\) but "
        r"model\.layers\.2\.self_attn\.q_a_proj\.scales is missing",
    ),
    "expert scales missing": (
        "mtp-dsv3-q8",
        {"drop": ("model.layers.2.mlp.switch_mlp.up_proj.scales",)},
        r"model\.layers\.2\.mlp\.switch_mlp\.up_proj\.weight is packed",
    ),
    "bits in the config not those stored": (
        "mtp-tiny-q4",
        {"config_update": {"quantization": {"bits": 8}, "quantization_config": {"bits": 8}}},
        r"mtp\.layers\.0\.\S+\.weight has shape \(\d+, \d+\), but the config's quantization \(8-bit, group size 32, "
        r"affine mode\) gives \(\d+, \d+\) \(the stored tensors fit 4-bit, group size 32\)",
    ),
    "an override keeping a stored-quantized layer in float": (
        "mtp-tiny-q8",
        {"config_update": {"quantization": {"mtp.layers.0.mlp.up_proj": False}}},
        r"mtp\.layers\.0\.mlp\.up_proj\.scales: the checkpoint stores mtp\.layers\.0\.mlp\.up_proj quantized, but the "
        r"config's quantization keeps it in float",
    ),
    "no quantization in the config": (
        "mtp-dsv3-q8",
        {"config_update": {"quantization": None, "quantization_config": None}},
        r"model\.layers\.2\.\S+\.scales: the checkpoint stores the MTP layer \S+ quantized, but config\.json records "
        r"no MLX quantization",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_head_that_does_not_fit_its_config_is_refused_naming_the_key(case, demo_cache_dir, tmp_path):
    name, change, message = BROKEN[case]
    directory = _broken_copy(name, demo_cache_dir, tmp_path, **change)
    with pytest.raises(ModelLoadError, match=message) as info:
        _load(directory)
    assert str(info.value).startswith(str(directory))


def test_safetensors_shapes_reads_the_packed_shapes(demo_cache_dir):
    directory = resolve_demo_model("demo:mtp-tiny-q4", demo_cache_dir)
    shapes = safetensors_shapes(directory / "model.safetensors")
    assert shapes["mtp.fc.weight"] == [64, 128 * 8 // 32] and shapes["mtp.fc.scales"] == [64, 128 // 64]
    assert shapes["mtp.layers.0.mlp.up_proj.weight"] == [128, 64 * 4 // 32]


# -- the quantization a config records, and shared copies of a quantized embedding -----------------------------------


def test_the_head_quantization_is_read_where_mlx_tools_write_it():
    mlx = {"group_size": 64, "bits": 4, "mtp.fc": {"bits": 8, "group_size": 32}, "mtp.norm": False}
    read = head_quantization({"quantization": mlx})
    assert read.default == {"group_size": 64, "bits": 4, "mode": "affine"} and read.source == "quantization"
    assert read.for_layer(("x", "mtp.fc")) == {"group_size": 32, "bits": 8, "mode": "affine"}
    assert read.for_layer(("mtp.norm",)) is False and read.for_layer(("mtp.layers.0.mlp.up_proj",)) is None
    nested = head_quantization({"text_config": {"quantization_config": {"group_size": 32, "bits": 8}}})
    assert nested.default["bits"] == 8 and nested.source == "quantization_config"
    mtp_only = {"quantization": mlx, "mtplx_mtp_quantization": {"group_size": 32, "bits": 6, "mode": "affine"}}
    assert head_quantization(mtp_only).default["bits"] == 6  # mlx-vlm's splitter reads it first, too
    fp8 = {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    assert head_quantization(fp8) is None and head_quantization({}) is None


def test_a_quantized_copy_of_the_embedding_is_shared_only_when_bit_equal_to_the_targets():
    target = nn.Embedding(64, 32).to_quantized(group_size=32, bits=4)
    copy = {"weight": target.weight, "scales": target.scales, "biases": target.biases}
    assert _same(copy, target)
    assert not _same({**copy, "scales": target.scales * 2}, target)
    assert not _same({"weight": mx.zeros((64, 32))}, target)  # a float copy of a quantized target
    assert not _same(copy, nn.Embedding(64, 32))  # a quantized copy of a float target
    assert not _same(copy, target.as_linear)  # a tied head


@pytest.mark.parametrize("name", ["mtp-tiny-q4", "mtp-dsv3-q8"])
def test_the_cli_builds_the_same_files_and_the_marker_names_the_quantized_demo(name, demo_cache_dir, tmp_path, capsys):
    built = resolve_demo_model(f"demo:{name}", demo_cache_dir)
    assert main(["demo", "build", str(tmp_path / "again"), "--size", name]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "again")
    for path in sorted(built.iterdir()):
        assert (tmp_path / "again" / path.name).read_bytes() == path.read_bytes(), path.name
    assert json.loads((built / DEMO_MARKER).read_text())["size"] == name
