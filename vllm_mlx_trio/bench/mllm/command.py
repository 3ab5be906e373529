"""``vllm-mlx-trio bench mllm``: its tables (the measuring is in bench/mllm/run.py)."""

from __future__ import annotations

import argparse

import attrs

#: The model benchmarked when the configuration names the default text demo.
DEFAULT_VLM = "demo:vlm-tiny"


def run_mllm_command(cfg, args: argparse.Namespace) -> int:
    import trio

    from ..machine import format_machine, machine_info
    from ..report import format_table
    from .run import LARGE_SIDE, LARGE_TEXT_WORDS, NUM_STREAMS, measure_chunking, measure_phases
    from .video import measure_video

    if cfg.model.path == "demo:tiny":
        cfg = attrs.evolve(cfg, model=attrs.evolve(cfg.model, path=DEFAULT_VLM))
    phases = measure_phases(cfg, args.runs)
    chunking = trio.run(measure_chunking, cfg, args.chunk, args.runs)
    video = trio.run(measure_video, cfg, args.chunk, args.runs)
    lines = [
        "== image request phases (one at a time)",
        format_machine(machine_info()),
        format_table(phases, list(phases[0])),
        f"note: model {cfg.model.path}; preprocess = loader + processor (admission's thread work); encode = the "
        "vision step; prefill = the steps after it until the first token; decode = median step per token; "
        f"median (min-max) of {args.runs} requests",
        "",
        f"== {NUM_STREAMS} text streams while a {LARGE_SIDE}x{LARGE_SIDE} image + {LARGE_TEXT_WORDS} words prefills",
        format_table(chunking, list(chunking[0])),
        "note: itl over the window from the image request's submit to its first token; runs alternate; "
        "median (min-max)",
        "",
        f"== {NUM_STREAMS} text streams while a long video arrives (decoded in admission's thread)",
        format_table(video, list(video[0])),
        f"note: chunk {args.chunk}, encode {cfg.engine.mllm_encode_step_ms} ms/step; the first window has no "
        "media request, the second runs from the video's submit to its first token; median (min-max)",
    ]
    print("\n".join(lines), flush=True)
    return 0
