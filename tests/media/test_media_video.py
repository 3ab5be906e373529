"""MediaLoader on videos: OpenCV decoding from a temporary file, frames sampled as
mlx-vlm's load_video samples them, keys that follow the sampling options."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile

import cv2
import numpy as np
import pytest
from media_helpers import data_url, loader, prompt, video

from vllm_mlx_trio.errors import InvalidRequestError
from vllm_mlx_trio.media.video import sample_indices

FIRST = "messages[1].content[1]"


def clip(tmp_path, *, frames=20, fps=10.0, size=(32, 24), fourcc="MJPG", ext="avi") -> bytes:
    """A clip whose frame i is grey level 10*i mod 250 (so a sampled frame of the first 25 tells its index)."""
    path = str(tmp_path / f"clip.{ext}")
    writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*fourcc), fps, size)
    assert writer.isOpened()
    for i in range(frames):
        writer.write(np.full((size[1], size[0], 3), (10 * i) % 250, np.uint8))
    writer.release()
    with open(path, "rb") as file:
        return file.read()


def frame_indices(frames) -> list[int]:
    return [round(float(frame.mean()) / 10) for frame in frames]


@pytest.mark.parametrize("fourcc, ext", [("MJPG", "avi"), ("mp4v", "mp4")])
def test_frames_are_sampled_by_fps_as_load_video_does(tmp_path, fourcc, ext):
    """20 frames at 10 fps is 2 s: at 2 fps 4 frames, spread by linspace over the clip."""
    ref = data_url(clip(tmp_path, fourcc=fourcc, ext=ext), f"video/{ext}")
    (loaded,) = loader().load_prompt_media(prompt(video(ref), video_fps=2.0))
    assert loaded.where == FIRST and loaded.fps == 2.0
    assert frame_indices(loaded.frames) == [0, 6, 13, 19]
    assert all(f.shape == (24, 32, 3) and f.dtype == np.uint8 for f in loaded.frames)


def test_max_frames_caps_the_count(tmp_path):
    ref = data_url(clip(tmp_path), "video/avi")
    (loaded,) = loader().load_prompt_media(prompt(video(ref), video_fps=10.0, video_max_frames=6))
    assert loaded.max_frames == 6
    assert frame_indices(loaded.frames) == [0, 4, 8, 11, 15, 19]


def test_the_config_defaults_apply_without_request_options(tmp_path):
    ref = data_url(clip(tmp_path), "video/avi")
    (loaded,) = loader(video_fps=5.0, video_max_frames=8).load_prompt_media(prompt(video(ref)))
    assert (loaded.fps, loaded.max_frames, len(loaded.frames)) == (5.0, 8, 8)


def test_sampling_matches_mlx_vlm_rules():
    assert list(sample_indices(20, 10.0, 2.0, 768)) == [0, 6, 13, 19]
    assert len(sample_indices(1000, 25.0, 2.0, 32)) == 32  # 40 s at 2 fps = 80, capped
    assert len(sample_indices(3, 1.0, 0.1, 768)) == 2  # at least MIN_FRAMES, but never more than the clip (even)
    assert len(sample_indices(100, 10.0, 0.5, 768)) == 4  # 5 frames rounds down to an even 4


def test_a_different_fps_or_max_frames_gives_a_different_key(tmp_path):
    ref = data_url(clip(tmp_path), "video/avi")
    keys = {
        loader().load_prompt_media(prompt(video(ref), video_fps=fps, video_max_frames=frames))[0].cache_key
        for fps, frames in ((2.0, 8), (4.0, 8), (2.0, 6))
    }
    assert len(keys) == 3
    again = loader().load_prompt_media(prompt(video(ref), video_fps=2.0, video_max_frames=8))[0].cache_key
    assert again in keys


def test_the_temporary_file_is_deleted(tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    ref = data_url(clip(tmp_path), "video/avi")
    assert loader().load_prompt_media(prompt(video(ref)))
    with pytest.raises(InvalidRequestError):
        loader().load_prompt_media(prompt(video(data_url(b"RIFF\0\0\0\0AVI " + b"\0" * 64, "video/avi"))))
    assert glob.glob(str(scratch / "*")) == []


def test_frames_over_max_image_pixels_are_scaled_down(tmp_path):
    ref = data_url(clip(tmp_path, size=(64, 48)), "video/avi")
    (loaded,) = loader(max_image_pixels=16 * 12).load_prompt_media(prompt(video(ref)))
    assert {f.shape for f in loaded.frames} == {(12, 16, 3)}


@pytest.mark.parametrize(
    "data, words",
    [
        (b"#EXTM3U\n#EXT-X-VERSION:3\nhttp://169.254.169.254/latest\n", "supported container"),
        (b"just text", "supported container"),
        (b"RIFF\0\0\0\0AVI " + b"\0" * 64, "cannot be decoded"),
    ],
)
def test_bad_videos_are_400s(data, words):
    with pytest.raises(InvalidRequestError) as caught:
        loader().load_prompt_media(prompt(video(data_url(data, "video/mp4"))))
    assert caught.value.param == FIRST and words in caught.value.message


def test_a_one_frame_video_is_refused(tmp_path):
    ref = data_url(clip(tmp_path, frames=1), "video/avi")
    with pytest.raises(InvalidRequestError, match="at least 2"):
        loader().load_prompt_media(prompt(video(ref)))


def test_an_image_type_on_a_video_part_is_refused(tmp_path):
    with pytest.raises(InvalidRequestError, match="not video/"):
        loader().load_prompt_media(prompt(video(data_url(clip(tmp_path), "image/png"))))


def test_oversize_video_bytes_are_refused(tmp_path):
    data = clip(tmp_path)
    with pytest.raises(InvalidRequestError, match="limit"):
        loader(max_video_bytes=len(data) - 1).load_prompt_media(prompt(video(data_url(data, "video/avi"))))


@pytest.mark.parametrize(
    "options, param",
    [
        ({"video_fps": 31.0}, "video_fps"),
        ({"video_max_frames": 129}, "video_max_frames"),
        ({"video_max_frames": 1}, "video_max_frames"),
        ({"video_fps": float("nan")}, "video_fps"),
    ],
)
def test_request_video_options_are_bounded_by_the_config(tmp_path, options, param):
    ref = data_url(clip(tmp_path), "video/avi")
    with pytest.raises(InvalidRequestError) as caught:
        loader().load_prompt_media(prompt(video(ref), **options))
    assert caught.value.param == param


def test_a_local_video_loads_from_an_allowed_dir(tmp_path):
    (tmp_path / "v.avi").write_bytes(clip(tmp_path))
    (loaded,) = loader(allowed_local_dirs=[str(tmp_path)]).load_prompt_media(prompt(video(str(tmp_path / "v.avi"))))
    assert len(loaded.frames) == 4
    assert os.path.exists(tmp_path / "v.avi")  # the user's file is read, never deleted


def test_sampling_matches_mlx_vlm_load_video_itself(tmp_path):
    """mlx-vlm's own load_video (in a subprocess: importing mlx_vlm has side effects) picks the
    same frame indices as sample_indices for the same clip and options."""
    path = tmp_path / "clip.avi"
    path.write_bytes(clip(tmp_path, frames=37, fps=12.0))
    cases = [(2.0, 768), (2.0, 4), (0.5, 768), (12.0, 10), (30.0, 64)]
    script = (
        "import json, sys\nfrom mlx_vlm.utils import load_video\n"
        "cases = json.loads(sys.argv[2])\n"
        "print(json.dumps([load_video(sys.argv[1], fps=f, max_frames=m)[1].frames_indices for f, m in cases]))"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, "-c", script, str(path), json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    theirs = json.loads(run.stdout.strip().splitlines()[-1])
    ours = [sample_indices(37, 12.0, fps, max_frames).tolist() for fps, max_frames in cases]
    assert ours == theirs


def test_a_decode_past_its_deadline_is_a_400_naming_the_part(tmp_path, monkeypatch):
    """The deadline is checked before each sampled frame: the clock passes it after the first."""
    from vllm_mlx_trio.media import video as video_module

    clock = iter([100.0, 100.0, 100.0 + 31.0])  # deadline set, first frame, second frame
    monkeypatch.setattr(video_module, "clock", lambda: next(clock))
    ref = data_url(clip(tmp_path), "video/avi")
    with pytest.raises(InvalidRequestError) as refused:
        loader(video_decode_timeout_s=30.0).load_prompt_media(prompt(video(ref), video_fps=2.0))
    assert refused.value.param == FIRST
    assert refused.value.message.startswith(f"{FIRST}: decoding the video took longer than 30 s")
    assert "mllm.video_decode_timeout_s" in refused.value.message
