"""The disk tier's store: spill, load, restart, budget, and bad files (a miss, one WARNING, deleted)."""

from __future__ import annotations

import functools
import gc
import logging
import pathlib
import tempfile
import threading

import mlx.core as mx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_mlx_trio.worker.prefix.disk_tier import DiskTier
from vllm_mlx_trio.worker.prefix.layers import Packed

MODEL = "model-a"


def block(seed: int, dtype=mx.float32, layers: int = 2) -> list:
    mx.random.seed(seed)
    return [
        (mx.random.normal((1, 2, 16, 8)).astype(dtype), mx.random.normal((1, 2, 16, 8)).astype(dtype))
        for _ in range(layers)
    ]


def key(n: int) -> bytes:
    return bytes([n]) * 16


def same(a: list, b: list) -> bool:
    def plain(x):
        return x.unpack() if isinstance(x, Packed) else x

    return len(a) == len(b) and all(
        mx.array_equal(plain(x), plain(y)).item() and plain(x).dtype == plain(y).dtype
        for pa, pb in zip(a, b, strict=True)
        for x, y in zip(pa, pb, strict=True)
    )


@pytest.fixture
def tier(tmp_path):
    tiers = []

    def open_tier(max_bytes: int = 1 << 20, model_id: str = MODEL) -> DiskTier:
        tiers.append(DiskTier(tmp_path, max_bytes, model_id))
        return tiers[-1]

    yield open_tier
    for t in tiers:
        t.close()


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_a_spilled_block_loads_back_before_and_after_its_write(tier, dtype):
    t = tier()
    original = block(1, dtype)
    assert t.spill(key(1), original)
    assert same(t.load(key(1)), original)  # served from the queue or the file, either way equal
    t.flush()
    assert same(t.load(key(1)), original)
    assert t.load(key(2)) is None


def test_a_quantized_block_round_trips(tier):
    t = tier()
    packed = [(Packed.of(k, 64, 8), Packed.of(v, 64, 4)) for k, v in block(3)]
    t.spill(key(3), packed)
    t.flush()
    loaded = t.load(key(3))
    assert all(isinstance(x, Packed) for pair in loaded for x in pair)
    assert same(loaded, packed)


def test_the_index_survives_a_restart(tier):
    first = tier()
    original = block(4)
    first.spill(key(4), original)
    first.close()
    again = tier()
    assert key(4) in again and len(again) == 1
    assert same(again.load(key(4)), original)


def test_the_budget_keeps_the_most_recently_used(tier, tmp_path):
    t = tier()
    t.spill(key(0), block(0))
    t.flush()
    size = next(tmp_path.glob("*.safetensors")).stat().st_size
    t.close()
    t = tier(max_bytes=3 * size)
    for n in range(1, 3):
        t.spill(key(n), block(n))
    assert t.load(key(0)) is not None  # now the most recent
    t.spill(key(3), block(3))
    assert [n for n in range(4) if key(n) in t] == [0, 2, 3]  # the least recently used went
    for n in range(4, 7):
        t.spill(key(n), block(n))
        t.flush()
        assert sum(p.stat().st_size for p in tmp_path.glob("*.safetensors")) <= 3 * size
    assert [n for n in range(7) if key(n) in t] == [4, 5, 6]
    assert t.bytes_used == 3 * size
    t.close()
    assert sum(p.stat().st_size for p in tmp_path.glob("*.safetensors")) <= 3 * size
    assert tier(max_bytes=size).bytes_used <= size  # a smaller budget at open trims the directory


def corrupt_middle(path):
    data = bytearray(path.read_bytes())
    data[len(data) - 10] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda p: p.write_bytes(p.read_bytes()[:-7]), id="truncated"),
        pytest.param(lambda p: p.write_bytes(p.read_bytes()[:5]), id="truncated-header"),
        pytest.param(corrupt_middle, id="corrupted-data"),
        pytest.param(lambda p: p.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all"), id="garbage"),
    ],
)
@pytest.mark.parametrize("when", ["at-open", "at-load"])
def test_a_bad_file_is_a_miss_with_one_warning_and_is_deleted(tier, tmp_path, caplog, damage, when):
    t = tier()
    t.spill(key(7), block(7))
    t.spill(key(8), block(8))
    t.flush()
    path = tmp_path / f"{key(7).hex()}.safetensors"
    if when == "at-open":
        t.close()
        damage(path)
        with caplog.at_level(logging.WARNING):
            t = tier()
    else:
        damage(path)
    with caplog.at_level(logging.WARNING):
        assert t.load(key(7)) is None
        assert t.load(key(7)) is None
    t.flush()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and key(7).hex() in r.getMessage()]
    assert len(warnings) == 1
    assert not path.exists()
    assert t.load(key(8)) is not None  # the good one stays


@functools.cache
def good_file_bytes() -> bytes:
    """The bytes of block 7's file."""
    with tempfile.TemporaryDirectory() as directory:
        t = DiskTier(directory, 1 << 20, MODEL)
        t.spill(key(7), block(7))
        t.close()
        return (pathlib.Path(directory) / f"{key(7).hex()}.safetensors").read_bytes()


@settings(max_examples=60, deadline=None, database=None)
@given(data=st.data())
def test_any_flipped_byte_or_cut_is_a_miss_or_the_exact_block_never_a_crash(data):
    """Damage anywhere in a file, header included (a shape, an offset, the layout): opening
    the tier and loading never raise, and a load gives the exact block or None."""
    raw = good_file_bytes()
    if data.draw(st.booleans(), label="cut"):
        damaged = raw[: data.draw(st.integers(0, len(raw) - 1), label="length")]
    else:
        at = data.draw(st.integers(0, len(raw) - 1), label="at")
        damaged = raw[:at] + bytes([raw[at] ^ data.draw(st.integers(1, 255), label="xor")]) + raw[at + 1 :]
    with tempfile.TemporaryDirectory() as directory:
        (pathlib.Path(directory) / f"{key(7).hex()}.safetensors").write_bytes(damaged)
        t = DiskTier(directory, 1 << 20, MODEL)
        try:
            loaded = t.load(key(7))
            assert loaded is None or same(loaded, block(7))
        finally:
            t.close()


def test_a_foreign_models_file_is_deleted_at_open(tier, tmp_path, caplog):
    t = tier(model_id="model-b")
    t.spill(key(9), block(9))
    t.close()
    with caplog.at_level(logging.WARNING):
        t = tier(model_id=MODEL)
    assert key(9) not in t and not list(tmp_path.glob("*.safetensors"))
    assert sum("another model" in r.getMessage() for r in caplog.records) == 1


def test_a_file_renamed_to_another_hash_is_a_miss(tier, tmp_path):
    t = tier()
    t.spill(key(10), block(10))
    t.close()
    (tmp_path / f"{key(10).hex()}.safetensors").rename(tmp_path / f"{key(11).hex()}.safetensors")
    t = tier()
    assert key(11) not in t and key(10) not in t


def test_clear_deletes_every_file(tier, tmp_path):
    t = tier()
    for n in range(3):
        t.spill(key(n), block(n))
    t.clear()
    t.flush()
    assert len(t) == 0 and not list(tmp_path.glob("*.safetensors"))
    assert t.load(key(1)) is None


def test_clear_lets_go_of_the_blocks_a_lagging_writer_still_holds(tier, tmp_path, monkeypatch):
    """A queued write holds its block's MLX arrays until the writer gets to it: a clear drops
    those writes, so the memory the store let go is free at once, not when the writer catches up."""
    started, go_on = held_writer(monkeypatch)
    t = tier()
    gc.collect()
    baseline = mx.get_active_memory()
    t.spill(key(0), block(0))
    assert started.wait(timeout=10)  # the writer holds job 0: the rest stay queued
    for n in range(1, 9):
        assert t.spill(key(n), block(n))  # the store drops its copy; only the queue keeps it
    gc.collect()
    held = mx.get_active_memory() - baseline
    one_block = sum(a.nbytes for pair in block(0) for a in pair)
    assert held >= 8 * one_block
    t.clear()
    gc.collect()
    assert mx.get_active_memory() - baseline <= 2 * one_block  # the job in hand (and its arrays) only
    go_on.set()
    t.flush()
    assert len(t) == 0 and not list(tmp_path.glob("*.safetensors"))


def held_writer(monkeypatch) -> tuple[threading.Event, threading.Event]:
    """Make the writer thread stop at its first job until ``go_on`` is set: (started, go_on)."""
    started, go_on = threading.Event(), threading.Event()
    real_do = DiskTier._do

    def held_do(self, action, key_hex, host):
        started.set()
        go_on.wait()
        real_do(self, action, key_hex, host)

    monkeypatch.setattr(DiskTier, "_do", held_do)
    return started, go_on


def test_a_lagging_writer_holds_at_most_its_queue_bytes_of_blocks(tmp_path, monkeypatch):
    """Spills past WRITER_QUEUE_BYTES of queued arrays are skipped and counted, so the memory a
    slow disk keeps alive is bounded; once the writer catches up, spills are kept again."""
    started, go_on = held_writer(monkeypatch)
    one_block = sum(a.nbytes for pair in block(0) for a in pair)
    t = DiskTier(tmp_path, 1 << 24, MODEL, max_queued_bytes=3 * one_block)
    try:
        gc.collect()
        baseline = mx.get_active_memory()
        kept = [t.spill(key(n), block(n)) for n in range(8)]
        assert started.wait(timeout=10)
        assert kept == [True] * 3 + [False] * 5
        assert t.queued_bytes == 3 * one_block
        assert t.stats.num_skipped_behind == 5 and t.stats.num_skipped == 5
        gc.collect()
        assert mx.get_active_memory() - baseline < 4 * one_block  # the skipped ones' arrays are free
        assert [n for n in range(8) if key(n) in t] == [0, 1, 2]
        go_on.set()
        t.flush()
        assert t.queued_bytes == 0
        assert t.spill(key(9), block(9))  # room again
        t.flush()
        assert {p.name for p in tmp_path.glob("*.safetensors")} == {f"{key(n).hex()}.safetensors" for n in (0, 1, 2, 9)}
    finally:
        go_on.set()
        t.close()


def test_a_block_larger_than_the_queue_bound_still_spills_into_an_empty_queue(tmp_path):
    t = DiskTier(tmp_path, 1 << 24, MODEL, max_queued_bytes=1)
    try:
        assert t.spill(key(1), block(1))
        t.flush()
        assert t.load(key(1)) is not None and t.queued_bytes == 0
    finally:
        t.close()


def test_a_block_over_the_whole_budget_is_not_spilled(tier, tmp_path):
    t = tier(max_bytes=100)
    assert not t.spill(key(1), block(1))
    t.flush()
    assert not list(tmp_path.glob("*.safetensors"))


def greedy(model, cache, prompt: list[int], steps: int) -> list[int]:
    tokens, out = prompt, []
    for _ in range(steps):
        logits = model(mx.array(tokens, dtype=mx.uint32)[None], cache=cache)
        tokens = [mx.argmax(logits[0, -1]).item()]
        out.extend(tokens)
    return out


@pytest.mark.mlx
@pytest.mark.parametrize("kv_bits", [None, 8])
def test_demo_model_blocks_restored_from_disk_after_a_restart_continue_as_a_fresh_prefill(
    float32_dir, tmp_path, kv_bits
):
    """Real demo model: the blocks of a prompt's first 32 tokens, spilled, read back by a new
    tier over the same directory and assembled into a cache, give cache-off greedy output."""
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    from vllm_mlx_trio.core.prefix.block_hash import block_hash
    from vllm_mlx_trio.worker.prefix.kv_store import PrefixBlocks

    model, _ = load(float32_dir)
    prompt = [(7 * i + 3) % 200 + 10 for i in range(40)]
    cache_off = greedy(model, make_prompt_cache(model), prompt, 8)

    prefix = PrefixBlocks(model, 16, enabled=True, kv_bits=kv_bits)
    cache = make_prompt_cache(model)
    model(mx.array(prompt[:32], dtype=mx.uint32)[None], cache=cache)
    blocks = prefix.layout.cut_blocks(cache, 0, 2, 16)
    keys = [block_hash(None, tuple(prompt[:16]))]
    keys.append(block_hash(keys[0], tuple(prompt[16:32])))
    first = DiskTier(tmp_path, 1 << 24, float32_dir)
    for k, b in zip(keys, blocks, strict=True):
        assert first.spill(k, b)
    first.close()

    restarted = DiskTier(tmp_path, 1 << 24, float32_dir)
    try:
        loaded = [restarted.load(k) for k in keys]
    finally:
        restarted.close()
    assert all(b is not None for b in loaded)
    rebuilt = prefix.layout.build(model, loaded, None, 32)
    restored = greedy(model, rebuilt, prompt[32:], 8)
    if kv_bits is None:
        assert restored == cache_off
    else:  # quantized blocks are close, not equal; the restore itself must be lossless
        assert any(isinstance(x, Packed) for x in loaded[0][0])
        assert all(same(a, b) for a, b in zip(loaded, blocks, strict=True)) and len(restored) == 8
