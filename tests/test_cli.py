"""The command line: config show/check, demo build, and a failing model load."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import tomllib

import pytest

from vllm_mlx_trio.cli import main

REPO = pathlib.Path(__file__).resolve().parent.parent


def test_config_show_prints_effective_toml(capsys, monkeypatch):
    monkeypatch.setenv("VLLM_MLX_TRIO_LIMITS_MAX_WAITING", "9")
    assert main(["config", "show", str(REPO / "config/demo.toml"), "--set", "server.port=8123"]) == 0
    shown = tomllib.loads(capsys.readouterr().out)
    assert shown["server"]["port"] == 8123
    assert shown["limits"]["max_waiting"] == 9
    assert shown["model"]["path"] == "demo:smollm2"


def test_config_check_reports_the_nearest_key(capsys):
    assert main(["config", "check", str(REPO / "config/prod.toml")]) == 0
    assert main(["config", "check", "--set", "engine.prefil_step_size=4"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'engine.prefill_step_size'" in err and err.count("\n") == 1


@pytest.mark.mlx
def test_serve_exits_nonzero_with_a_one_line_cause(tmp_path, capsys):
    missing = tmp_path / "no-such-model"
    missing.mkdir()
    assert main(["serve", "--set", f"model.path={missing}", "--set", "server.port=0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vllm-mlx-trio: could not load model")


def test_importing_the_package_does_not_import_mlx():
    code = "import sys, vllm_mlx_trio, vllm_mlx_trio.http.app; print('mlx' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "False"
