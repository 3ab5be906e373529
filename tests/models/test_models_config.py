"""``[[models]]`` in a configuration: entries over the top-level defaults, and their errors."""

from __future__ import annotations

import pytest

from vllm_mlx_trio.config import config_from_dict, config_to_toml, load_config
from vllm_mlx_trio.errors import ConfigError


def test_entries_take_the_top_level_sections_as_defaults_and_their_own_keys(tmp_path):
    path = tmp_path / "models.toml"
    path.write_text(
        """
[engine]
kv_memory_mb = 64
max_num_seqs = 8
[[models]]
name = "a"
path = "demo:tiny"
pinned = true
[[models]]
name = "b"
path = "demo:small"
aliases = ["bee"]
max_model_len = 128
[models.engine]
max_num_seqs = 2
"""
    )
    cfg = load_config(path, overrides=["cache.memory_mb=16"], environ={})
    a, b = cfg.models
    assert (a.name, a.pinned, a.config.model.path, a.config.served_names) == ("a", True, "demo:tiny", ("a",))
    assert (b.name, b.pinned, b.config.served_names, b.config.model.max_model_len) == ("b", False, ("b", "bee"), 128)
    assert (a.config.engine.max_num_seqs, b.config.engine.max_num_seqs) == (8, 2)
    assert a.config.engine.kv_memory_mb == b.config.engine.kv_memory_mb == 64
    assert a.config.cache.memory_mb == b.config.cache.memory_mb == 16  # --set reaches every model
    assert load_config(None, environ={}).models == ()
    shown = config_to_toml(cfg)
    assert "[[models]]" in shown and 'name = "b"' in shown and "[models.engine]" in shown


@pytest.mark.parametrize(
    ("models", "message"),
    [
        ([{"path": "demo:tiny"}], "models[0].name: required"),
        ([{"name": "a", "colour": "red"}], "models[0]: unknown key 'colour'"),
        ([{"name": "a", "server": {"port": 1}}], "models[0]: unknown key 'server'"),
        ([{"name": "a", "pinned": "yes"}], "models[0].pinned: must be bool"),
        ([{"name": "a"}, {"name": "b", "aliases": ["a"]}], "the name 'a' is served by both 'a' and 'b'"),
        ([{"name": "a", "engine": {"max_num_seqs": 0}}], "engine.max_num_seqs"),
        ({"name": "a"}, "models: expected an array of tables"),
        (
            [{"name": "a", "cache": {"disk_dir": "/d"}}, {"name": "b", "cache": {"disk_dir": "/d"}}],
            "share cache.disk_dir",
        ),
    ],
)
def test_bad_entries_are_one_clear_error(models, message):
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"models": models})
    assert message in str(caught.value)
