"""The eight-architecture model zoo, built once per session."""

from __future__ import annotations

import pathlib

import pytest
from prefix_zoo import ARCHITECTURES, build_model


@pytest.fixture(scope="session")
def zoo_dirs(tmp_path_factory, float32_dir) -> dict[str, str]:
    """Each architecture's tiny model directory, by model type."""
    root = tmp_path_factory.mktemp("zoo")
    return {arch: str(build_model(arch, root / arch, pathlib.Path(float32_dir))) for arch in ARCHITECTURES}
