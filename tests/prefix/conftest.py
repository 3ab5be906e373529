"""The eight-architecture model zoo and the pure-recurrent pair, built once per session."""

from __future__ import annotations

import pathlib

import pytest
from prefix_zoo import ARCHITECTURES, RECURRENT, build_model


@pytest.fixture(scope="session")
def zoo_dirs(tmp_path_factory, float32_dir) -> dict[str, str]:
    """Each architecture's tiny model directory, by model type."""
    root = tmp_path_factory.mktemp("zoo")
    return {arch: str(build_model(arch, root / arch, pathlib.Path(float32_dir))) for arch in ARCHITECTURES}


@pytest.fixture(scope="session")
def recurrent_dirs(tmp_path_factory, float32_dir) -> dict[str, str]:
    """The pure-recurrent models' (mamba, mamba2) tiny model directories, by model type."""
    root = tmp_path_factory.mktemp("recurrent")
    return {arch: str(build_model(arch, root / arch, pathlib.Path(float32_dir))) for arch in RECURRENT}
