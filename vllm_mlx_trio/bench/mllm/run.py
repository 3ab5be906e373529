"""``vllm-mlx-trio bench mllm``: where an image request's time goes, and whether running text
streams keep their pace while a large image prefills.

Part 1 (one request at a time, the runner driven step by step on this thread, as the executor
drives it): per request the preprocessing (the media loader + the model's processor, what
admission runs in a thread), the vision encoding (its step), the language prefill (the steps
after it until the first token) and the decode (per token after the first).

Part 2 (the whole engine): 4 greedy text streams run; once each has tokens, one request with a
large image and a long text is submitted. The streams' inter-token latency (p50 / p95, and
the longest gap) over the window from that submit to its first token, with the media prefill
in chunks of ``engine.mllm_prefill_step_size`` and the vision encoding spread over steps
(``engine.mllm_encode_step_ms``, the configured value), the same with the encoding in one step,
and both in one piece (``prefill_step_size``, encoding in one step). Runs alternate between
the settings; each row gives the median of its runs and their spread.
"""

from __future__ import annotations

import base64
import io
import itertools
import statistics
import time
from typing import Any

import attrs
import numpy as np
import trio

from ...config import EngineConfig
from ...core.params import SamplingParams
from ...engine import open_engine
from ...messages import ChatMessage, ChatPrompt, ImagePart, NewSequence, RequestId, StepPlan, TextPart
from ..stats import percentile, runs_spread

#: Text streams running while the large image prefills.
NUM_STREAMS = 4
#: Image sizes of part 1 (pixels; the demo VLM caps images at 448x448, 256 tokens) and part 2's.
IMAGE_SIDES = (112, 224, 448)
LARGE_SIDE = 448
#: Words of text after the large image in part 2 (the prompt's language prefill grows with it).
LARGE_TEXT_WORDS = 600
DECODE_TOKENS = 16
SETTLE_S = 0.5


def png_data_url(side: int, seed: int) -> str:
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((side, side, 3)) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def image_prompt(side: int, seed: int, words: int = 8) -> ChatPrompt:
    url = png_data_url(side, seed)
    text = TextPart(text=" ".join(["describe the picture"] + ["and the sea"] * (words // 3)))
    image = ImagePart(ref=url, content_hash=f"bench-{side}-{seed}")
    return ChatPrompt(messages=(ChatMessage(role="user", content=(image, text)),))


def vlm_config(cfg: EngineConfig, chunk: int | None, *, split_encode: bool = True) -> EngineConfig:
    """``cfg`` in vlm mode with media prefill chunks of ``chunk`` (None: whole), the vision
    encoding spread over steps as configured or (``split_encode`` false) in one step."""
    encode_ms = cfg.engine.mllm_encode_step_ms if split_encode else None
    engine = attrs.evolve(cfg.engine, mode="vlm", mllm_prefill_step_size=chunk, mllm_encode_step_ms=encode_ms)
    cache = attrs.evolve(cfg.cache, enabled=False)  # every run prefills the whole prompt
    return attrs.evolve(cfg, engine=engine, cache=cache)


# -- part 1: one request's phases -----------------------------------------------------------


def measure_phases(cfg: EngineConfig, runs: int = 3) -> list[dict]:
    """Per image size: median (min-max) of each phase over ``runs`` requests (run on this thread)."""
    from ...actors.admission.chat_template import render_prompt
    from ...actors.admission.media import process_media_prompt
    from ...media import MediaLoader
    from ...worker.vlm.runner import VlmRunner

    runner = VlmRunner(vlm_config(cfg, None, split_encode=False))
    info = runner.load()
    loader, steps = MediaLoader(cfg.mllm), itertools.count()
    rows = []
    try:
        for side in IMAGE_SIDES:
            samples = []
            for run in range(runs):
                started = time.perf_counter()
                prompt = image_prompt(side, run)
                media = process_media_prompt(
                    loader,
                    info.media_processor,
                    lambda p: render_prompt(info.tokenizer, p),
                    lambda text: info.tokenizer.encode(text, add_special_tokens=False),
                    prompt,
                )
                preprocess_s = time.perf_counter() - started
                seq = NewSequence(
                    request_id=RequestId(f"{side}-{run}"),
                    prompt_token_ids=tuple(media.token_ids),
                    params=SamplingParams(temperature=0.0, max_tokens=DECODE_TOKENS, ignore_eos=True),
                    media=media.media,
                )
                samples.append({"preprocess_s": preprocess_s, **_run_one(runner, seq, steps)})
            rows.append(_phase_row(side, len(seq.prompt_token_ids), media.media[0].num_tokens, samples))
    finally:
        runner.close()
    return rows


def _run_one(runner: Any, seq: NewSequence, steps: itertools.count) -> dict:
    """Step one sequence to its end: (encode, prefill, decode per token) seconds."""
    encode_s, prefill_s, decode = 0.0, 0.0, []
    plan = StepPlan(step_id=next(steps), new_seqs=(seq,))
    tokens = 0
    while tokens < DECODE_TOKENS:
        result = runner.execute(plan)
        plan = StepPlan(step_id=next(steps), decode_ids=(seq.request_id,))
        got = sum(len(t) for _, t in result.sampled)
        if result.vision_encode_s:
            encode_s += result.elapsed_s
        elif tokens == 0:
            prefill_s += result.elapsed_s
        else:
            decode.append(result.elapsed_s)
        tokens += got
    return {"encode_s": encode_s, "prefill_s": prefill_s, "decode_s": statistics.median(decode) if decode else 0.0}


def _phase_row(side: int, prompt_tokens: int, image_tokens: int, samples: list[dict]) -> dict:
    def ms(key: str) -> str:
        values = [s[key] * 1000 for s in samples]
        return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"

    return {
        "image": f"{side}x{side}",
        "image_tokens": image_tokens,
        "prompt_tokens": prompt_tokens,
        "preprocess_ms": ms("preprocess_s"),
        "encode_ms": ms("encode_s"),
        "prefill_ms": ms("prefill_s"),
        "decode_ms_per_token": ms("decode_s"),
    }


# -- part 2: text streams while a large image prefills ---------------------------------------


async def _stream(engine: Any, index: int, arrivals: list[float], started: trio.Event) -> None:
    prompt = [{"role": "user", "content": f"Tell me story number {index} about the sea."}]
    async for _delta in engine.generate(prompt, SamplingParams(temperature=0.0, ignore_eos=True)):
        arrivals.append(trio.current_time())
        if len(arrivals) == 4:
            started.set()


async def start_text_streams(nursery: trio.Nursery, engine: Any) -> list[list[float]]:
    """:data:`NUM_STREAMS` greedy text streams in ``nursery``, once each has a few tokens: each
    one's token arrival times, growing while they run."""
    arrivals: list[list[float]] = [[] for _ in range(NUM_STREAMS)]
    started = [trio.Event() for _ in range(NUM_STREAMS)]
    for i in range(NUM_STREAMS):
        nursery.start_soon(_stream, engine, i, arrivals[i], started[i])
    for event in started:
        await event.wait()
    return arrivals


def gap_stats(arrivals: list[list[float]], begin: float, end: float) -> dict:
    """The streams' gaps between tokens that overlap ``begin``..``end``: p50, p95 and the longest, in ms."""
    gaps = [b - a for times in arrivals for a, b in zip(times, times[1:], strict=False) if b > begin and a < end]
    return {
        "itl_p50_ms": percentile(gaps, 50) * 1000 if gaps else None,
        "itl_p95_ms": percentile(gaps, 95) * 1000 if gaps else None,
        "max_gap_ms": max(gaps) * 1000 if gaps else None,
    }


async def measure_once(engine: Any, seed: int) -> dict:
    """One run: the streams' gaps from the large image's submit to its first token."""
    large = image_prompt(LARGE_SIDE, 100 + seed, LARGE_TEXT_WORDS)
    async with trio.open_nursery() as nursery:
        arrivals = await start_text_streams(nursery, engine)
        await trio.sleep(SETTLE_S)
        begin = trio.current_time()
        async for _delta in engine.generate(large, SamplingParams(temperature=0.0, max_tokens=1)):
            break
        end = trio.current_time()
        nursery.cancel_scope.cancel()
    return {"ttft_s": end - begin, **gap_stats(arrivals, begin, end)}


async def measure_chunking(cfg: EngineConfig, chunk: int, runs: int = 3) -> list[dict]:
    """Alternating runs: the media prefill chunked (``chunk`` tokens) with the encoding spread
    over steps, chunked with the encoding in one step, and both in one piece."""
    encode_ms = cfg.engine.mllm_encode_step_ms
    split, one = f"chunk {chunk}, encode {encode_ms} ms/step", f"chunk {chunk}, encode in one step"
    whole_name = "none (prefill_step_size), encode in one step"
    results: dict[str, list[dict]] = {name: [] for name in (split, one, whole_name)}
    async with (
        open_engine(vlm_config(cfg, chunk)) as chunked_split,
        open_engine(vlm_config(cfg, chunk, split_encode=False)) as chunked,
        open_engine(vlm_config(cfg, None, split_encode=False)) as whole,
    ):
        engines = {split: chunked_split, one: chunked, whole_name: whole}
        for run in range(runs):
            for name, engine in engines.items():
                results[name].append(await measure_once(engine, run))
    return [_chunk_row(name, results[name]) for name in engines]


def _chunk_row(name: str, runs: list[dict]) -> dict:
    return {
        "media prefill": name,
        "runs": len(runs),
        "itl_p50_ms": runs_spread(runs, "itl_p50_ms"),
        "itl_p95_ms": runs_spread(runs, "itl_p95_ms"),
        "max_gap_ms": runs_spread(runs, "max_gap_ms"),
        "image_ttft_s": runs_spread(runs, "ttft_s", 2),
    }
