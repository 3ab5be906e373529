"""The DeepSeek-V4 MTP layout: what it is, and why ``method = "mtp"`` refuses it for now (a clear ModelLoadError).

mlx-lm 0.32.2 loads DeepSeek-V4 checkpoints as ``deepseek_v41`` (``deepseek_v41_text`` remaps to it): every decoder
layer carries ``hc_mult`` hyper-connection streams ``(batch, tokens, hc_mult, hidden)``, mixed in and out of
attention and MoE by ``attn_hc`` / ``ffn_hc``; after the last layer the streams are collapsed (mlx-lm: by that
layer's ``ffn_pre`` mix) and normed. mlx-lm's ``sanitize`` drops the checkpoint's ``mtp.*`` tensors. mlx-lm's
module has no ``hc_head``: its ``sanitize`` keeps a checkpoint's ``hc_head_*`` as ``model.hc_head_*``, which the
model has no parameters for (mlx-vlm's ``deepseek_v4`` target collapses with a ``HyperHead`` of its own weights).

The MTP module (mlx-vlm 0.7.10, ``mlx_vlm/speculative/drafters/deepseek_v4_mtp``): ``mtp.{i}.`` (index 1 for
DeepSeek-V4-Flash, 0 otherwise) holds ``enorm`` / ``hnorm`` (RMSNorms), *separate* ``e_proj`` and ``h_proj``
(Linear H -> H, not V3's one ``eh_proj`` over a concatenation), one V4 block (``attn.*`` with a sliding window
and no compression, ``ffn.*`` MoE, ``attn_norm`` / ``ffn_norm``, ``hc_attn_*`` / ``hc_ffn_*``), ``hc_head_*``
(a HyperHead collapsing the streams) and ``norm``. A draft step reads the target's hidden as the *streams*, before
the target's collapse and norm: ``h = e_proj(enorm(embed(token)))[:, :, None] + h_proj(hnorm(streams))`` per
stream, through the block, then ``norm(hc_head(h))`` for the logits; the next step chains on the block's streams.

Two things block an exact drafter on this engine today, so :func:`load_deepseek_v4_mtp` refuses at load instead of
letting the Qwen-layout loader misread ``mtp.*`` or a verify fail later:

* the hidden state: ``speculative.hidden.target_forward`` taps the target's final norm, whose input is already the
  collapsed ``(batch, tokens, hidden)`` state; the head needs the ``(batch, tokens, hc_mult, hidden)`` streams of
  the last layer (no ``hidden_state_mode`` gives them);
* the target's cache: mlx-lm's deepseek_v41 ``LayerCache`` is not trimmable and has neither a ``state`` setter nor
  ``meta_state``, so neither the trim nor the cache transaction (worker/speculative/cache_txn.py) can drop rejected
  drafts
  after a verify.

MLX thread only.
"""

from __future__ import annotations

import pathlib
from typing import Any

from ....errors import ModelLoadError
from .head_deepseek import LoadedHead, Shared

#: Why the layout is refused (the two blockers of the module docstring), in the error's words.
REFUSAL = (
    'method = "mtp" does not support the DeepSeek-V4 MTP layout (mlx-lm model type deepseek_v41) yet: its MTP '
    "layer reads the target's hyper-connection streams (batch, tokens, hc_mult, hidden), which the engine's hidden-"
    "state tap (after the streams are collapsed) does not expose, and the target's deepseek_v41 LayerCache can be "
    'neither trimmed nor snapshotted, so rejected drafts could not be rolled back; use method = "off"'
)


def load_deepseek_v4_mtp(model_dir: str | pathlib.Path, config: dict[str, Any], shared: Shared) -> LoadedHead:
    """The loader of :data:`~.drafter.MTP_LAYOUT_LOADERS` for ``deepseek_v41``: always a ModelLoadError."""
    raise ModelLoadError(f"{model_dir}: {REFUSAL}")
