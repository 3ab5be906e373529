"""Which model paths are GGUF files: a ``.gguf`` file, or a directory holding exactly one and no
config.json (a Hugging Face folder that also ships a GGUF stays a Hugging Face folder)."""

from __future__ import annotations

import pytest

from vllm_mlx_trio.worker.gguf import GGUFError, gguf_file, is_gguf_path


def folder_with(tmp_path, *names: str):
    folder = tmp_path / "model"
    folder.mkdir()
    for name in names:
        (folder / name).write_bytes(b"")
    return folder


def test_a_gguf_file_is_a_gguf_path(tmp_path):
    path = tmp_path / "Model-Q4_1.GGUF"
    path.write_bytes(b"")
    assert is_gguf_path(str(path))
    assert gguf_file(str(path)) == path


def test_a_directory_holding_one_gguf_file_names_it(tmp_path):
    folder = folder_with(tmp_path, "model-Q8_0.gguf", "README.md")
    assert is_gguf_path(str(folder))
    assert gguf_file(str(folder)) == folder / "model-Q8_0.gguf"


def test_a_directory_holding_two_gguf_files_is_refused(tmp_path):
    folder = folder_with(tmp_path, "model-Q8_0.gguf", "model-Q4_0.gguf")
    assert not is_gguf_path(str(folder))
    with pytest.raises(GGUFError, match="expected one .gguf file in the directory, found 2") as caught:
        gguf_file(str(folder))
    assert str(caught.value).startswith(f"{folder}: ")


def test_a_directory_with_config_json_is_not_a_gguf_path(tmp_path):
    assert not is_gguf_path(str(folder_with(tmp_path, "model.gguf", "config.json")))


def test_other_paths_are_not_gguf_paths(tmp_path):
    assert not is_gguf_path(str(folder_with(tmp_path, "model.safetensors", "config.json")))
    assert not is_gguf_path("Qwen/Qwen3-0.6B")
    assert not is_gguf_path("demo:tiny")


def test_a_missing_gguf_file_is_named(tmp_path):
    missing = tmp_path / "gone.gguf"
    assert is_gguf_path(str(missing))
    with pytest.raises(GGUFError, match="no such GGUF file") as caught:
        gguf_file(str(missing))
    assert str(caught.value).startswith(f"{missing}: ")
