"""The built-in demo model: a real Qwen3-architecture model with random weights.

``build_demo_model`` writes a directory in Hugging Face layout (``config.json``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``, ...) that
``mlx_lm.load`` reads exactly like a downloaded checkpoint.  The tokenizer is a
byte-level BPE trained on the bundled ``data/corpus.txt``; the weights are
drawn from ``numpy.random.default_rng(seed)``.  The same size, seed and dtype
always give byte-identical files.

Paths such as ``"demo:tiny"`` name a demo model; ``resolve_demo_model`` builds
it once into a cache directory and reuses it afterwards.

The default stored dtype is bfloat16: on MLX 0.32's Linux CPU wheel float32
matmuls go to a bundled reference BLAS (~1.3 GFLOP/s), so for ``small``
bfloat16 prefills ~2.3x and batch-decodes ~2x faster; float32 only wins a
single decode stream, by ~15%.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import tempfile
import uuid
from typing import Any

import attrs
import numpy as np

from .files import (
    DTYPES,
    ENDOFTEXT,
    IM_END,
    SPECIAL_TOKENS,
    damped_ids,
    train_tokenizer,
    write_json,
    write_safetensors,
)

DEMO_PREFIX = "demo:"
#: Bump when the corpus, the tokenizer recipe or the weight recipe changes, so
#: that cached builds of an older format are not reused.
DEMO_FORMAT_VERSION = 1
#: Written last into a build; its presence marks the build as complete.
DEMO_MARKER = "demo_model.json"
DEFAULT_DTYPE = "bfloat16"
#: The demo vision-language model's size name (built by worker/demo/vlm.py).
VLM_SIZE = "vlm-tiny"
EMBED = "model.embed_tokens.weight"

#: Standard deviation of the random embedding; the other matrices use
#: 1/sqrt(fan_in) so that the layers, not the tied embedding's self-similarity
#: (which makes greedy decoding repeat its input token), drive the output.
EMBED_STD = 0.02
#: Standard deviation of the logits, set through the final norm's weight: it
#: leaves greedy decoding alone but makes temperature-1 sampling about as
#: peaked as a trained model's, with the damped tokens (logit ~0) rarely drawn.
LOGIT_STD = 3.0
#: Scale of the embedding (= tied lm-head) rows of special tokens (and of
#: unprintable byte tokens), so that greedy decoding does not emit
#: ``<|im_end|>`` straight away.
SPECIAL_ROW_SCALE = 0.01
RMS_NORM_EPS = 1e-6
ROPE_THETA = 1_000_000.0

#: ChatML, with Qwen 2.5/3-style tool calling: the tools are listed in the system turn, an
#: assistant's calls are ``<tool_call>`` blocks (JSON with "name" and "arguments", what the
#: ``hermes`` tool parser reads), and tool results go back in a user turn as
#: ``<tool_response>`` blocks. Without tools it renders exactly the plain ChatML it always did.
CHAT_TEMPLATE = (
    "{%- macro text(content) %}"
    "{%- if content is string %}{{- content }}"
    "{%- elif content %}{%- for part in content %}"
    "{%- if part['type'] == 'text' %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{%- endmacro %}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- text(messages[0]['content']) + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'"
    " + 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments'"
    " + ' within <tool_call></tool_call> XML tags:\\n<tool_call>\\n'"
    ' + \'{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'tool' %}"
    "{%- if loop.first or loop.previtem['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + text(message['content']) + '\\n</tool_response>' }}"
    "{%- if loop.last or loop.nextitem['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif not (tools and loop.first and message['role'] == 'system') %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + text(message['content']) }}"
    "{%- for call in message['tool_calls'] or [] %}"
    "{%- set call = call['function'] if call['function'] is defined else call %}"
    "{%- if loop.first and message['content'] or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' }}"
    "{%- if call['arguments'] is string %}{{- call['arguments'] }}"
    "{%- else %}{{- call['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@attrs.frozen
class DemoSize:
    """The shape of one demo model preset."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int

    @property
    def num_parameters(self) -> int:
        """Total parameter count (tied embeddings counted once)."""
        h, d = self.hidden_size, self.head_dim
        attn = h * d * (2 * self.num_attention_heads + 2 * self.num_key_value_heads)
        layer = attn + 3 * h * self.intermediate_size + 2 * h + 2 * d
        return self.vocab_size * h + self.num_hidden_layers * layer + h


#: ``tiny`` (~107k parameters) is for tests, ``small`` (~34M) for benchmarks.
DEMO_SIZES: dict[str, DemoSize] = {
    "tiny": DemoSize(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        max_position_embeddings=2048,
    ),
    "small": DemoSize(
        vocab_size=4096,
        hidden_size=512,
        num_hidden_layers=10,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        intermediate_size=1536,
        max_position_embeddings=4096,
    ),
}


def is_demo_path(path: str) -> bool:
    """Whether ``path`` names a built-in demo model (``"demo:<size>"``)."""
    return isinstance(path, str) and path.startswith(DEMO_PREFIX)


def default_demo_cache_dir() -> pathlib.Path:
    """Where ``resolve_demo_model`` keeps its builds.

    ``$VLLM_MLX_TRIO_CACHE_DIR/demo``, else ``$XDG_CACHE_HOME/vllm-mlx-trio/demo``,
    else ``~/.cache/vllm-mlx-trio/demo``.  Empty variables count as unset.
    """
    if base := os.environ.get("VLLM_MLX_TRIO_CACHE_DIR"):
        return pathlib.Path(base).expanduser() / "demo"
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return pathlib.Path(xdg).expanduser() / "vllm-mlx-trio" / "demo"
    return pathlib.Path.home() / ".cache" / "vllm-mlx-trio" / "demo"


def resolve_demo_model(path: str, cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """Return the directory of the demo model ``path`` (``"demo:<size>"``).

    The model is built (seed 0, default dtype) into
    ``<cache_dir>/<size>-seed0-v<DEMO_FORMAT_VERSION>`` on first use; later
    calls find the completion marker and return the existing build, unless it
    records another chat template (:func:`chat_template_hash`): then it is
    rebuilt, so caches built before a template change get the new one.
    Raises ``ValueError`` for a path that is not a demo path or an unknown size.
    """
    if not is_demo_path(path):
        raise ValueError(f"not a demo model path: {path!r} (expected {DEMO_PREFIX}<size>)")
    size = path[len(DEMO_PREFIX) :]
    root = pathlib.Path(cache_dir) if cache_dir is not None else default_demo_cache_dir()
    if size == VLM_SIZE:  # the demo vision-language model (worker/demo/vlm.py)
        from .vlm import resolve_demo_vlm

        return resolve_demo_vlm(root)
    if _own_module_writer(size) is None:
        _lookup_size(size)
    target = root / f"{size}-seed0-v{DEMO_FORMAT_VERSION}"
    if (target / DEMO_MARKER).is_file():
        if _built_template_hash(target) == chat_template_hash():
            return target
        # Built with an older chat template (e.g. before tool calling): rebuilt and swapped in.
        return _build(target, size=size, seed=0, dtype=_default_dtype(size), replace=True)
    return _build(target, size=size, seed=0, dtype=_default_dtype(size), replace=False)


def chat_template_hash() -> str:
    """The hash of :data:`CHAT_TEMPLATE` a build records, so a build with another is rebuilt."""
    return hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest()


def _built_template_hash(directory: pathlib.Path) -> str | None:
    try:
        marker = json.loads((directory / DEMO_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marker.get("chat_template_sha256") if isinstance(marker, dict) else None


def build_demo_model(
    out_dir: str | os.PathLike, *, size: str = "tiny", seed: int = 0, dtype: str | None = None
) -> pathlib.Path:
    """Build the demo model ``size`` into ``out_dir`` and return its path.

    The files are written into a temporary sibling directory that is renamed
    onto ``out_dir`` at the end, so ``out_dir`` never holds a partial build.
    An existing empty ``out_dir`` or a previous complete demo build is
    replaced; any other non-empty directory raises ``FileExistsError``.
    """
    if size == VLM_SIZE:
        from .vlm import build_demo_vlm

        return build_demo_vlm(out_dir, seed=seed, dtype=dtype or DEFAULT_DTYPE)
    return _build(out_dir, size=size, seed=seed, dtype=dtype or _default_dtype(size), replace=True)


def _build(out_dir: str | os.PathLike, *, size: str, seed: int, dtype: str, replace: bool) -> pathlib.Path:
    """Build into a temporary sibling of ``out_dir``, then install it there.

    With ``replace=False`` a complete build already at ``out_dir`` (say, from
    a concurrent resolver) is kept and the new one discarded.
    """
    own_writer = _own_module_writer(size)
    spec = None if own_writer else _lookup_size(size)
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid dtypes: {', '.join(DTYPES)}")
    out = pathlib.Path(out_dir).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        tmp.chmod(0o755)
        if own_writer:
            own_writer(tmp, seed=seed, dtype=dtype)
        else:
            _write_model_files(tmp, spec, size=size, seed=seed, dtype=dtype)
        _install(tmp, out, replace=replace)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _own_module_writer(size: str):
    """The file writer of a demo model that lives in its own module, or None for the presets here."""
    if size == "mtp-tiny":  # a hybrid target carrying an MTP head (worker/demo/mtp.py)
        from .mtp import write_mtp_tiny

        return write_mtp_tiny
    if size == "mtp-dsv3":  # a DeepSeek-V3 target carrying its MTP layer (worker/demo/mtp_dsv3.py)
        from .mtp_dsv3 import write_mtp_dsv3

        return write_mtp_dsv3
    return None


def _default_dtype(size: str) -> str:
    """The stored dtype of a demo when none is asked for: float32 for the MoE demo (no bfloat16 GatherMM on CPU)."""
    return "float32" if size == "mtp-dsv3" else DEFAULT_DTYPE


def _lookup_size(size: str) -> DemoSize:
    """The preset named ``size``, or ``ValueError`` naming the valid ones."""
    try:
        return DEMO_SIZES[size]
    except KeyError:
        valid = ", ".join(DEMO_SIZES)
        raise ValueError(f"unknown demo model size {size!r}; valid sizes: {valid}") from None


def _install(tmp: pathlib.Path, out: pathlib.Path, *, replace: bool) -> None:
    """Rename the finished build ``tmp`` onto ``out`` (see ``_build``)."""
    try:
        os.rename(tmp, out)  # also replaces an empty directory
        return
    except OSError:
        if not out.is_dir() or not (out / DEMO_MARKER).is_file():
            raise FileExistsError(f"{out} exists and is not a demo model build") from None
    if not replace:
        return
    # Swap out an older complete build: move it aside, then rename ours in.
    old = out.with_name(f".{out.name}.{uuid.uuid4().hex}.old")
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except OSError:
        if not (out / DEMO_MARKER).is_file():  # nobody else installed one
            os.rename(old, out)
            raise
    shutil.rmtree(old, ignore_errors=True)


def _write_model_files(directory: pathlib.Path, spec: DemoSize, *, size: str, seed: int, dtype: str) -> None:
    """Write every file of the model into ``directory``, the marker last."""
    tokenizer = train_tokenizer(spec.vocab_size)
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    damped = damped_ids(tokenizer)
    tokenizer_json = tokenizer.to_str(pretty=True) + "\n"
    (directory / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")

    config = _model_config(spec, dtype, ids)
    if size in SPEC_SIZES:  # the agreeing speculative pair (worker/demo/spec.py)
        weights = spec_weights(size, config, seed, damped)
    else:
        weights = _random_weights(config, seed, damped)
    write_safetensors(directory / "model.safetensors", weights, dtype)
    write_json(directory / "config.json", config)
    stop = {"eos_token_id": [ids[IM_END], ids[ENDOFTEXT]]}  # both end tokens stop
    generation = {"bos_token_id": ids[ENDOFTEXT], "pad_token_id": ids[ENDOFTEXT], **stop}
    write_json(directory / "generation_config.json", generation)
    write_json(directory / "tokenizer_config.json", _tokenizer_config(spec))
    special = {"eos_token": IM_END, "pad_token": ENDOFTEXT}
    write_json(directory / "special_tokens_map.json", special)
    marker = {
        "format_version": DEMO_FORMAT_VERSION,
        "size": size,
        "seed": seed,
        "dtype": dtype,
        "chat_template_sha256": chat_template_hash(),
    }
    write_json(directory / DEMO_MARKER, {**marker, "shape": attrs.asdict(spec)})


def _model_config(spec: DemoSize, dtype: str, ids: dict[str, int]) -> dict[str, Any]:
    """The ``config.json`` of a Qwen3 model of shape ``spec``."""
    return {
        **attrs.asdict(spec),
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "initializer_range": EMBED_STD,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_theta": ROPE_THETA,
        "rope_scaling": None,
        "tie_word_embeddings": True,
        "torch_dtype": dtype,
        "use_cache": True,
        "bos_token_id": ids[ENDOFTEXT],
        "pad_token_id": ids[ENDOFTEXT],
        "eos_token_id": ids[IM_END],
    }


def _tokenizer_config(spec: DemoSize) -> dict[str, Any]:
    """The ``tokenizer_config.json`` with the ChatML template."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",  # tokenizer.json holds the rest
        "chat_template": CHAT_TEMPLATE,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "bos_token": None,
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "split_special_tokens": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": spec.max_position_embeddings,
    }


def _parameter_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the parameters of mlx-lm's Qwen3 model for ``config``.

    Building the module only creates lazy arrays (it does advance MLX's global
    random key, as ``mlx_lm.load`` itself does).
    """
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen3

    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    return {name: tuple(p.shape) for name, p in tree_flatten(model.parameters())}


def _random_weights(config: dict[str, Any], seed: int, damped_ids: list[int]) -> dict[str, np.ndarray]:
    """Float32 weights: normal matrices, constant norms.

    Drawn in sorted-name order from one ``default_rng(seed)`` stream: the
    embedding with std ``EMBED_STD``, other matrices with 1/sqrt(fan_in).
    The embedding rows of ``damped_ids`` are scaled by ``SPECIAL_ROW_SCALE``;
    the embedding is tied, so this also shrinks their logits towards 0.
    Norm weights are 1, except the final norm's, which scales the logits to
    a standard deviation of about ``LOGIT_STD``.
    """
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray] = {}
    for name, shape in sorted(_parameter_shapes(config).items()):
        if name.endswith("norm.weight"):
            final = name == "model.norm.weight"
            scale = LOGIT_STD / (EMBED_STD * config["hidden_size"] ** 0.5) if final else 1.0
            weights[name] = np.full(shape, scale, dtype=np.float32)
            continue
        std = EMBED_STD if name == EMBED else shape[-1] ** -0.5
        weights[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
    weights[EMBED][damped_ids] *= np.float32(SPECIAL_ROW_SCALE)
    return weights


# The speculative demo pair builds on this module's recipe (imported last: it imports from here).
from .spec import SPEC_SIZES, spec_weights  # noqa: E402 -- circular by design, see the line above

DEMO_SIZES.update(SPEC_SIZES)
