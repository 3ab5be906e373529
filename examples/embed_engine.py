"""Embed the engine in a Trio program, and cancel one request from a timeout.

    python examples/embed_engine.py [CONFIG]

Two requests run against the demo model; the second is given 0.5 s and is cancelled by its
cancel scope. The engine aborts it before its next step and frees everything it held.
"""

from __future__ import annotations

import sys

import trio

from vllm_mlx_trio import SamplingParams, load_config, open_engine


async def answer(engine, question: str) -> str:
    params = SamplingParams(max_tokens=24, temperature=0)
    pieces = [delta.text async for delta in engine.generate([{"role": "user", "content": question}], params)]
    return "".join(pieces)


async def main(config_path: str = "config/demo.toml", overrides: tuple[str, ...] = ()) -> dict:
    cfg = load_config(config_path, overrides=overrides)
    async with open_engine(cfg) as engine:
        text = await answer(engine, "What is 2+2?")
        print(f"answer: {text!r}")
        with trio.move_on_after(0.5) as scope:
            async for _delta in engine.generate(
                [{"role": "user", "content": "Tell me a long story."}],
                SamplingParams(ignore_eos=True),  # runs to the end of the context unless cancelled
            ):
                pass
        print(f"long request cancelled by its timeout: {scope.cancelled_caught}")
        stats = engine.statistics()
        print(f"requests still in the engine: {stats.num_requests}")
        return {"text": text, "cancelled": scope.cancelled_caught, "num_requests": stats.num_requests}


if __name__ == "__main__":
    trio.run(main, *sys.argv[1:2])
