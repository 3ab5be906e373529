"""The built-in demo model: a real Qwen3 model with random weights that mlx_lm loads."""

from __future__ import annotations

import hashlib
import json
import pathlib
import threading

import attrs
import mlx.core as mx
import mlx_lm
import pytest
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step
from mlx_lm.models import qwen3

from vllm_mlx_trio.config import DEMO_SIZES as CONFIG_DEMO_SIZES
from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.worker.demo import (
    DEMO_BUILDERS,
    DEMO_MARKER,
    DEMO_PREFIX,
    DEMO_SIZES,
    build_demo_model,
    default_demo_cache_dir,
    is_demo_path,
    resolve_demo_model,
)
from vllm_mlx_trio.worker.demo.table import _build

pytestmark = pytest.mark.mlx

REPO = pathlib.Path(__file__).resolve().parents[2]


def _digests(directory: pathlib.Path) -> dict[str, str]:
    """sha256 of every file in ``directory``, by name."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> pathlib.Path:
    """One tiny float32 build shared by the read-only tests."""
    return build_demo_model(tmp_path_factory.mktemp("demo") / "tiny", dtype="float32")


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    """(model, tokenizer) of the tiny build, loaded like any downloaded model."""
    return mlx_lm.load(str(tiny_dir))


def test_demo_paths(demo_cache_dir, tmp_path):
    assert is_demo_path("demo:tiny") and is_demo_path("demo:small")
    assert not is_demo_path("Qwen/Qwen3-0.6B") and not is_demo_path("/models/demo")
    # the prefix and a size name a build, the one the default configuration serves
    path = resolve_demo_model(f"{DEMO_PREFIX}tiny", demo_cache_dir)
    assert (path / DEMO_MARKER).is_file()
    assert resolve_demo_model(load_config(None, environ={}).model.path, demo_cache_dir) == path
    # any other path is refused before anything is built
    for other in ("Qwen/Qwen3-0.6B", "/models/demo", "tiny"):
        with pytest.raises(ValueError, match="not a demo model path"):
            resolve_demo_model(other, tmp_path)
    assert not any(tmp_path.iterdir())


def test_tiny_has_hugging_face_layout(tiny_dir):
    names = {p.name for p in tiny_dir.iterdir()}
    expected = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert expected | {"generation_config.json", DEMO_MARKER} <= names
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3"
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["tie_word_embeddings"] is True
    assert config["vocab_size"] == DEMO_SIZES["tiny"].vocab_size
    assert config["torch_dtype"] == "float32"
    for path in tiny_dir.glob("*.json"):
        assert path.read_text().endswith("}\n")


def test_tiny_loads_with_the_expected_parameter_count(tiny):
    model, tokenizer = tiny
    assert isinstance(model, qwen3.Model)
    count = sum(p.size for _, p in tree_flatten(model.parameters()))
    assert count == DEMO_SIZES["tiny"].num_parameters
    assert 80_000 <= count <= 150_000
    # The model can never sample an id the tokenizer lacks.
    assert len(tokenizer.get_vocab()) == model.args.vocab_size


def test_small_shape_is_benchmark_sized():
    spec = DEMO_SIZES["small"]
    config = {"rms_norm_eps": 1e-6, "rope_theta": 1e6, "tie_word_embeddings": True}
    args = qwen3.ModelArgs.from_dict({"model_type": "qwen3", **config, **attrs.asdict(spec)})
    count = sum(p.size for _, p in tree_flatten(qwen3.Model(args).parameters()))  # lazy: cheap
    assert count == spec.num_parameters
    assert 30_000_000 <= count <= 40_000_000


def test_eos_and_chat_template(tiny):
    _, tokenizer = tiny
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in tokenizer.eos_token_ids
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    plain = tokenizer.apply_chat_template(messages, tokenize=False)
    assert plain.endswith("hi<|im_end|>\n")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert tokenizer.decode(ids) == text
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3


@pytest.mark.parametrize("prompt", ["hi", "Tell me about the weather.", "What is 2 + 2?"])
def test_greedy_generation_runs_long_and_decodes(tiny, prompt):
    model, tokenizer = tiny
    messages = [{"role": "user", "content": prompt}]
    prompt_ids = mx.array(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    tokens = []
    for token, _ in generate_step(prompt_ids, model, max_tokens=40):
        if token in tokenizer.eos_token_ids:
            break
        tokens.append(token)
    assert len(tokens) >= 30
    assert tokenizer.decode(tokens).strip()


def test_same_seed_gives_byte_identical_files(tiny_dir, tmp_path):
    again = build_demo_model(tmp_path / "again", dtype="float32")
    assert _digests(again) == _digests(tiny_dir)
    other = _digests(build_demo_model(tmp_path / "other", seed=1, dtype="float32"))
    assert other["model.safetensors"] != _digests(tiny_dir)["model.safetensors"]
    assert other["tokenizer.json"] == _digests(tiny_dir)["tokenizer.json"]


def test_bfloat16_build_is_the_rounded_float32_build(tiny, tmp_path):
    model32, _ = tiny
    model16, _ = mlx_lm.load(str(build_demo_model(tmp_path / "bf16", dtype="bfloat16")))
    params32 = dict(tree_flatten(model32.parameters()))
    params16 = dict(tree_flatten(model16.parameters()))
    assert params16.keys() == params32.keys()
    for name, p16 in params16.items():
        assert p16.dtype == mx.bfloat16
        assert mx.array_equal(p16, params32[name].astype(mx.bfloat16)).item(), name


def test_resolve_builds_once_then_reuses(tmp_path):
    path = resolve_demo_model("demo:tiny", tmp_path)
    assert path.parent == tmp_path and path.name.startswith("tiny-seed0-")
    marker = path / DEMO_MARKER
    stamp = marker.stat().st_mtime_ns
    assert resolve_demo_model("demo:tiny", str(tmp_path)) == path
    assert marker.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left over
    mlx_lm.load(str(path))


def test_concurrent_resolvers_share_one_build(tmp_path):
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(resolve_demo_model("demo:tiny", tmp_path))) for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 3 and len(set(results)) == 1
    assert [p.name for p in tmp_path.iterdir()] == [results[0].name]
    kept = _digests(results[0])
    _build(results[0], size="tiny", seed=1, dtype="float32", replace=False)  # a late resolver
    assert _digests(results[0]) == kept


def test_the_configuration_names_every_demo_the_table_builds():
    assert tuple(DEMO_BUILDERS) == CONFIG_DEMO_SIZES


def test_unknown_size_names_the_valid_ones(tmp_path):
    with pytest.raises(ValueError, match="tiny.*small"):
        resolve_demo_model("demo:huge", tmp_path)
    with pytest.raises(ValueError, match="tiny.*small"):
        build_demo_model(tmp_path / "x", size="huge")
    with pytest.raises(ValueError, match="dtype"):
        build_demo_model(tmp_path / "x", dtype="float8")
    assert list(tmp_path.iterdir()) == []


def test_refuses_to_replace_a_foreign_directory(tmp_path):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        build_demo_model(target)
    assert (target / "notes.txt").read_text() == "keep me"
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]


def test_rebuild_replaces_a_previous_build(tiny_dir, tmp_path):
    target = build_demo_model(tmp_path / "m", seed=1, dtype="float32")
    assert build_demo_model(target, dtype="float32") == target
    assert _digests(target) == _digests(tiny_dir)
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_default_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_MLX_TRIO_CACHE_DIR", str(tmp_path / "c"))
    assert default_demo_cache_dir() == tmp_path / "c" / "demo"
    monkeypatch.setenv("VLLM_MLX_TRIO_CACHE_DIR", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert default_demo_cache_dir() == tmp_path / "x" / "vllm-mlx-trio" / "demo"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert default_demo_cache_dir() == tmp_path / "h" / ".cache" / "vllm-mlx-trio" / "demo"


def test_sampling_rarely_ends_at_once(tiny):
    model, tokenizer = tiny
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    ids = mx.array([tokenizer.apply_chat_template(messages, add_generation_prompt=True)])
    probs = mx.softmax(model(ids)[0, -1].astype(mx.float32))
    p_eos = sum(probs[i].item() for i in tokenizer.eos_token_ids)
    assert p_eos < 1e-3  # at temperature 1
    assert probs.max().item() > 0.05  # peaked like a trained model, not uniform


def test_a_build_with_an_older_chat_template_is_rebuilt(tmp_path):
    from vllm_mlx_trio.worker.demo import chat_template_hash

    path = resolve_demo_model("demo:tiny", tmp_path)
    marker = json.loads((path / DEMO_MARKER).read_text())
    assert marker["chat_template_sha256"] == chat_template_hash()
    config = path / "tokenizer_config.json"
    old = json.loads(config.read_text())
    config.write_text(json.dumps({**old, "chat_template": "{{ messages }}"}))
    (path / DEMO_MARKER).write_text(json.dumps({**marker, "chat_template_sha256": "older"}))
    assert resolve_demo_model("demo:tiny", tmp_path) == path
    assert json.loads(config.read_text())["chat_template"] == old["chat_template"]
    assert json.loads((path / DEMO_MARKER).read_text())["chat_template_sha256"] == chat_template_hash()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # the old build is gone
