"""A tiny random-weight qwen2 model (float32, the demo tokenizer): mlx-lm 0.32.2's qwen2 has
``PipelineMixin`` (``model.model.pipeline(group)``), the demo's qwen3 does not."""

from __future__ import annotations

import json
import pathlib
import shutil

#: Four layers: two per rank in a 2-stage pipeline.
CONFIG = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 4,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def build_qwen2(out: pathlib.Path, tokenizer_dir: pathlib.Path, seed: int = 0) -> pathlib.Path:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    mx.random.seed(seed)
    model_class, args_class = _get_classes(CONFIG)
    model = model_class(args_class.from_dict(CONFIG))
    model.set_dtype(mx.float32)
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (out / "config.json").write_text(json.dumps(CONFIG))
    for name in _TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, out / name)
    return out
