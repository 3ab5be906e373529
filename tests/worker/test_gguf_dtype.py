"""``[model] gguf_dtype = "auto"``: float32 on the CPU over a fast BLAS, the packed layout otherwise."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.mlx


def test_auto_follows_the_blas(monkeypatch):
    from vllm_mlx_trio.worker.gguf import dtype

    monkeypatch.setattr(dtype, "loaded_blas", lambda: "libmkl_rt.so.3")
    assert dtype.gguf_dtype("auto") == "float32"
    monkeypatch.setattr(dtype, "loaded_blas", lambda: None)
    assert dtype.gguf_dtype("auto") == "native"


@pytest.mark.parametrize("setting", ["native", "float32", "float16", "bfloat16"])
def test_a_setting_is_kept(setting):
    from vllm_mlx_trio.worker.gguf.dtype import gguf_dtype

    assert gguf_dtype(setting) == setting
