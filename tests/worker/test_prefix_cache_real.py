"""The paged prefix cache on the real demo model: greedy outputs are the same with the cache on
and off, ``usage.cached_tokens`` is honest, leases never leak, the budget holds, clear empties
both the pool and the MLX-side store."""

from __future__ import annotations

import importlib.resources
import random
from collections.abc import Callable

import attrs
import pytest
import trio

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.actors.executor import keeping_runners
from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.testing.polling import wait_until

pytestmark = pytest.mark.mlx

TIMEOUT_S = 60
BS = 16  # a small block size makes blocks cheap; one scenario also runs at the default 64
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
MODES = ["batched", "simple"]


def config(model_dir: str, mode: str, *overrides: str):
    return load_config(None, overrides=[f"model.path={model_dir}", f"engine.mode={mode}", *overrides], environ={})


def cache_on(float32_dir: str, mode: str, *overrides: str, block_size: int = BS):
    return config(float32_dir, mode, f"cache.block_size={block_size}", *overrides)


def cache_off(float32_dir: str, mode: str):
    return config(float32_dir, mode, "cache.enabled=false")


def capture_runner(cfg, runners: list):
    """The real executor, with its runner kept in ``runners`` to look at the MLX-side store."""
    if cfg.engine.mode == "batched":
        from vllm_mlx_trio.worker.batched.runner import BatchRunner as Runner
    else:
        from vllm_mlx_trio.worker.simple_runner import SimpleRunner as Runner

    return keeping_runners(lambda request_waiting: Runner(cfg, request_waiting=request_waiting), runners)


# -- prompts -----------------------------------------------------------------------------

SYSTEMS = [
    f"You are assistant number {i}. Answer briefly and kindly about the sea, the sky, the "
    f"stars and the long roads between the old towns of the north, in plain words. " * 2
    for i in range(8)
]
QUESTIONS = [f"Question {j}: what is special about the number {j * 7 + 3}?" for j in range(25)]
CORPUS_WORDS = importlib.resources.files("vllm_mlx_trio").joinpath("data/corpus.txt").read_text().split()


def convo(system: int, question: int) -> list[dict]:
    return [
        {"role": "system", "content": SYSTEMS[system]},
        {"role": "user", "content": QUESTIONS[question]},
    ]


def next_turn(messages: list[dict], answer: str) -> list[dict]:
    return [*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": "Why?"}]


def chat_ids(tok, messages: list[dict]) -> list[int]:
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tok.encode(text, add_special_tokens=False)


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def raw_ids(tok, text: str) -> list[int]:
    return tok.encode(text)  # what admission does with a plain string prompt


def exact_text(tok, num_tokens: int, offset: int = 0) -> str:
    """A raw prompt of exactly ``num_tokens`` tokens, from the corpus starting at word ``offset``."""
    text = ""
    for word in CORPUS_WORDS[offset:]:
        candidate = f"{text} {word}" if text else word
        if len(raw_ids(tok, candidate)) > num_tokens - 2:
            break
        text = candidate
    while (n := len(raw_ids(tok, text))) < num_tokens:
        for pad in (" a", " I", ".", ",", " x", "1"):
            if len(raw_ids(tok, text + pad)) == n + 1:
                text += pad
                break
        else:
            raise AssertionError("could not pad the prompt by one token")
    assert len(raw_ids(tok, text)) == num_tokens
    return text


def exact_chat(tok, num_tokens: int) -> list[dict]:
    """System 0 and a question padded so that the templated prompt is exactly ``num_tokens``."""
    messages = convo(0, 5)
    while (n := len(chat_ids(tok, messages))) < num_tokens:
        for pad in (" a", " I", ".", ",", " x", "1"):
            longer = [messages[0], {"role": "user", "content": messages[1]["content"] + pad}]
            if len(chat_ids(tok, longer)) == n + 1:
                messages = longer
                break
        else:
            raise AssertionError("could not pad the question by one token")
    assert len(chat_ids(tok, messages)) == num_tokens
    return messages


def extension_of(tok, text: str) -> str:
    """``text`` plus more, whose tokens start with ``text``'s tokens (so its blocks can match)."""
    ids = raw_ids(tok, text)
    for ext in ("\n\nThen the story went on for a while.", "\nAnd so on, and so on.", " Then more."):
        longer = raw_ids(tok, text + ext)
        if longer[: len(ids)] == ids and len(longer) > len(ids) + 2:
            return text + ext
    raise AssertionError("no extension keeps the prompt's tokens as a prefix")


def long_text(i: int, num_words: int = 160) -> str:
    """Distinct long raw prompts: a number first, so they differ in their first block."""
    start = (i * 37) % (len(CORPUS_WORDS) - num_words)
    return f"Document {i}: " + " ".join(CORPUS_WORDS[start : start + num_words])


# -- running requests ----------------------------------------------------------------------


@attrs.frozen
class Out:
    tokens: list[int]
    prompt_tokens: int
    cached_tokens: int


async def run_one(engine, prompt, params: SamplingParams = GREEDY, request_id: str | None = None) -> Out:
    with await engine.submit(prompt, params, request_id=request_id) as stream:
        tokens: list[int] = []
        async for delta in stream:
            tokens.extend(delta.token_ids)
        usage = stream.usage
    return Out(tokens, usage.prompt_tokens, usage.cached_tokens)


async def run_many(engine, jobs: dict, *, concurrency: int, params: SamplingParams = GREEDY) -> dict:
    results: dict = {}
    limiter = trio.CapacityLimiter(concurrency)

    async def one(key, prompt):
        async with limiter:
            results[key] = await run_one(engine, prompt, params)

    async with trio.open_nursery() as nursery:
        for key, prompt in jobs.items():
            nursery.start_soon(one, key, prompt)
    return results


async def eventually(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Poll ``predicate`` until it holds (True) or ``timeout_s`` passes (False)."""
    with trio.move_on_after(timeout_s):
        return await wait_until(predicate, poll_s=0.005)
    return False


async def settle(engine) -> None:
    """Wait for the fire-and-forget releases of every finished request."""

    def idle() -> bool:
        stats = engine.statistics()
        return (
            stats.num_requests == 0
            and stats.scheduler.num_running == 0
            and stats.scheduler.num_waiting == 0
            and stats.cache.num_leased == 0
        )

    assert await eventually(idle), engine.statistics()


async def assert_idle_and_consistent(engine, runner=None) -> None:
    """No request leases anything; the pool is consistent; the MLX store holds exactly its blocks."""
    await settle(engine)
    engine._cache.check_invariants()
    stats = engine.statistics().cache
    assert stats.num_leased == 0
    assert stats.pool.num_in_use == 0 and stats.pool.num_shared == 0
    assert stats.pool.num_free == stats.pool.num_blocks
    assert all(block.ref_count == 0 for block in engine.prefix_blocks())
    if runner is not None:
        prefix = runner._prefix

        def store_matches_pool() -> bool:
            ids = [block.block_id for block in engine.prefix_blocks()]
            return (
                len(prefix.store) == len(ids)
                and all(block_id in prefix.store for block_id in ids)
                and not prefix._pending  # no unanswered copies left behind
            )

        # the store is updated on the MLX thread by the next plan: give it a moment
        assert await eventually(store_matches_pool), (len(prefix.store), len(engine.prefix_blocks()))
        assert prefix.store.nbytes == engine.statistics().cache.pool.bytes_used


# -- 1 and 2: greedy outputs with the cache on equal those with it off; honest cached_tokens


def expected_cached(prompts: dict[str, list[int]], out: dict[str, Out]) -> dict[str, int]:
    """The token-granular oracle for requests run one after another with nothing evicted: the
    longest prefix a request shares with the KV an earlier one computed (its prompt and its
    output: a finished cache holds every output token in both modes, since both compute a
    token's KV when they sample it), all but the request's last prompt token at most."""
    seen: list[list[int]] = []
    expected = {}
    for key, ids in prompts.items():
        shared = max((common_prefix(done, ids) for done in seen), default=0)
        expected[key] = min(shared, len(ids) - 1)
        seen.append(ids + out[key].tokens)
    return expected


async def scenario(engine, block_size: int) -> tuple[dict[str, Out], dict[str, list[int]]]:
    """Repeats, shared system prompts, a second chat turn, prompts of exact block multiples;
    the outputs, and each request's prompt token ids in the order they ran."""
    tok = engine.model_info.tokenizer
    out: dict[str, Out] = {}
    ids: dict[str, list[int]] = {}

    async def run(key: str, prompt) -> None:
        ids[key] = raw_ids(tok, prompt) if isinstance(prompt, str) else chat_ids(tok, prompt)
        out[key] = await run_one(engine, prompt)

    await run("first", convo(0, 0))
    await run("repeat", convo(0, 0))
    await run("repeat_again", convo(0, 0))
    for q in (1, 2, 3):
        await run(f"shared_system_q{q}", convo(0, q))
    await run("other_system", convo(1, 1))
    # a second turn: turn 1's answer goes back in as text
    await run("turn2", next_turn(convo(0, 0), tok.decode(out["first"].tokens)))
    # raw prompts whose length is an exact multiple of the block size
    exact = exact_text(tok, 3 * block_size)
    await run("exact", exact)
    await run("exact_repeat", exact)
    await run("exact_extended", extension_of(tok, exact))
    await run("exact_extended_repeat", extension_of(tok, exact))
    # a chat prompt padded to an exact multiple, and a prompt of exactly one block
    padded = exact_chat(tok, 12 * block_size if block_size == BS else 4 * block_size)
    await run("exact_chat", padded)
    await run("exact_chat_repeat", padded)
    one_block = exact_text(tok, block_size, offset=500)
    await run("one_block", one_block)
    await run("one_block_repeat", one_block)
    # one block + 1 token: the same single cached block spliced again and again
    short = exact_text(tok, block_size + 1, offset=700)
    for i in range(3):
        await run(f"one_block_plus_one_{i}", short)
    # shorter than a block: only the token-granular tail can hold it
    tiny = exact_text(tok, block_size // 2, offset=900)
    await run("shorter_than_a_block", tiny)
    await run("shorter_than_a_block_repeat", tiny)
    return out, ids


@pytest.mark.parametrize(("mode", "block_size"), [("batched", BS), ("simple", BS), ("batched", 64)])
async def test_greedy_outputs_equal_cache_off_and_cached_tokens_are_honest(float32_dir, mode, block_size):
    runners: list = []
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cache_off(float32_dir, mode)) as engine:
            off, _ = await scenario(engine, block_size)
        cfg = cache_on(float32_dir, mode, block_size=block_size)
        async with open_engine(cfg, executor_factory=capture_runner(cfg, runners)) as engine:
            tok = engine.model_info.tokenizer
            on, ids = await scenario(engine, block_size)
            await assert_idle_and_consistent(engine, runners[0])
            stats = engine.statistics().cache

    expected = expected_cached(ids, on)
    for key in off:
        assert len(off[key].tokens) == GREEDY.max_tokens, key
        assert on[key].tokens == off[key].tokens, key
        assert off[key].cached_tokens == 0, key
        assert on[key].prompt_tokens == off[key].prompt_tokens == len(ids[key]), key
        # never the whole prompt: the last token is always recomputed for its logits
        assert on[key].cached_tokens == expected[key], key

    # the oracle's figures, spelled out where they matter
    assert on["first"].cached_tokens == 0
    for key in ("repeat", "repeat_again", "exact_repeat", "exact_chat_repeat", "one_block_repeat"):
        assert on[key].cached_tokens == on[key].prompt_tokens - 1 > 0, key  # exact repeats: all but one
    assert on["shorter_than_a_block_repeat"].cached_tokens == block_size // 2 - 1
    sys_ids = chat_ids(tok, convo(0, 0))
    for q in (1, 2, 3):  # the shared system prompt is reused, not only its whole blocks
        assert on[f"shared_system_q{q}"].cached_tokens >= common_prefix(sys_ids, ids[f"shared_system_q{q}"])
    assert on["exact_extended"].cached_tokens >= 3 * block_size
    assert [on[f"one_block_plus_one_{i}"].cached_tokens for i in range(1, 3)] == [block_size] * 2
    assert stats.num_hits > 0 and stats.num_misses > 0


@pytest.mark.parametrize("mode", MODES)
async def test_second_chat_turn_reuses_the_generated_blocks(float32_dir, mode):
    """With store_generated, turn 2 hits blocks that cover turn 1's answer, not just its prompt."""
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cache_on(float32_dir, mode)) as engine:
            tok = engine.model_info.tokenizer
            turn1 = convo(2, 4)
            first = await run_one(engine, turn1)
            await settle(engine)
            answer = tok.decode(first.tokens)
            turn2 = next_turn(turn1, answer)
            second = await run_one(engine, turn2)
            await assert_idle_and_consistent(engine)
    turn1_ids = chat_ids(tok, turn1)
    turn2_ids = chat_ids(tok, turn2)
    assert common_prefix(turn1_ids + first.tokens, turn2_ids) == len(turn1_ids + first.tokens), (
        "the answer re-tokenizes to the same tokens"
    )
    seen = turn1_ids + first.tokens  # the tokens whose KV turn 1 committed
    expected = min(len(seen), len(turn2_ids) - 1)
    assert expected > len(turn1_ids)  # the answer's tokens are reused too
    assert second.cached_tokens == expected


SAMPLING = {
    "seeded": SamplingParams(temperature=1.0, seed=11, max_tokens=16, ignore_eos=True),
    "top_p_top_k": SamplingParams(temperature=0.8, top_p=0.9, top_k=20, seed=3, max_tokens=16, ignore_eos=True),
    "penalties": attrs.evolve(GREEDY, presence_penalty=1.5, frequency_penalty=0.5),
    "logit_bias": attrs.evolve(GREEDY, logit_bias=((300, 3.0),)),
    "logprobs": attrs.evolve(GREEDY, max_tokens=4, logprobs=2),
    # its 20-token context must include the cached prefix (simple mode once lost it)
    "repetition_penalty": attrs.evolve(GREEDY, repetition_penalty=2.0),
}


async def sampled(engine, prompt, params) -> tuple[list[int], list[float], int]:
    with await engine.submit(prompt, params) as stream:
        tokens, logprobs = [], []
        async for delta in stream:
            tokens.extend(delta.token_ids)
            logprobs.extend(lp.logprob for lp in delta.logprobs)
    return tokens, logprobs, stream.usage.cached_tokens


@pytest.mark.parametrize("mode", MODES)
async def test_sampling_parameters_give_the_same_output_after_a_cache_hit(float32_dir, mode):
    """A raw prompt of 3 blocks + 1 token: every repeat splices 3 blocks and computes 1 token."""
    results = {}
    with trio.fail_after(TIMEOUT_S):
        for cache in ("off", "on"):
            cfg = cache_off(float32_dir, mode) if cache == "off" else cache_on(float32_dir, mode)
            async with open_engine(cfg) as engine:
                prompt = exact_text(engine.model_info.tokenizer, 3 * BS + 1)
                results[cache] = {
                    (name, i): await sampled(engine, prompt, params)
                    for name, params in SAMPLING.items()
                    for i in range(2)
                }
    for key, (tokens, logprobs, cached) in results["on"].items():
        off_tokens, off_logprobs, _ = results["off"][key]
        assert tokens == off_tokens, key
        assert logprobs == pytest.approx(off_logprobs, abs=1e-5), key
        assert cached == (0 if key == ("seeded", 0) else 3 * BS), key


async def test_cache_salt_isolates_cached_blocks(float32_dir):
    prompt = convo(7, 3)
    salted = {salt: attrs.evolve(GREEDY, cache_salt=salt) for salt in ("tenant-a", "tenant-b")}
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cache_on(float32_dir, "batched")) as engine:
            a1 = await run_one(engine, prompt, salted["tenant-a"])
            b1 = await run_one(engine, prompt, salted["tenant-b"])
            plain = await run_one(engine, prompt)
            a2 = await run_one(engine, prompt, salted["tenant-a"])
            plain2 = await run_one(engine, prompt)
            await assert_idle_and_consistent(engine)
    full = a1.prompt_tokens - 1
    assert [o.cached_tokens for o in (a1, b1, plain, a2, plain2)] == [0, 0, 0, full, full]
    assert a1.tokens == b1.tokens == plain.tokens == a2.tokens == plain2.tokens


# -- 1: 200 requests with overlapping prefixes in mixed concurrency --------------------------


@pytest.mark.parametrize(("mode", "num_questions"), [("batched", 25), ("simple", 4)])
async def test_200_requests_with_overlapping_prefixes_equal_cache_off(float32_dir, mode, num_questions):
    """8 system prompts x 25 questions, 16 at a time (simple mode, one at a time anyway: 8 x 4)."""
    jobs = {(s, q): convo(s, q) for s in range(8) for q in range(num_questions)}
    order = list(jobs)
    random.Random(1).shuffle(order)
    jobs = {key: jobs[key] for key in order}
    params = attrs.evolve(GREEDY, max_tokens=8)
    runners: list = []
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cache_off(float32_dir, mode)) as engine:
            off = await run_many(engine, jobs, concurrency=32, params=params)
        cfg = cache_on(float32_dir, mode)
        async with open_engine(cfg, executor_factory=capture_runner(cfg, runners)) as engine:
            on = await run_many(engine, jobs, concurrency=16, params=params)
            await assert_idle_and_consistent(engine, runners[0])
            stats = engine.statistics().cache
    mismatched = [key for key in jobs if on[key].tokens != off[key].tokens]
    assert not mismatched, f"{len(mismatched)} outputs differ from cache-off: {mismatched[:5]}"
    assert all(len(out.tokens) == params.max_tokens for out in on.values())
    assert all(0 <= o.cached_tokens < o.prompt_tokens for o in on.values())
    # all but the first few of each system prompt reuse it (some start before it is committed)
    assert sum(o.cached_tokens > 0 for o in on.values()) >= len(jobs) * 3 // 4
    assert stats.num_queries == stats.num_releases == len(jobs)


# -- 3: cancellations in a burst never leak a lease ------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_burst_with_cancellations_leaves_no_leases(float32_dir, mode):
    """24 requests on one system prompt, 8 of them cancelled; prefill in 32-token chunks, so
    some are cancelled mid-prefill (their prompt's KV may come back after the abort)."""
    jobs = {q: convo(3, q) for q in range(24)}
    cancelled = {q for q in jobs if q % 3 == 0}
    runners: list = []
    max_shared = 0
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cache_off(float32_dir, mode)) as engine:
            kept = {q: p for q, p in jobs.items() if q not in cancelled}
            off = await run_many(engine, kept, concurrency=24)
        cfg = cache_on(float32_dir, mode, "engine.prefill_step_size=32")
        async with open_engine(cfg, executor_factory=capture_runner(cfg, runners)) as engine:
            # warm the shared system prompt so the burst shares its blocks
            await run_one(engine, convo(3, 24))
            results: dict = {}

            async def one(q, prompt):
                nonlocal max_shared
                tokens: list[int] = []
                if q % 6 == 3:  # gone right after admission, before any output
                    stream = await engine.submit(prompt, GREEDY)
                    stream.close()
                    return
                async for delta in engine.generate(prompt, GREEDY):
                    tokens.extend(delta.token_ids)
                    max_shared = max(max_shared, engine.statistics().cache.pool.num_shared)
                    if q in cancelled and len(tokens) >= 2:
                        break  # mid-stream
                results[q] = tokens

            async with trio.open_nursery() as nursery:
                for q, prompt in jobs.items():
                    nursery.start_soon(one, q, prompt)
            await assert_idle_and_consistent(engine, runners[0])
            stats = engine.statistics()
    assert {q: results[q] for q in off} == {q: o.tokens for q, o in off.items()}
    closed_at_once = {q for q in cancelled if q % 6 == 3}
    # a request that broke off after 2 deltas may have finished already; the others cannot
    assert len(closed_at_once) <= stats.scheduler.num_aborted <= len(cancelled)
    # every request that looked up (leased) was released exactly once
    assert stats.cache.num_releases == stats.cache.num_queries >= 1 + len(jobs) - len(closed_at_once)
    if mode == "batched":
        assert max_shared > 0  # the burst really did share blocks


# -- 4: the memory budget --------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_memory_budget_evicts_and_outputs_still_match(float32_dir, mode):
    """1 MiB holds 128 blocks of 16 tokens (8 KiB each on the tiny model); 8 prompts of ~24
    blocks each overflow it, while no single request exceeds it."""
    jobs = {i: long_text(i) for i in range(8)}
    jobs.update({("again", i): long_text(i) for i in (0, 7)})  # evicted / kept
    runners: list = []
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cache_off(float32_dir, mode)) as engine:
            off = await run_many(engine, jobs, concurrency=4)
        cfg = cache_on(float32_dir, mode, "cache.memory_mb=1")
        async with open_engine(cfg, executor_factory=capture_runner(cfg, runners)) as engine:
            on = {}
            for key, prompt in jobs.items():  # sequential: the eviction order is deterministic
                on[key] = await run_one(engine, prompt)
                await settle(engine)
                assert engine.statistics().cache.pool.bytes_used <= 1024 * 1024
            await assert_idle_and_consistent(engine, runners[0])
            stats = engine.statistics().cache.pool
    assert {k: o.tokens for k, o in on.items()} == {k: o.tokens for k, o in off.items()}
    assert all(300 < o.prompt_tokens < 128 * BS for o in on.values())
    assert stats.num_evictions > 0
    assert 0 < stats.bytes_used <= stats.max_bytes == 1024 * 1024 and not stats.over_budget
    assert on[("again", 0)].cached_tokens <= BS  # the oldest prompt was evicted, but for its head
    assert on[("again", 7)].cached_tokens == on[7].prompt_tokens - 1  # newest kept


@pytest.mark.parametrize("mode", MODES)
async def test_max_entries_budget_holds_once_idle_and_outputs_still_match(float32_dir, mode):
    """Each prompt (~6-12 blocks) alone exceeds 4 blocks: its blocks stay while it leases them,
    and the release evicts back down to the budget."""
    prompts = [long_text(i, num_words=40 + 10 * i) for i in range(6)]
    runners: list = []
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cache_off(float32_dir, mode)) as engine:
            off = [await run_one(engine, p) for p in prompts]
        cfg = cache_on(float32_dir, mode, "cache.memory_aware=false", "cache.max_entries=4")
        async with open_engine(cfg, executor_factory=capture_runner(cfg, runners)) as engine:
            on = []
            for prompt in prompts:
                on.append(await run_one(engine, prompt))
                await settle(engine)
                stats = engine.statistics().cache.pool
                assert stats.num_blocks <= 4 and not stats.over_budget, stats
            again = await run_one(engine, prompts[-1])  # tails go first: its 4 head blocks stay
            await assert_idle_and_consistent(engine, runners[0])
            stats = engine.statistics().cache.pool
    assert all(o.prompt_tokens > 5 * BS for o in on)
    assert [o.tokens for o in on] == [o.tokens for o in off]
    # its head blocks stay (one slot may hold the block of another "Document" it shares 2 tokens with)
    assert again.tokens == off[-1].tokens and again.cached_tokens >= 3 * BS
    assert stats.num_evictions > 0 and stats.max_blocks == 4 and stats.num_blocks <= 4


# -- 5: clearing the cache -------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_clear_drops_unreferenced_blocks_from_pool_and_store(float32_dir, mode):
    runners: list = []
    prompt = convo(4, 7)
    with trio.fail_after(TIMEOUT_S):
        cfg = cache_on(float32_dir, mode)
        async with open_engine(cfg, executor_factory=capture_runner(cfg, runners)) as engine:
            runner = runners[0]
            first = await run_one(engine, prompt)
            await assert_idle_and_consistent(engine, runner)
            num_blocks = engine.statistics().cache.pool.num_blocks
            assert num_blocks > 0 and len(runner._prefix.store) == num_blocks
            assert await engine.clear_prefix_cache() == num_blocks
            stats = engine.statistics().cache
            assert stats.pool.num_blocks == 0 and stats.pool.bytes_used == 0
            assert await eventually(lambda: len(runner._prefix.store) == 0)
            misses = stats.num_misses
            again = await run_one(engine, prompt)
            assert engine.statistics().cache.num_misses == misses + 1
            await assert_idle_and_consistent(engine, runner)
            assert await engine.clear_prefix_cache() > 0
            assert await engine.clear_prefix_cache() == 0  # nothing left to drop

            # blocks a running request leases survive a clear; the request is unaffected
            long_params = attrs.evolve(GREEDY, max_tokens=48)
            reference = await run_one(engine, convo(5, 1), long_params)
            await run_one(engine, convo(6, 2))  # unleased blocks for the clear to drop
            await settle(engine)
            held_prompt = convo(5, 1)
            async with engine.open_request(held_prompt, long_params, request_id="held") as stream:
                tokens = list((await stream.__anext__()).token_ids)  # running: its blocks are leased
                blocks = engine.prefix_blocks()
                held = {block.block_id for block in blocks if block.ref_count}  # the only request running
                other_blocks = {block.block_id for block in blocks} - held  # every unleased one, the other's too
                assert held and other_blocks
                dropped = await engine.clear_prefix_cache()
                kept = {block.block_id for block in engine.prefix_blocks()}
                assert held <= kept and not (other_blocks & kept)
                async for delta in stream:
                    tokens.extend(delta.token_ids)
                held_cached = stream.usage.cached_tokens
            await assert_idle_and_consistent(engine, runner)
    assert again.tokens == first.tokens and again.cached_tokens == 0
    assert tokens == reference.tokens and held_cached > 0
    assert dropped >= len(other_blocks)
