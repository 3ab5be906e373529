"""The tiny float32 demo as GGUF files and as the mlx-lm folders they must equal, each written
once per session."""

from __future__ import annotations

import pathlib

import pytest
from gguf import GGMLQuantizationType
from gguf_builders import build_gguf, write_reference

F32 = GGMLQuantizationType.F32


class Builds:
    """GGUF files and reference folders of the demo under one directory, written on first use."""

    def __init__(self, root: pathlib.Path, demo_dir: pathlib.Path) -> None:
        self.root = root
        self.demo_dir = demo_dir
        #: ``model.demo_cache_dir`` for a server on these files.
        self.cache_dir = root / "cache"
        #: Where the loader writes each file's config and tokenizer (a server, under cache_dir).
        self.sidecars = self.cache_dir / "gguf"

    def gguf(self, arch: str, qtype: GGMLQuantizationType = F32) -> pathlib.Path:
        path = self.root / f"{arch}-{qtype.name}.gguf"
        return path if path.is_file() else build_gguf(path, self.demo_dir, arch, qtype)

    def reference(self, arch: str, qtype: GGMLQuantizationType = F32) -> pathlib.Path:
        path = self.root / f"reference-{arch}-{qtype.name}"
        return path if path.is_dir() else write_reference(path, self.demo_dir, arch, qtype)


@pytest.fixture(scope="session")
def demo_dir(float32_dir) -> pathlib.Path:
    return pathlib.Path(float32_dir)


@pytest.fixture(scope="session")
def builds(tmp_path_factory, demo_dir) -> Builds:
    return Builds(tmp_path_factory.mktemp("gguf"), demo_dir)
