"""``cache.warm_prompts_file``: prompts prefilled into the prefix cache at startup.

The file is a JSON list; each item is a raw prompt (a string) or a chat (a list of messages,
``{"role": ..., "content": ...}``). :func:`warm_prefix_cache` sends each one through the engine
as a one-token greedy request, so its KV is committed like any request's, after the model has
loaded and before the server says it is ready.
"""

from __future__ import annotations

import json
import logging
import pathlib
from typing import Any

from ...errors import ConfigError
from ..params import SamplingParams

logger = logging.getLogger(__name__)

#: One token: enough for the prompt's KV to be committed, nothing more is computed.
WARM_PARAMS = SamplingParams(temperature=0.0, max_tokens=1)


def read_warm_prompts(path: str) -> list[str | list[dict[str, Any]]]:
    """The prompts of a warm-prompts file; ConfigError naming the file if it is not one."""
    try:
        prompts = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cache.warm_prompts_file {path!r}: {exc}") from exc
    if not isinstance(prompts, list) or not all(_is_prompt(p) for p in prompts):
        raise ConfigError(
            f"cache.warm_prompts_file {path!r}: expected a JSON list of prompts (strings) or chats "
            "(lists of {role, content} messages)"
        )
    return prompts


def _is_prompt(item: Any) -> bool:
    if isinstance(item, str):
        return bool(item)
    return (
        isinstance(item, list)
        and bool(item)
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in item)
    )


async def warm_prefix_cache(engine: Any, path: str) -> int:
    """Prefill every prompt of ``path`` through ``engine``, one at a time; the tokens they
    leave in the prefix cache's keeping (their prompts' tokens, as counted)."""
    prompts = read_warm_prompts(path)
    num_tokens = 0
    for prompt in prompts:
        with await engine.submit(prompt, WARM_PARAMS) as stream:
            async for _ in stream:
                pass
            num_tokens += stream.usage.prompt_tokens
    logger.info("warmed the prefix cache with %d prompts (%d tokens) from %s", len(prompts), num_tokens, path)
    return num_tokens
