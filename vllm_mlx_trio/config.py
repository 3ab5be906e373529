"""Server configuration: frozen attrs classes loaded from TOML, the environment and ``--set``.

Precedence, highest first: ``--set SECTION.KEY=VALUE`` overrides, then environment variables
``VLLM_MLX_TRIO_<SECTION>_<KEY>``, then the TOML file, then the defaults written below.
Every problem is reported as one :class:`~vllm_mlx_trio.errors.ConfigError` whose one-line
message names the key, what was expected and where the bad value came from.
docs/configuration.md is the user-facing reference; a test keeps it in step with these classes.
"""

import difflib
import itertools
import os
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs
import cattrs
import tomli_w

from vllm_mlx_trio.errors import ConfigError
from vllm_mlx_trio.config_fields import (
    DEMO_SIZES,
    _describe,
    _FieldError,
    _in_range,
    _kind,
    _model_path,
    _non_empty,
    _one_of,
    _option,
    _origins,
    _to_float,
    _to_tuple,
)

__all__ = [
    "API_KEYS_ENV", "DEMO_SIZES", "ENGINE_MODES", "ENV_PREFIX", "LOG_FORMATS", "LOG_LEVELS", "NONE_LITERAL",
    "RESERVED_ENV_VARS", "SECTIONS", "CacheConfig", "EngineConfig", "EngineSection", "LimitsConfig",
    "LoggingConfig", "MetricsConfig", "ModelConfig", "ServerConfig", "config_from_dict", "config_to_dict",
    "config_to_toml", "load_config",
]  # fmt: skip

ENV_PREFIX = "VLLM_MLX_TRIO_"
#: The environment variable that holds API keys (comma-separated); never a config key, so
#: ``config show`` cannot print a secret.
API_KEYS_ENV = "VLLM_MLX_TRIO_API_KEYS"
#: Variables with the prefix that are not config keys (read elsewhere); they are skipped.
RESERVED_ENV_VARS = frozenset({"VLLM_MLX_TRIO_CACHE_DIR", API_KEYS_ENV})
ENGINE_MODES = ("simple", "batched")
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
#: The literal that sets an optional (``X | None``) key to None from ``--set`` or the environment.
NONE_LITERAL = "none"


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


@attrs.frozen(kw_only=True)
class ModelConfig:
    """``[model]``: what to load."""

    #: Hub id, local directory, or "demo:<size>" (tiny, small) for the built-in random model.
    path: str = _option("demo:tiny", _non_empty, _model_path)
    #: Hub revision (branch, tag or commit); None means the default branch.
    revision: str | None = _option(None, _non_empty)
    #: Allow model code from the hub to run; only for repositories you trust.
    trust_remote_code: bool = _option(False)
    #: A Jinja chat template that replaces the tokenizer's own; None keeps the tokenizer's.
    chat_template: str | None = _option(None, _non_empty)
    #: Where demo models are built; None means ~/.cache/vllm-mlx-trio/demo.
    demo_cache_dir: str | None = _option(None, _non_empty)


@attrs.frozen(kw_only=True)
class EngineSection:
    """``[engine]``: how requests are run."""

    #: "batched" (continuous batching: requests join and leave a shared batch between steps)
    #: or "simple" (one request at a time through mlx-lm's generate_step).
    mode: str = _option("batched", _one_of(ENGINE_MODES))
    #: Prompt tokens per forward pass during prefill (>= 1); in batched mode a long prompt is
    #: prefilled in chunks of this size between decode steps.
    prefill_step_size: int = _option(512, _in_range(1))
    #: Batched mode: most sequences in the model at once (>= 1); the rest wait in the queue.
    max_num_seqs: int = _option(32, _in_range(1))
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
    #: Tokens per cached block (>= 1); only full blocks are shared.
    block_size: int = _option(64, _in_range(1))
    #: Budget in MiB for cached blocks; none means memory_percent of the memory available at start.
    memory_mb: int | None = _option(None, _in_range(1))
    #: Share of the memory available at start for cached blocks, when memory_mb is not set.
    memory_percent: float = _option(0.20, _in_range(0.0, 1.0), converter=_to_float)
    #: Budget by bytes (true) or, legacy, by number of blocks (max_entries).
    memory_aware: bool = _option(True)
    #: Most cached blocks when memory_aware is false (>= 1).
    max_entries: int = _option(4096, _in_range(1))
    #: Also cache the full blocks of prompt + output when a request finishes (multi-turn reuse).
    store_generated: bool = _option(True)


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
    #: ``[metrics]``: the Prometheus endpoint.
    metrics: MetricsConfig = _option(attrs.Factory(MetricsConfig))
    #: ``[logging]``: log level and format.
    logging: LoggingConfig = _option(attrs.Factory(LoggingConfig))

    @property
    def model_name(self) -> str:
        """The name the server answers to: server.served_model_name, else model.path."""
        return self.server.served_model_name or self.model.path


#: Section name -> section class, in file order.
SECTIONS: dict[str, type] = {f.name: f.type for f in attrs.fields(EngineConfig)}
_SECTION_OF: dict[type, str] = {cls: name for name, cls in SECTIONS.items()}
_ALL_KEYS = [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in attrs.fields(cls)]


def _make_converter() -> cattrs.Converter:
    """A converter that rejects extra keys and passes scalars through to the attrs validators."""
    converter = cattrs.Converter(forbid_extra_keys=True)
    for tp in (str, int, float, bool):
        converter.register_structure_hook(tp, lambda value, _tp: value)
    # Arrays pass through too, so a string is never split into characters; the validators check.
    converter.register_structure_hook_func(
        lambda tp: tp == tuple[str, ...], lambda value, _tp: value
    )
    converter.register_unstructure_hook(tuple, list)  # TOML's arrays, as a parsed file has them
    return converter


_CONVERTER = _make_converter()


# --- messages -------------------------------------------------------------------------------


def _nearest(name: str, candidates: Sequence[str]) -> str | None:
    """The closest candidate by difflib, or None."""
    match = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return match[0] if match else None


def _unknown_key(dotted: str, source: str | None) -> ConfigError:
    """``unknown key 'a.b' (did you mean 'a.c'?)``: nearest in the section, else anywhere."""
    section, _, key = dotted.rpartition(".")
    local = [k for k in _ALL_KEYS if k.startswith(f"{section}.")]
    guess = _nearest(dotted, local) or _nearest(dotted, _ALL_KEYS)
    if guess is None:  # a bare key at the top of the file: match on the key alone
        bare = {k.partition(".")[2]: k for k in _ALL_KEYS}
        guess = bare.get(_nearest(key, list(bare)) or "")
    if guess:
        hint = f"did you mean '{guess}'?"
    elif local:
        hint = "valid keys: " + ", ".join(k.partition(".")[2] for k in local)
    else:
        hint = "valid sections: " + ", ".join(SECTIONS)
    return ConfigError(f"unknown key '{dotted}' ({hint}){_in(source)}")


def _unknown_section(name: str, source: str | None) -> ConfigError:
    """``unknown section 'servr' (did you mean 'server'?)``."""
    guess = _nearest(name, list(SECTIONS))
    hint = f"did you mean '{guess}'?" if guess else "valid sections: " + ", ".join(SECTIONS)
    return ConfigError(f"unknown section '{name}' ({hint}){_in(source)}")


def _in(source: str | None) -> str:
    """Suffix naming where an unknown key came from."""
    return f" in {source}" if source else ""


def _from(source: str | None) -> str:
    """Suffix naming where a bad value came from."""
    return f" (from {source})" if source else ""


# --- reading the layers ---------------------------------------------------------------------

_Entry = tuple[str, str, Any, "str | None"]  # section, key, value, source


def _field(section: str, key: str, source: str | None) -> attrs.Attribute:
    """The attrs field for ``section.key``, or the unknown-key error."""
    cls = SECTIONS.get(section)
    fields = {f.name: f for f in attrs.fields(cls)} if cls else {}
    if key not in fields:
        raise _unknown_key(f"{section}.{key}", source)
    return fields[key]


def _table_entries(data: Any, source: str | None) -> Iterator[_Entry]:
    """Walk a ``{section: {key: value}}`` mapping (a parsed file or a dict)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"expected a table of sections, got {_describe(data)}{_from(source)}")
    for section, table in data.items():
        section = str(section)
        if not isinstance(table, Mapping):
            if section in SECTIONS:
                got = _describe(table)
                raise ConfigError(f"{section}: expected a table, got {got}{_from(source)}")
            raise _unknown_key(section, source)
        if section not in SECTIONS:
            raise _unknown_section(section, source)
        for key, value in table.items():
            _field(section, str(key), source)
            yield section, str(key), value, source


def _parse_text(text: str, field: attrs.Attribute) -> Any:
    """A ``--set``/environment value: "none" for optionals, else TOML, else the raw text."""
    kind, optional = _kind(field.type)
    if optional and text == NONE_LITERAL:
        return None
    try:
        parsed = tomllib.loads(f"v = {text}")
    except tomllib.TOMLDecodeError:
        return text
    if set(parsed) != {"v"}:  # the text smuggled in more than one value
        return text
    value = parsed["v"]
    if kind is str and not isinstance(value, str):  # --set model.revision=1234 means "1234"
        return text
    return value


def _text_entry(section: str, key: str, text: str, source: str) -> _Entry:
    """Check ``section.key`` exists and parse its text value."""
    return section, key, _parse_text(text, _field(section, key, source)), source


def _env_entries(environ: Mapping[str, str]) -> Iterator[_Entry]:
    """``VLLM_MLX_TRIO_<SECTION>_<KEY>`` variables, in name order; reserved ones are skipped."""
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name in RESERVED_ENV_VARS:
            continue
        section, _, key = name[len(ENV_PREFIX) :].lower().partition("_")
        source = f"environment variable {name}"
        if not section or not key:
            raise ConfigError(
                f"{source} does not name a config key (expected {ENV_PREFIX}<SECTION>_<KEY>)"
            )
        yield _text_entry(section, key, environ[name], source)


def _override_entries(overrides: Sequence[str]) -> Iterator[_Entry]:
    """``SECTION.KEY=VALUE`` items from the command line's ``--set``."""
    for item in overrides:
        dotted, eq, text = item.partition("=")
        section, dot, key = dotted.strip().partition(".")
        if not (eq and dot and section and key) or "." in key:
            example = "e.g. limits.max_waiting=8"
            raise ConfigError(f"--set {item!r}: expected SECTION.KEY=VALUE, {example}")
        yield _text_entry(section, key, text, f"--set {item}")


def _read_file(path: str | os.PathLike) -> Any:
    """Parse a TOML file; every failure becomes a ConfigError naming the path."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {os.fspath(path)}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {os.fspath(path)}: invalid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {os.fspath(path)}: not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(f"config file {os.fspath(path)}: cannot read: {exc.strerror}") from None


# --- building -------------------------------------------------------------------------------


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    """The leaf exceptions of a (nested) cattrs ClassValidationError."""
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            yield from _leaves(sub)
    else:
        yield exc


def _translate(exc: Exception, sources: Mapping[tuple[str, str], str | None]) -> ConfigError:
    """Turn a structuring failure into one friendly line (never a cattrs traceback)."""
    leaf = next(_leaves(exc), exc)
    if isinstance(leaf, _FieldError):
        section = _SECTION_OF.get(leaf.owner)
        dotted = f"{section}.{leaf.name}" if section else leaf.name
        return ConfigError(f"{dotted}: {leaf.reason}{_from(sources.get((section, leaf.name)))}")
    if isinstance(leaf, cattrs.ForbiddenExtraKeysError):  # backstop: the walk finds these first
        section = _SECTION_OF.get(leaf.cl)
        key = sorted(leaf.extra_fields)[0]
        return _unknown_key(f"{section}.{key}" if section else key, None)
    return ConfigError(f"invalid configuration: {leaf}")


def _build(entries: Iterator[_Entry]) -> EngineConfig:
    """Merge entries (later wins) and structure them into an EngineConfig."""
    data: dict[str, dict[str, Any]] = {}
    sources: dict[tuple[str, str], str | None] = {}
    for section, key, value, source in entries:
        data.setdefault(section, {})[key] = value
        sources[(section, key)] = source
    try:
        return _CONVERTER.structure(data, EngineConfig)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        raise _translate(exc, sources) from None


# --- public API -----------------------------------------------------------------------------


def load_config(
    path: str | os.PathLike | None = None,
    *,
    overrides: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
) -> EngineConfig:
    """Load the configuration: defaults < ``path`` < environment < ``overrides``.

    ``path`` None means defaults only; ``environ`` defaults to ``os.environ``;
    ``overrides`` are ``"SECTION.KEY=VALUE"`` strings as given to ``--set``.
    Values from the environment and ``--set`` are parsed as TOML values, falling back to the
    raw text; for an optional key the literal ``none`` sets None.
    """
    if isinstance(overrides, str):
        raise TypeError("overrides must be a sequence of 'SECTION.KEY=VALUE' strings, not a str")
    file_layer: Iterator[_Entry] = iter(())
    if path is not None:
        file_layer = _table_entries(_read_file(path), f"config file {os.fspath(path)}")
    env = os.environ if environ is None else environ
    return _build(itertools.chain(file_layer, _env_entries(env), _override_entries(overrides)))


def config_from_dict(data: Mapping[str, Any]) -> EngineConfig:
    """Build a configuration from ``{section: {key: value}}`` with the same checks as a file."""
    return _build(_table_entries(data, None))


def config_to_dict(cfg: EngineConfig) -> dict[str, dict[str, Any]]:
    """``{section: {key: value}}`` for every option, None values included."""
    return _CONVERTER.unstructure(cfg)


def config_to_toml(cfg: EngineConfig) -> str:
    """The configuration as TOML text; None values are omitted (TOML has no null)."""
    data = {
        section: {k: v for k, v in table.items() if v is not None}
        for section, table in config_to_dict(cfg).items()
    }
    return tomli_w.dumps(data, multiline_strings=True)
