"""What every demo model shares: its name space, the text presets' shapes, the ChatML template,
the weight-scale constants, the completion marker and the install step.

A demo build writes its files into a temporary sibling of the target directory and renames it
into place (:func:`build_into`), so a target never holds a partial build; the marker
(:data:`DEMO_MARKER`), written last, records what the build was made from. The tokenizer and
the byte-exact file writers are in worker/demo/files.py; each model's own files in its module;
worker/demo/table.py names them.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import tempfile
import uuid
from collections.abc import Callable
from typing import Any

import attrs

from .files import DTYPES, ENDOFTEXT, IM_END

DEMO_PREFIX = "demo:"
#: Bump when the corpus, the tokenizer recipe or the weight recipe changes, so
#: that cached builds of an older format are not reused.
DEMO_FORMAT_VERSION = 1
#: Written last into a build; its presence marks the build as complete.
DEMO_MARKER = "demo_model.json"
DEFAULT_DTYPE = "bfloat16"
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


#: The Qwen3 text presets: ``tiny`` (~107k parameters) is for tests, ``small`` (~34M) for
#: benchmarks. The other demos reuse tiny's tokenizer size.
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


def chat_template_hash() -> str:
    """The hash of :data:`CHAT_TEMPLATE` a build records, so a build with another is rebuilt."""
    return hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest()


def built_template_hash(directory: pathlib.Path) -> str | None:
    """The template hash a complete build's marker records, or None."""
    try:
        marker = json.loads((directory / DEMO_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marker.get("chat_template_sha256") if isinstance(marker, dict) else None


def tokenizer_config(model_max_length: int, chat_template: str = CHAT_TEMPLATE) -> dict[str, Any]:
    """The ``tokenizer_config.json`` with the ChatML template (or a demo's variant of it)."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",  # tokenizer.json holds the rest
        "chat_template": chat_template,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "bos_token": None,
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "split_special_tokens": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": model_max_length,
    }


#: Writes every file of one demo model into a directory, the marker last: ``write(directory, *, seed, dtype)``.
Writer = Callable[..., None]


def build_into(out_dir: str | os.PathLike, write: Writer, *, seed: int, dtype: str, replace: bool) -> pathlib.Path:
    """Build with ``write`` into a temporary sibling of ``out_dir``, then install it there.

    An existing empty ``out_dir`` or a previous complete demo build is replaced (with
    ``replace=False`` a complete build already there, say from a concurrent resolver, is kept
    and the new one discarded); any other non-empty directory raises ``FileExistsError``.
    """
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; valid dtypes: {', '.join(DTYPES)}")
    out = pathlib.Path(out_dir).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        tmp.chmod(0o755)
        write(tmp, seed=seed, dtype=dtype)
        _install(tmp, out, replace=replace)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _install(tmp: pathlib.Path, out: pathlib.Path, *, replace: bool) -> None:
    """Rename the finished build ``tmp`` onto ``out`` (see :func:`build_into`)."""
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
