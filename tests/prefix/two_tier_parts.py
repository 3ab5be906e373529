"""The two-tier state machine's traffic and stand-ins (tests/prefix/test_disk_tier_machine.py):
the prompts, salts and tail positions it draws, the damage it does to files, and the arrays
each block and tail holds (made from its name, no model needed)."""

from __future__ import annotations

import hashlib
import logging

import mlx.core as mx
import numpy as np
from hypothesis import strategies as st
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

from vllm_mlx_trio.messages import RequestId

MODEL = "model-a"
REQUESTS = [RequestId(f"r{i}") for i in range(3)]
requests = st.sampled_from(REQUESTS)
# shared starts (system prompts) plus a random end, so blocks are shared and come back often
STARTS = [(), (0, 0, 0, 0), (0, 0, 0, 0, 1, 1, 1, 1), (0, 0, 0, 0, 1, 1, 2, 2), (2, 1, 2, 1, 2, 1)]
prompts = st.builds(
    lambda start, end: start + tuple(end), st.sampled_from(STARTS), st.lists(st.integers(0, 1), max_size=4)
)
salts = st.sampled_from([(), (), ("s",)])
#: Where a request's commit puts its tail checkpoint: none, or this many tokens before the
#: prompt's end (the runner's checkpoint is the prompt, or the prompt less its last token).
tail_backs = st.sampled_from([None, 0, 1, 1, 2])
#: Damage, and whether the tier finds it when it opens (its scan reads headers and sizes) or
#: only when a hit reads the file (the checksum). A flipped header byte may be found either
#: way: tests/prefix/test_disk_tier.py covers those.
DAMAGE = {"truncated": True, "foreign-model": True, "another-block": True, "garbage": True, "corrupted-data": False}


def arrays_of(h: bytes) -> list:
    """The block named by hash ``h``: one layer whose keys and values spell the hash."""
    values = np.frombuffer(h, dtype=np.uint8).astype(np.float32).reshape(1, 1, 2, 8)
    return [(mx.array(values), mx.array(-values))]


def tail_name(salt: tuple, covered: tuple) -> bytes:
    """The 16 bytes a tail's arrays spell: its salt and every token up to its end."""
    return hashlib.blake2b(repr((salt, covered)).encode(), digest_size=16).digest()


def same(a: list, h: bytes) -> bool:
    pairs = zip(a, arrays_of(h), strict=True)
    return all(mx.array_equal(x, y).item() for pa, pb in pairs for x, y in zip(pa, pb, strict=True))


class WarningCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.names: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.names.append(record.getMessage())


#: The cache layers of the layouts the machine runs for (what ``make_prompt_cache`` gives).
LAYERS = {"kv": lambda: KVCache(), "window": lambda: RotatingKVCache(max_size=4), "state": lambda: ArraysCache(2)}


class LayoutModel:
    """Just enough of a model for ``PrefixBlocks`` to read its cache layout from."""

    def __init__(self, kinds: tuple[str, ...]) -> None:
        self.kinds = kinds

    def make_cache(self) -> list:
        return [LAYERS[kind]() for kind in self.kinds]
