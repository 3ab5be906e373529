"""Fixtures for the demo VLM over HTTP (helpers in vlm_helpers.py)."""

from __future__ import annotations

import pathlib

import pytest
from vlm_helpers import MODEL

from vllm_mlx_trio.config import load_config

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def offline_hub(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def vlm_cfg(demo_cache_dir):
    return load_config(
        REPO / "config" / "demo.toml",
        overrides=[
            "server.port=0",
            "server.drain_timeout_s=5",
            f"model.demo_cache_dir={demo_cache_dir}",
            f"model.path={MODEL}",  # engine.mode stays "auto": config.json's vision tower picks the vlm runner
            "cache.block_size=16",
        ],
        environ={},
    )


@pytest.fixture(scope="session")
def vlm32_dir(tmp_path_factory) -> str:
    """The demo VLM in float32: a greedy row's tokens then do not depend on its batch."""
    from vllm_mlx_trio.worker.demo.vlm import build_demo_vlm  # imports mlx

    return str(build_demo_vlm(tmp_path_factory.mktemp("vlm32") / "vlm-tiny", dtype="float32"))
