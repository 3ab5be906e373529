"""The ``vlm`` runner: a vision-language model (Qwen-VL family, through mlx-vlm) batched with text.

It is the batched runner with a different model and one more kind of row. The model is loaded
by ``mlx_vlm.load`` (imported here, on the MLX thread, only when this runner is configured)
and driven through :class:`LanguageAdapter`, so text rows go through mlx-lm's
``BatchGenerator`` exactly as in batched mode. A row whose prompt has media is first
prefilled here (:class:`MediaPrefill`: one image or video's vision encoding per step, then
``engine.mllm_prefill_step_size`` tokens of language prefill per step, oldest prompt first), then its
last prompt token is inserted into the generator with the prefilled cache, beside the text
rows, and it decodes with them. Its prompt KV goes to the prefix store when the prefill ends.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import pathlib
from collections import deque

import attrs

from ...errors import ModelLoadError
from ...messages import KVReady, ModelInfo, NewSequence, RequestId, StepPlan, StepResult
from ...runner_kinds import VLM
from ..batched.runner import BatchRunner
from ..kv_budget import kv_budget_tokens
from ..loading import context_length, refuse_adapter, resolve_model_path, resolve_or_fail
from ..modality import declared_towers, read_model_config
from ..runner_base import Advance, LiveSequence
from ..thread_streams import enter_mlx_thread
from .model import LanguageAdapter, MediaPrefill, new_prefill
from .processor import prompt_processor

logger = logging.getLogger(__name__)

#: The architectures this runner drives, each verified against mlx-vlm's own generate on a demo
#: (tests/vlm/test_vlm_zoo.py): the Qwen-VL family with M-RoPE and a per-row delta (Qwen2.5-VL's
#: windowed tower, Qwen3-VL's deepstack features, Qwen3.5's hybrid text model; their MoEs), and
#: 1-D RoPE models (LLaVA, LLaVA-NeXT, Gemma 3, Gemma 4, Mistral 3, Pixtral, SmolVLM). Others are refused at load,
#: naming the type.
SUPPORTED_MODEL_TYPES = (
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_vl",
    "qwen3_vl_moe",
    "qwen3_5",
    "qwen3_5_moe",
    "llava",
    "llava_next",
    "gemma3",
    "gemma4",
    "mistral3",
    "pixtral",
    "smolvlm",
    "idefics3",
)
#: What a request may send to such a model: images, and video where the prompt's video
#: placeholders expand as the model's processor expands them (the Qwen-VL family; Qwen3-VL and
#: Qwen3.5 with a time marker per frame group, worker/vlm/processor.py).
MEDIA_KINDS = frozenset({"image_url", "video_url"})
#: Image-only: the 1-D models' processors here take images only.
VIDEO_MODEL_TYPES = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"})
IMAGE_ONLY_MODEL_TYPES = frozenset(SUPPORTED_MODEL_TYPES) - VIDEO_MODEL_TYPES


def require_vlm_extra() -> None:
    """Fail at startup, in one line, when mlx-vlm is not installed."""
    if importlib.util.find_spec("mlx_vlm") is None:
        raise ModelLoadError(
            "engine.mode = 'vlm' needs mlx-vlm: install the vlm extra (pip install 'vllm-mlx-trio[vlm]')"
        )


def load_vlm(model_cfg) -> tuple[object, object, dict]:
    """(model, processor, config dict) through ``mlx_vlm.load``, as a downloaded model loads."""
    require_vlm_extra()
    refuse_adapter(model_cfg, 'a vision-language model (engine.mode = "vlm")')
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # Here, on the MLX thread and only for a VLM: importing mlx-vlm has side effects.
    import mlx_vlm
    from mlx_vlm.utils import load_config

    path = resolve_or_fail(model_cfg)
    check_served(model_cfg.path, read_model_config(path, revision=model_cfg.revision))
    try:
        config = load_config(path)
        trust = model_cfg.trust_remote_code
        model, processor = mlx_vlm.load(path, revision=model_cfg.revision, trust_remote_code=trust)
    except Exception as exc:  # boundary: hub, filesystem, transformers and mlx-vlm errors
        raise ModelLoadError(f"could not load model {model_cfg.path!r}: {type(exc).__name__}: {exc}") from exc
    return model, processor, config


def check_served(name: str, config: dict) -> None:
    """Refuse, at startup and naming the reason, a text model or an architecture not served here."""
    model_type = config.get("model_type")
    if not declared_towers(config):
        raise ModelLoadError(
            f"engine.mode = 'vlm' needs a vision-language model, but {name!r} is a text model "
            f"(model_type {model_type!r}, no vision_config in its config.json); "
            "use engine.mode = 'auto' or 'batched'"
        )
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(
            f"model {name!r}: vision-language model_type {model_type!r} is not served yet "
            f"(served: {', '.join(SUPPORTED_MODEL_TYPES)}); engine.mode = 'batched' serves it text-only "
            "where mlx-lm has the architecture"
        )
    if model_type == "gemma4" and (config.get("text_config") or {}).get("use_bidirectional_attention") == "vision":
        raise ModelLoadError(
            f"model {name!r}: gemma4 with text_config.use_bidirectional_attention = 'vision' is not served yet "
            "(its image tokens attend to each other both ways, which the chunked media prefill does not do)"
        )


class VlmRunner(BatchRunner):
    """Batched mode for a VLM: text rows and media rows in one BatchGenerator."""

    kind = VLM

    def __init__(self, cfg, *, request_waiting=None):
        super().__init__(cfg, request_waiting=request_waiting)
        self._adapter: LanguageAdapter | None = None
        self._prefills: deque[MediaPrefill] = deque()
        self._ready: dict[RequestId, KVReady | None] = {}
        #: Seconds spent in the vision tower since the last step result (the executor reads them).
        self.vision_encode_s: list[float] = []

    def _load(self) -> ModelInfo:
        enter_mlx_thread()
        model, processor, config = load_vlm(self._cfg.model)
        self._adapter = adapter = LanguageAdapter(model)
        self._start(adapter)  # text rows are batched and prefilled as in batched mode
        return self._model_info(adapter, processor, config)

    def _model_info(self, adapter: LanguageAdapter, processor, config: dict) -> ModelInfo:
        from mlx_lm.tokenizer_utils import load as load_tokenizer

        from ...core.text import byte_level_table

        # The same tokenizer files, wrapped as mlx-lm wraps a text model's (streaming
        # detokenizer, eos ids from generation_config), so admission and detokenizing are shared.
        tokenizer = load_tokenizer(pathlib.Path(resolve_model_path(self._cfg.model)))
        if self._cfg.model.chat_template is not None:
            tokenizer._tokenizer.chat_template = self._cfg.model.chat_template
        budget_tokens, bytes_per_token = kv_budget_tokens(adapter, self._cfg.engine)
        return ModelInfo(
            model_path=resolve_model_path(self._cfg.model),
            max_context_tokens=context_length(config),
            vocab_size=int(config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")),
            eos_token_ids=tuple(sorted(tokenizer.eos_token_ids)),
            tokenizer=tokenizer,
            token_bytes=byte_level_table(tokenizer),
            kv_budget_tokens=budget_tokens,
            kv_bytes_per_token=bytes_per_token,
            media_kinds=MEDIA_KINDS - {"video_url"} if config["model_type"] in IMAGE_ONLY_MODEL_TYPES else MEDIA_KINDS,
            media_processor=prompt_processor(config["model_type"], processor),
        )

    def execute(self, plan: StepPlan) -> StepResult:
        result = super().execute(plan)
        encoded, self.vision_encode_s = tuple(self.vision_encode_s), []
        return attrs.evolve(result, vision_encode_s=encoded) if encoded else result

    def _insert(self, live: list[LiveSequence]) -> None:
        text = [sequence for sequence in live if not sequence.seq.media]
        if text:
            super()._insert(text)
        engine = self._cfg.engine
        chunk = engine.mllm_prefill_step_size or engine.prefill_step_size
        budget_s = None if engine.mllm_encode_step_ms is None else engine.mllm_encode_step_ms / 1000
        for sequence in live:
            if sequence.seq.media:
                seq, cache = self._media_hit(sequence.seq)
                self._prefills.append(new_prefill(seq, cache, self._adapter, chunk, budget_s))

    def _media_hit(self, seq: NewSequence) -> tuple[NewSequence, list | None]:
        """The sequence as it is prefilled, and its prefix hit's cache. A spilled block the disk
        tier cannot give back drops the whole hit (the store's own recompute runs token ids
        through the language model, which would miss the image features): it is prefilled
        again from the start, media included, and reported as recomputed."""
        if not self._prefix.read_back_whole(seq):
            return attrs.evolve(seq, num_cached_tokens=0, cached_block_ids=(), disk_blocks=()), None
        return seq, self._prefix.cache_for(attrs.evolve(seq, disk_blocks=()))

    def _advance(self, live: list[LiveSequence]) -> Advance:
        """One unit of media prefill (if any is pending), then the generator's step."""
        finished = self._media_prefill_step()
        advance = super()._advance(live)
        return Advance(advance.emissions, (*advance.prompts_done, *finished))

    def _may_run_ahead(self, advance: Advance, live: list[LiveSequence], steps: int) -> bool:
        """No extra decode steps while a media prompt waits for its next prefill unit."""
        return not self._prefills and super()._may_run_ahead(advance, live, steps)

    def _media_prefill_step(self) -> list[RequestId]:
        if not self._prefills:
            return []
        prefill = self._prefills[0]
        try:
            prefill.step(self._adapter)
            if prefill.encoding_finished:
                self.vision_encode_s.append(prefill.encode_s)
        except Exception as exc:  # boundary: one request's media the model cannot take fails that request
            self._prefills.popleft()
            self.failures[prefill.seq.request_id] = f"media prefill failed: {type(exc).__name__}: {exc}"
            return []
        if not prefill.done:
            return []
        self._prefills.popleft()
        return [self._start_decoding(prefill)]

    def _start_decoding(self, prefill: MediaPrefill) -> RequestId:
        """Put the prefilled row into the generator: its last prompt token, with its cache."""
        seq = prefill.seq
        live = self._live[seq.request_id]
        first_block = seq.num_cached_tokens // self._prefix.block_size
        if self._prefix.enabled:
            self._ready[seq.request_id] = self._prefix.ready(
                seq.request_id, seq.prompt_token_ids, prefill.cache, first_block
            )
        sampler, processors, stops = self._row(live)
        (uid,) = self._generator.insert(
            [[seq.prompt_token_ids[-1]]],
            caches=[prefill.cache],
            all_tokens=[list(seq.prompt_token_ids[:-1])],
            max_tokens=[seq.max_new_tokens],
            samplers=[sampler],
            logits_processors=[processors],
            stop_sequences=[stops],
        )
        live.handle = uid
        self._request_ids[uid] = seq.request_id
        return seq.request_id

    def _prompt_ready(self, live: LiveSequence) -> KVReady | None:
        if live.seq.media:
            return self._ready.pop(live.request_id, None)
        return super()._prompt_ready(live)

    def _remove(self, live: list[LiveSequence]) -> None:
        gone = {sequence.request_id for sequence in live}
        self._prefills = deque(p for p in self._prefills if p.seq.request_id not in gone)
        for request_id in gone:
            self._ready.pop(request_id, None)
        super()._remove([sequence for sequence in live if sequence.handle is not None])

    def _close(self) -> None:
        self._prefills.clear()
        self._adapter = None
        super()._close()
