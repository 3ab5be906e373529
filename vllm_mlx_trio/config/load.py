"""Server configuration: the classes of ``config.sections`` loaded from TOML, the environment
and ``--set``, and dumped back to TOML.

Precedence, highest first: ``--set SECTION.KEY=VALUE`` overrides, then environment variables
``VLLM_MLX_TRIO_<SECTION>_<KEY>``, then the TOML file, then the defaults in ``config.sections``.
Every problem is reported as one :class:`~vllm_mlx_trio.errors.ConfigError` whose one-line
message names the key, what was expected and where the bad value came from.
docs/configuration.md is the user-facing reference; a test keeps it in step with these classes.
"""

import difflib
import itertools
import os
import tomllib
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

import attrs
import cattrs
import tomli_w

from vllm_mlx_trio.config.fields import _ConflictError, _describe, _FieldError, _kind, _one_of
from vllm_mlx_trio.config.models import model_entries
from vllm_mlx_trio.config.sections import ENGINE_MODES, EngineConfig, EngineSection
from vllm_mlx_trio.errors import ConfigError

ENV_PREFIX = "VLLM_MLX_TRIO_"
#: The environment variable that holds API keys (comma-separated); never a config key, so
#: ``config show`` cannot print a secret.
API_KEYS_ENV = "VLLM_MLX_TRIO_API_KEYS"
#: Variables with the prefix that are not config keys (read elsewhere); they are skipped: the
#: cache root, the API keys, the BLAS to load before MLX (cpu_blas.py), and a local wheel of
#: demo:smollm2 (worker/demo/smollm2.py).
RESERVED_ENV_VARS = frozenset(
    {"VLLM_MLX_TRIO_CACHE_DIR", API_KEYS_ENV, "VLLM_MLX_TRIO_BLAS", "VLLM_MLX_TRIO_SMOLLM2_WHEEL"}
)
#: The array of tables that lists several models (config/models.py); not a section.
MODELS_KEY = "models"
#: The literal that sets an optional (``X | None``) key to None from ``--set`` or the environment.
NONE_LITERAL = "none"


#: Section name -> section class, in file order.
SECTIONS: dict[str, type] = {f.name: f.type for f in attrs.fields(EngineConfig) if f.name != MODELS_KEY}
_SECTION_OF: dict[type, str] = {cls: name for name, cls in SECTIONS.items()}
_ALL_KEYS = [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in attrs.fields(cls)]
_MODE = attrs.fields(EngineSection).mode


def _make_converter() -> cattrs.Converter:
    """A converter that rejects extra keys and passes scalars through to the attrs validators."""
    converter = cattrs.Converter(forbid_extra_keys=True)
    for tp in (str, int, float, bool):
        converter.register_structure_hook(tp, lambda value, _tp: value)
    # Arrays pass through too, so a string is never split into characters; the validators check.
    converter.register_structure_hook_func(lambda tp: tp == tuple[str, ...], lambda value, _tp: value)
    converter.register_structure_hook_func(lambda tp: tp == tuple[tuple[str, str], ...], lambda value, _tp: value)
    converter.register_unstructure_hook(tuple, list)  # TOML's arrays, as a parsed file has them
    # (key, value) pairs are a TOML table in the file (``[model] adapters``)
    converter.register_unstructure_hook_func(lambda tp: tp == tuple[tuple[str, str], ...], dict)
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
            raise ConfigError(f"{source} does not name a config key (expected {ENV_PREFIX}<SECTION>_<KEY>)")
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
    if isinstance(leaf, _ConflictError):
        given = [sources.get((_SECTION_OF.get(owner), name)) for owner, name in leaf.keys]
        named = ", ".join(dict.fromkeys(source for source in given if source))
        return ConfigError(f"{leaf.message}{_from(named)}")
    if isinstance(leaf, cattrs.ForbiddenExtraKeysError):  # backstop: the walk finds these first
        section = _SECTION_OF.get(leaf.cl)
        key = sorted(leaf.extra_fields)[0]
        return _unknown_key(f"{section}.{key}" if section else key, None)
    return ConfigError(f"invalid configuration: {leaf}")


def _build(
    entries: Iterator[_Entry], engine_modes: Collection[str], models: Any = None, origin: str | None = None
) -> EngineConfig:
    """Merge entries (later wins) and structure them into an EngineConfig whose ``engine.mode``
    is one of ``engine_modes``; ``models``: a ``[[models]]`` array over those values."""
    data: dict[str, dict[str, Any]] = {}
    sources: dict[tuple[str, str], str | None] = {}
    for section, key, value, source in entries:
        data.setdefault(section, {})[key] = value
        sources[(section, key)] = source

    def structure(data: dict[str, dict[str, Any]], sources: dict[tuple[str, str], str | None]) -> EngineConfig:
        try:
            cfg = _CONVERTER.structure(data, EngineConfig)
            _one_of(tuple(engine_modes))(cfg.engine, _MODE, cfg.engine.mode)
        except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
            raise _translate(exc, sources) from None
        return cfg

    cfg = structure(data, sources)
    if models is None:
        return cfg
    return attrs.evolve(cfg, models=model_entries(models, data, sources, structure, origin))


def _split_models(data: Any) -> tuple[Any, Any]:
    """A parsed file without its ``models`` array, and the array (None when absent)."""
    if not isinstance(data, Mapping) or MODELS_KEY not in data:
        return data, None
    rest = {key: value for key, value in data.items() if key != MODELS_KEY}
    return rest, data[MODELS_KEY]


# --- public API -----------------------------------------------------------------------------


def load_config(
    path: str | os.PathLike | None = None,
    *,
    overrides: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    engine_modes: Collection[str] = ENGINE_MODES,
) -> EngineConfig:
    """Load the configuration: defaults < ``path`` < environment < ``overrides``.

    ``path`` None means defaults only; ``environ`` defaults to ``os.environ``;
    ``overrides`` are ``"SECTION.KEY=VALUE"`` strings as given to ``--set``.
    Values from the environment and ``--set`` are parsed as TOML values, falling back to the
    raw text; for an optional key the literal ``none`` sets None. ``engine_modes``: the runner
    kinds ``engine.mode`` may name (a program running its own kinds passes its runner table).
    """
    if isinstance(overrides, str):
        raise TypeError("overrides must be a sequence of 'SECTION.KEY=VALUE' strings, not a str")
    file_layer: Iterator[_Entry] = iter(())
    models, origin = None, None
    if path is not None:
        origin = f"config file {os.fspath(path)}"
        data, models = _split_models(_read_file(path))
        file_layer = _table_entries(data, origin)
    env = os.environ if environ is None else environ
    layers = itertools.chain(file_layer, _env_entries(env), _override_entries(overrides))
    return _build(layers, engine_modes, models, origin)


def config_from_dict(data: Mapping[str, Any], *, engine_modes: Collection[str] = ENGINE_MODES) -> EngineConfig:
    """Build a configuration from ``{section: {key: value}}`` with the same checks as a file."""
    data, models = _split_models(data)
    return _build(_table_entries(data, None), engine_modes, models)


def config_to_dict(cfg: EngineConfig) -> dict[str, dict[str, Any]]:
    """``{section: {key: value}}`` for every option, None values included; with
    ``[[models]]``, ``models`` holds the entries' tables as written."""
    data = _CONVERTER.unstructure(cfg)
    del data[MODELS_KEY]
    if cfg.models:
        data[MODELS_KEY] = [dict(entry.table) for entry in cfg.models]
    return data


def config_to_toml(cfg: EngineConfig) -> str:
    """The configuration as TOML text; None values are omitted (TOML has no null)."""
    data: dict[str, Any] = {
        section: {k: v for k, v in table.items() if v is not None}
        for section, table in config_to_dict(cfg).items()
        if section != MODELS_KEY
    }
    if cfg.models:
        data[MODELS_KEY] = [dict(entry.table) for entry in cfg.models]
    return tomli_w.dumps(data, multiline_strings=True)
