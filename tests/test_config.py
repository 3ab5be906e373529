"""Tests for vllm_mlx_trio.config: defaults, layers, precedence, friendly errors, docs in step."""

import re
import tomllib
from pathlib import Path

import attrs
import pytest

from vllm_mlx_trio import cli
from vllm_mlx_trio.config import (
    SECTIONS,
    CacheConfig,
    DistributedConfig,
    EngineConfig,
    EngineSection,
    LimitsConfig,
    LoggingConfig,
    MetricsConfig,
    ModelConfig,
    ServerConfig,
    config_from_dict,
    config_to_dict,
    config_to_toml,
    load_config,
)
from vllm_mlx_trio.config.sections import MllmSection, SpeculativeConfig
from vllm_mlx_trio.errors import ConfigError, VllmMlxTrioError

ROOT = Path(__file__).resolve().parent.parent
DEMO_TOML = ROOT / "config" / "demo.toml"
PROD_TOML = ROOT / "config" / "prod.toml"
DOCS = ROOT / "docs" / "configuration.md"


def write(tmp_path: Path, text: str) -> Path:
    """A TOML file in tmp_path holding ``text``."""
    path = tmp_path / "cfg.toml"
    path.write_text(text, encoding="utf-8")
    return path


def config_error(**kwargs) -> str:
    """load_config(**kwargs) must fail; the one-line message."""
    kwargs.setdefault("environ", {})
    with pytest.raises(ConfigError) as info:
        load_config(**kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


# --- defaults and shipped files -------------------------------------------------------------


def test_defaults():
    cfg = load_config(environ={})
    assert cfg == EngineConfig()
    assert cfg.server == ServerConfig(host="127.0.0.1", port=8000, drain_timeout_s=30.0)
    assert cfg.server.served_model_name is None
    assert cfg.model.path == "demo:tiny"
    assert cfg.model.revision is None and cfg.model.chat_template is None
    assert cfg.model.trust_remote_code is False and cfg.model.demo_cache_dir is None
    assert cfg.engine == EngineSection(mode="auto", prefill_step_size=512, max_num_seqs=32)
    assert cfg.engine.stream_interval == 1 and cfg.engine.prefill_batch_size == 8
    assert cfg.engine.default_max_tokens is None
    assert cfg.limits == LimitsConfig(max_waiting=64, max_body_bytes=4 * 1024 * 1024, max_stop_sequences=16)
    assert cfg.logging == LoggingConfig(level="info", format="text")
    assert cfg.metrics == MetricsConfig(enabled=True)
    assert cfg.model_name == "demo:tiny"


def test_config_is_frozen():
    cfg = EngineConfig()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        cfg.server.port = 1  # type: ignore[misc]


def test_direct_construction_is_validated():
    with pytest.raises(ValueError, match="port"):
        ServerConfig(port=-5)
    with pytest.raises(ValueError, match="expected int"):
        LimitsConfig(max_waiting=True)
    assert ServerConfig(drain_timeout_s=5).drain_timeout_s == 5.0


def test_empty_file_gives_defaults(tmp_path):
    assert load_config(write(tmp_path, ""), environ={}) == EngineConfig()


def test_load_demo_toml():
    cfg = load_config(DEMO_TOML, environ={})
    assert cfg.model.path == "demo:smollm2"
    assert (cfg.server.host, cfg.server.port) == ("127.0.0.1", 8000)


def test_load_prod_toml():
    cfg = load_config(str(PROD_TOML), environ={})
    assert cfg.model.path == "mlx-community/Qwen3-0.6B-8bit"
    assert cfg.model_name == "mlx-community/Qwen3-0.6B-8bit"
    assert cfg.engine.mode == "auto"


# --- precedence -----------------------------------------------------------------------------

ENV_KEY = "VLLM_MLX_TRIO_LIMITS_MAX_WAITING"


def test_file_beats_defaults(tmp_path):
    path = write(tmp_path, "[limits]\nmax_waiting = 32\n")
    assert load_config(path, environ={}).limits.max_waiting == 32


def test_environment_beats_file(tmp_path):
    path = write(tmp_path, "[limits]\nmax_waiting = 32\n")
    assert load_config(path, environ={ENV_KEY: "16"}).limits.max_waiting == 16


def test_override_beats_environment_and_file(tmp_path):
    path = write(tmp_path, "[limits]\nmax_waiting = 32\n")
    cfg = load_config(path, environ={ENV_KEY: "16"}, overrides=["limits.max_waiting=8"])
    assert cfg.limits.max_waiting == 8


def test_last_override_wins():
    cfg = load_config(environ={}, overrides=["server.port=1", "server.port=2"])
    assert cfg.server.port == 2


def test_environ_defaults_to_os_environ(monkeypatch):
    monkeypatch.setenv(ENV_KEY, "3")
    assert load_config().limits.max_waiting == 3


def test_layers_merge_per_key(tmp_path):
    path = write(tmp_path, "[server]\nport = 9000\n[limits]\nmax_waiting = 32\n")
    cfg = load_config(path, environ={"VLLM_MLX_TRIO_SERVER_HOST": "0.0.0.0"})
    assert (cfg.server.host, cfg.server.port, cfg.limits.max_waiting) == ("0.0.0.0", 9000, 32)


def test_reserved_and_unrelated_env_vars_are_skipped():
    environ = {"VLLM_MLX_TRIO_CACHE_DIR": "/tmp/x", "HOME": "/root", "VLLM_OTHER": "1"}
    assert load_config(environ=environ) == EngineConfig()


# --- text values from --set and the environment ---------------------------------------------


def test_override_values_are_parsed_as_toml():
    cfg = load_config(
        environ={},
        overrides=[
            "server.port=9001",
            "server.drain_timeout_s=1.5",
            "model.trust_remote_code=true",
            'model.revision="v1"',
            "model.path=mlx-community/Qwen3-0.6B-8bit",  # not TOML: the raw string
            "server.host=0.0.0.0",
        ],
    )
    assert cfg.server.port == 9001 and cfg.server.drain_timeout_s == 1.5
    assert cfg.model.trust_remote_code is True and cfg.model.revision == "v1"
    assert cfg.model.path == "mlx-community/Qwen3-0.6B-8bit" and cfg.server.host == "0.0.0.0"


def test_int_for_float_and_text_for_string_keys():
    environ = {"VLLM_MLX_TRIO_SERVER_DRAIN_TIMEOUT_S": "5"}
    cfg = load_config(environ=environ, overrides=["model.revision=1234"])
    assert cfg.server.drain_timeout_s == 5.0 and isinstance(cfg.server.drain_timeout_s, float)
    assert cfg.model.revision == "1234"


def test_none_literal_unsets_optional_fields(tmp_path):
    text = '[server]\nserved_model_name = "qwen"\n[engine]\ndefault_max_tokens = 100\n'
    path = write(tmp_path, text)
    assert load_config(path, environ={}).model_name == "qwen"
    cfg = load_config(
        path,
        environ={"VLLM_MLX_TRIO_ENGINE_DEFAULT_MAX_TOKENS": "none"},
        overrides=["server.served_model_name=none"],
    )
    assert cfg.server.served_model_name is None and cfg.engine.default_max_tokens is None
    assert cfg.model_name == "demo:tiny"


def test_quoted_none_is_a_string_and_none_is_not_special_for_required_fields():
    cfg = load_config(environ={}, overrides=['server.served_model_name="none"'])
    assert cfg.server.served_model_name == "none"
    message = config_error(overrides=["server.port=none"])
    assert "server.port: expected int, got str ('none')" in message


def test_malformed_override():
    for item in ["server.port", "port=8", "server.port.x=1", "=1"]:
        assert "expected SECTION.KEY=VALUE" in config_error(overrides=[item])


def test_env_var_without_key():
    message = config_error(environ={"VLLM_MLX_TRIO_VERBOSE": "1"})
    assert "VLLM_MLX_TRIO_VERBOSE" in message and "<SECTION>_<KEY>" in message


# --- unknown keys and sections --------------------------------------------------------------

TYPO = "unknown key 'engine.prefil_step_size' (did you mean 'engine.prefill_step_size'?)"


def test_unknown_key_in_file(tmp_path):
    path = write(tmp_path, "[engine]\nprefil_step_size = 256\n")
    message = config_error(path=path)
    assert message.startswith(TYPO) and str(path) in message


def test_unknown_key_in_environment():
    message = config_error(environ={"VLLM_MLX_TRIO_ENGINE_PREFIL_STEP_SIZE": "256"})
    assert message.startswith(TYPO) and "VLLM_MLX_TRIO_ENGINE_PREFIL_STEP_SIZE" in message


def test_unknown_key_in_override():
    message = config_error(overrides=["engine.prefil_step_size=256"])
    assert message.startswith(TYPO) and "--set engine.prefil_step_size=256" in message


def test_unknown_key_suggests_other_section():
    message = config_error(overrides=["server.max_waiting=3"])
    assert "did you mean 'limits.max_waiting'?" in message
    message = config_error(environ={"VLLM_MLX_TRIO_LIMIT_MAX_WAITING": "3"})
    assert "did you mean 'limits.max_waiting'?" in message


def test_unknown_key_without_close_match_lists_the_keys():
    message = config_error(overrides=["server.zzzzzz=1"])
    assert "valid keys: host, port, drain_timeout_s, served_model_name, api_key_file" in message


def test_unknown_section(tmp_path):
    message = config_error(path=write(tmp_path, "[servr]\nport = 1\n"))
    assert message.startswith("unknown section 'servr' (did you mean 'server'?)")
    message = config_error(path=write(tmp_path, "[nonsense]\n"))
    assert "valid sections: server, model, engine, cache, limits, distributed, metrics, logging" in message


def test_bare_key_at_top_level(tmp_path):
    message = config_error(path=write(tmp_path, "port = 8000\n"))
    assert message.startswith("unknown key 'port' (did you mean 'server.port'?)")


def test_section_must_be_a_table():
    with pytest.raises(ConfigError, match=r"^server: expected a table, got int \(5\)$"):
        config_from_dict({"server": 5})


# --- types and ranges -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ('[engine]\nprefill_step_size = "abc"', "engine.prefill_step_size: expected int, got str ('abc')"),
        ('[server]\nport = "8000"', "server.port: expected int, got str ('8000')"),
        ("[limits]\nmax_waiting = true", "limits.max_waiting: expected int, got bool (True)"),
        ('[model]\npath = ["a", "b"]', "model.path: expected str, got list (['a', 'b'])"),
        ("[model]\ntrust_remote_code = 1", "model.trust_remote_code: expected bool, got int (1)"),
        ('[server]\ndrain_timeout_s = "5"', "server.drain_timeout_s: expected float, got str ('5')"),
        ("[engine]\ndefault_max_tokens = 1.5", "engine.default_max_tokens: expected int or none, got float (1.5)"),
        ('[metrics]\nenabled = "no"', "metrics.enabled: expected bool, got str ('no')"),
        ('[server]\ncors_origins = "*"', "server.cors_origins: expected array of strings, got str ('*')"),
        ("[server]\ncors_origins = [1]", "server.cors_origins: expected array of strings, got list ([1])"),
    ],
)
def test_wrong_types(tmp_path, toml, expected):
    path = write(tmp_path, toml + "\n")
    message = config_error(path=path)
    assert message.startswith(expected) and str(path) in message


def test_wrong_type_from_override():
    message = config_error(overrides=["engine.prefill_step_size=abc"])
    assert message == (
        "engine.prefill_step_size: expected int, got str ('abc') (from --set engine.prefill_step_size=abc)"
    )


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("limits.max_waiting=-1", "limits.max_waiting: must be >= 0, got -1"),
        ("limits.max_body_bytes=100", "limits.max_body_bytes: must be >= 1024, got 100"),
        ("limits.max_stop_sequences=-2", "limits.max_stop_sequences: must be >= 0, got -2"),
        ("engine.prefill_step_size=0", "engine.prefill_step_size: must be >= 1, got 0"),
        ("engine.default_max_tokens=0", "engine.default_max_tokens: must be >= 1, got 0"),
        ("server.port=65536", "server.port: must be between 0 and 65535, got 65536"),
        ("server.drain_timeout_s=-0.5", "server.drain_timeout_s: must be >= 0, got -0.5"),
        ("server.drain_timeout_s=nan", "server.drain_timeout_s: must be >= 0, got nan"),
        (
            "engine.mode=paged",
            "engine.mode: must be one of auto, simple, batched, distributed, vlm, speculative, vlm-speculative, "
            "embed, got 'paged'",
        ),
        ("logging.level=verbose", "logging.level: must be one of debug, info, warning, error"),
        ("logging.format=xml", "logging.format: must be one of text, json, got 'xml'"),
        ("model.path=demo:huge", "model.path: must be one of demo:tiny, demo:small, demo:vlm-tiny"),
        ('server.host=""', "server.host: must not be empty"),
        ('server.cors_origins=["example.com"]', "server.cors_origins: each origin must be '*' or"),
        ('server.cors_origins=["https://a.com/"]', "server.cors_origins: each origin must be '*' or"),
        ("engine.kv_memory_mb=0", "engine.kv_memory_mb: must be >= 1, got 0"),
        ("engine.kv_memory_percent=1.5", "engine.kv_memory_percent: must be between 0.01 and 1.0"),
    ],
)
def test_range_errors(override, expected):
    message = config_error(overrides=[override])
    assert message.startswith(expected) and f"(from --set {override})" in message


def test_range_error_from_file_names_the_file(tmp_path):
    path = write(tmp_path, "[limits]\nmax_waiting = -1\n")
    expected = f"limits.max_waiting: must be >= 0, got -1 (from config file {path})"
    assert config_error(path=path) == expected


@pytest.mark.parametrize("mode", ["simple", "embed"])
def test_speculation_with_another_mode_names_both_keys(tmp_path, mode):
    message = config_error(overrides=[f"engine.mode={mode}", "speculative.method=mtp"])
    assert message == (
        f'speculative.method = "mtp" needs engine.mode = "auto", "batched" or "vlm" (engine.mode is "{mode}") '
        f"(from --set speculative.method=mtp, --set engine.mode={mode})"
    )
    path = write(tmp_path, f'[engine]\nmode = "{mode}"\n')
    message = config_error(path=path, overrides=["speculative.method=draft", "speculative.draft_model=demo:spec-draft"])
    assert message.startswith(
        f'speculative.method = "draft" needs engine.mode = "auto", "batched" or "vlm" (engine.mode is "{mode}")'
    )
    assert f"config file {path}" in message


def test_speculation_on_a_sharded_model_names_the_combination(tmp_path):
    message = config_error(overrides=["engine.mode=distributed", "speculative.method=mtp"])
    assert message == (
        'speculative.method = "mtp" cannot run on a sharded model (engine.mode = "distributed") '
        "(from --set speculative.method=mtp, --set engine.mode=distributed)"
    )
    path = write(tmp_path, '[engine]\nmode = "distributed"\n')
    message = config_error(path=path, overrides=["speculative.method=draft", "speculative.draft_model=demo:spec-draft"])
    assert message.startswith('speculative.method = "draft" cannot run on a sharded model')
    assert f"config file {path}" in message


def test_the_speculative_mode_needs_a_method():
    message = config_error(overrides=["engine.mode=speculative"])
    assert message == (
        'engine.mode = "speculative" needs speculative.method = "draft" or "mtp" (it is "off") '
        "(from --set engine.mode=speculative)"
    )
    message = config_error(overrides=["engine.mode=vlm-speculative"])
    assert message.startswith('engine.mode = "vlm-speculative" needs speculative.method = "draft" or "mtp"')
    # "speculative" / "vlm-speculative" are the kinds a method runs in place of "batched" / "vlm"
    for mode in ("batched", "speculative", "vlm", "vlm-speculative"):
        cfg = load_config(environ={}, overrides=[f"engine.mode={mode}", "speculative.method=mtp"])
        assert (cfg.engine.mode, cfg.speculative.method) == (mode, "mtp")


def test_speculation_and_mode_are_checked_when_built_in_code_too():
    cfg = EngineConfig()
    with pytest.raises(ValueError, match='needs engine.mode = "auto", "batched" or "vlm"'):
        attrs.evolve(cfg, engine=EngineSection(mode="simple"), speculative=SpeculativeConfig(method="mtp"))


def test_engine_mode_may_name_a_kind_the_caller_runs():
    cfg = load_config(environ={}, overrides=["engine.mode=mine"], engine_modes=("batched", "mine"))
    assert cfg.engine.mode == "mine"
    assert config_from_dict({"engine": {"mode": "mine"}}, engine_modes=("mine",)).engine.mode == "mine"
    message = config_error(overrides=["engine.mode=batched"], engine_modes=("mine",))
    assert message == "engine.mode: must be 'mine', got 'batched' (from --set engine.mode=batched)"


def test_edge_values_are_accepted():
    cfg = load_config(
        environ={},
        overrides=[
            "server.port=0",
            "server.port=65535",
            "limits.max_waiting=0",
            "server.drain_timeout_s=0",
        ],
    )
    assert (cfg.server.port, cfg.limits.max_waiting, cfg.server.drain_timeout_s) == (65535, 0, 0.0)
    assert load_config(environ={}, overrides=["model.path=demo:small"]).model.path == "demo:small"


# --- files ----------------------------------------------------------------------------------


def test_toml_syntax_error(tmp_path):
    path = write(tmp_path, "[server]\nport 8000\n")
    message = config_error(path=path)
    assert message.startswith(f"config file {path}: invalid TOML: ")
    assert "line 2" in message


def test_missing_file(tmp_path):
    assert config_error(path=tmp_path / "nope.toml").startswith("config file not found: ")


def test_a_config_error_is_handled_as_a_package_error(tmp_path, monkeypatch, capsys):
    """What being a package error buys: a caller catching the package's root error catches a
    bad config, and the CLI reports one raised inside a Trio task (so wrapped in an exception
    group, which its own ``except ConfigError`` misses) as one line, exit 1."""
    with pytest.raises(VllmMlxTrioError) as caught:
        load_config(tmp_path / "nope.toml", environ={})
    assert type(caught.value) is ConfigError

    def serve_failing(args):
        raise ExceptionGroup("serve", [ConfigError("server.api_key_file: no such file")])

    monkeypatch.setattr(cli, "_run", serve_failing)
    assert cli.main(["serve"]) == 1
    assert capsys.readouterr().err == "vllm-mlx-trio: server.api_key_file: no such file\n"


# --- dumping --------------------------------------------------------------------------------


def test_round_trip_prod(tmp_path):
    cfg = load_config(PROD_TOML, environ={}, overrides=["server.served_model_name=qwen"])
    text = config_to_toml(cfg)
    assert config_from_dict(tomllib.loads(text)) == cfg
    assert load_config(write(tmp_path, text), environ={}) == cfg


def test_round_trip_with_every_option_set():
    template = '{% for m in messages %}{{ m.role }}: "{{ m.content }}"\n{% endfor %}'
    data = {
        "server": {
            "host": "0.0.0.0",
            "port": 0,
            "drain_timeout_s": 2.5,
            "served_model_name": "m",
            "api_key_file": "/etc/keys",
            "cors_origins": ["https://a.example", "*"],
            "backlog": 512,
            "unknown_fields": "ignore",
            "accept_any_model_name": True,
            "model_memory_mb": 512,
            "model_memory_percent": 0.5,
            "model_steps": "exclusive",
            "direct_socket_writes": False,
        },
        "model": {
            "path": "demo:small",
            "gguf_dtype": "bfloat16",
            "revision": "abc",
            "aliases": ["m-fast", "m-main"],
            "trust_remote_code": True,
            "max_model_len": 8192,
            "adapter_path": "/srv/adapters/a",
            "adapters": {},  # named adapters refuse speculation and adapter_path: their own test
            "pooling": "mean",
            "chat_template": template,
            "demo_cache_dir": "/tmp/demo",
            "tool_parser": "hermes",
            "reasoning_parser": "none",
        },
        "engine": {
            "mode": "speculative",
            "prefill_step_size": 64,
            "max_num_seqs": 3,
            "max_num_batched_tokens": 99,
            "prefill_step_size_decoding": 16,
            "prefill_time_ratio": 0.25,
            "mllm_prefill_step_size": 24,
            "mllm_encode_step_ms": 7.5,
            "run_ahead_steps": 3,
            "hold_run_ahead_tokens": True,
            "run_ahead_ms": 24.0,
            "solo_run_ahead_steps": 5,
            "solo_run_ahead_ms": 40.0,
            "chunk_run_ahead_ms": 8.0,
            "prefill_batch_size": 2,
            "completion_batch_size": 4,
            "stream_interval": 5,
            "default_max_tokens": 10,
            "kv_memory_mb": 32,
            "kv_memory_percent": 0.25,
        },
        "cache": {
            "enabled": False,
            "block_size": 16,
            "memory_mb": 64,
            "memory_percent": 0.5,
            "memory_aware": False,
            "max_entries": 10,
            "store_generated": False,
            "kv_events_endpoint": "tcp://127.0.0.1:5557",
            "kv_bits": 8,
            "kv_group_size": 32,
            "warm_prompts_file": "/tmp/warm.json",
            "disk_dir": "/tmp/prefix-disk",
            "disk_mb": 64,
            "state_snapshot_blocks": 2,
            "share_prefix_in_batch": False,
            "share_prefix_min_tokens": 512,
        },
        "limits": {
            "max_waiting": 0,
            "max_body_bytes": 2048,
            "max_stop_sequences": 0,
            "max_n": 2,
            "engine_stall_timeout_s": 1.5,
            "body_timeout_s": 2.0,
            "preprocess_threads": 2,
            "max_stored_responses": 7,
            "tool_result_media": "refuse",
            "clamp_max_tokens": True,
        },
        "distributed": {"backend": "ring", "tensor": 2, "pipeline": 1, "collective_timeout_s": 5.0},
        "metrics": {"enabled": False},
        "logging": {"level": "debug", "format": "json"},
        "mllm": {
            "video_fps": 1.5,
            "video_max_frames": 8,
            "max_request_video_fps": 4.0,
            "max_request_video_frames": 16,
            "video_decode_timeout_s": 12.5,
            "allow_url_fetch": False,
            "fetch_timeout_s": 2.0,
            "max_redirects": 1,
            "allow_private_urls": True,
            "max_image_bytes": 1000,
            "max_video_bytes": 2000,
            "allowed_local_dirs": ["/srv/media"],
            "max_images_per_request": 2,
            "max_image_pixels": 4096,
            "max_decoded_pixels": 8192,
        },
        "speculative": {
            "method": "draft",
            "draft_model": "demo:spec-draft",
            "num_draft_tokens": 3,
            "hidden_state_mode": "pre_norm",
            "mtp_context_tokens": 512,
            "thinking_retirement_resume": True,
        },
    }
    cfg = config_from_dict(data)
    assert config_to_dict(cfg) == data
    assert config_from_dict(tomllib.loads(config_to_toml(cfg))) == cfg


def test_to_toml_omits_none():
    text = config_to_toml(EngineConfig())
    assert "served_model_name" not in text and "revision" not in text
    assert config_to_dict(EngineConfig())["model"]["revision"] is None
    assert config_from_dict(config_to_dict(EngineConfig())) == EngineConfig()


# --- every option is documented -------------------------------------------------------------


def all_options() -> list[tuple[str, str]]:
    """(section, key) for every field of every section class."""
    classes = {
        ServerConfig,
        ModelConfig,
        EngineSection,
        CacheConfig,
        LimitsConfig,
        DistributedConfig,
        MetricsConfig,
        LoggingConfig,
        MllmSection,
        SpeculativeConfig,
    }
    assert set(SECTIONS.values()) == classes
    return [(section, f.name) for section, cls in SECTIONS.items() for f in attrs.fields(cls)]


def test_every_option_is_in_the_docs():
    text = DOCS.read_text(encoding="utf-8")
    documented: dict[str, set[str]] = {}
    section = None
    for line in text.splitlines():
        if heading := re.match(r"^###\s+`\[(\w+)\]`", line):
            section = heading.group(1)
        elif section and (row := re.match(r"^\|\s*`(\w+)`\s*\|", line)):
            documented.setdefault(section, set()).add(row.group(1))
    missing = [f"{s}.{k}" for s, k in all_options() if k not in documented.get(s, set())]
    assert not missing, f"options missing from docs/configuration.md: {missing}"
    known = {f"{s}.{k}" for s, k in all_options()}
    extra = {f"{s}.{k}" for s, keys in documented.items() for k in keys} - known
    assert not extra, f"docs/configuration.md documents options that do not exist: {extra}"


def test_every_option_is_in_prod_toml():
    present: set[tuple[str, str]] = set()
    section = None
    for line in PROD_TOML.read_text(encoding="utf-8").splitlines():
        if header := re.match(r"^\[(\w+)\]", line):
            section = header.group(1)
        elif section and (kv := re.match(r"^#?\s*(\w+)\s*=", line)):  # set, or shown commented out
            present.add((section, kv.group(1)))
    missing = [f"{s}.{k}" for s, k in all_options() if (s, k) not in present]
    assert not missing, f"options missing from config/prod.toml: {missing}"


def test_named_adapters_are_a_table_that_round_trips():
    data = {"model": {"adapters": {"support": "/srv/adapters/support", "legal-v2": "demo:tiny-lora"}}}
    cfg = config_from_dict(data)
    assert cfg.model.adapters == (("support", "/srv/adapters/support"), ("legal-v2", "demo:tiny-lora"))
    assert cfg.adapter_names == {"demo:tiny:support": "support", "demo:tiny:legal-v2": "legal-v2"}
    assert config_to_dict(cfg)["model"]["adapters"] == data["model"]["adapters"]
    assert load_config(None, overrides=['model.adapters={ a = "/x" }'], environ={}).model.adapters == (("a", "/x"),)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"speculative": {"method": "draft", "draft_model": "demo:tiny"}}, "speculation"),
        ({"engine": {"mode": "simple"}}, 'engine.mode = "auto" or "batched"'),
        ({"engine": {"prefill_time_ratio": None}}, "prefill_time_ratio"),
        ({"model": {"adapter_path": "demo:tiny-lora"}}, "unadapted base"),
        ({"model": {"adapters": {"a b": "/x"}}}, "adapter names take"),
        ({"model": {"adapters": {"a": ""}}}, "needs a folder"),
        ({"model": {"adapters": ["/x"]}}, "table"),
    ],
)
def test_named_adapters_refuse_what_cannot_serve_them(extra, words):
    data = {"model": {"adapters": {"a": "/x"}}}
    for section, table in extra.items():
        data[section] = {**data.get(section, {}), **table}
    with pytest.raises(ConfigError, match=re.escape(words)):
        config_from_dict(data)
