"""What the MTP tests of every layout share: runners built from a config, one sequence driven alone through a
runner, the speculative counts of a run, a chat through the engine, the hidden-state modes the verify forward saw,
and plain greedy decoding for reference."""

from __future__ import annotations

from vllm_mlx_trio.messages import NewSequence, RequestId

from .conftest import PlanDriver, spec_config


def build_runner(cfg):
    from vllm_mlx_trio.worker.registry import runner_for

    runner = runner_for(cfg)(cfg)
    runner.load()
    return runner


def mtp_config(path: str, *overrides: str):
    return spec_config(path, None, "speculative.method=mtp", "speculative.num_draft_tokens=3", *overrides)


def plain_and_mtp_runners(model_dir: str):
    """The fixture body: a plain runner and an MTP one over ``model_dir``, closed after."""
    made = [build_runner(spec_config(model_dir, None)), build_runner(mtp_config(model_dir))]
    yield made
    for runner in made:
        runner.close()


def alone(runner, prompt, params, output: tuple[int, ...] = ()) -> tuple[list[int], PlanDriver]:
    """One sequence through ``runner`` until done (``output``: tokens it had produced before, as after a
    preemption): its output tokens and the driver."""
    driver = PlanDriver(runner)
    seq = NewSequence(
        request_id=RequestId("a"), prompt_token_ids=(*prompt, *output), params=params, num_output_tokens=len(output)
    )
    driver.step(new=[seq])
    driver.run_until_done()
    return driver.outputs["a"], driver


def spec_counts(driver) -> tuple[int, int]:
    """(drafts proposed, drafts accepted) over the driver's results."""
    counts = [r.spec_decode for r in driver.results if r.spec_decode is not None]
    return sum(c.num_draft_tokens for c in counts), sum(c.num_accepted_tokens for c in counts)


async def generate(engine, chat, params) -> tuple[str, list[int], str | None]:
    """(text, tokens, finish reason) of one chat through the engine."""
    text, tokens, reason = "", [], None
    async for delta in engine.generate(chat, params):
        text += delta.text
        tokens.extend(delta.token_ids)
        reason = delta.finish_reason or reason
    return text, tokens, reason


def recorded_modes(monkeypatch) -> list[str]:
    """The hidden-state mode of every verify forward from now on (``spec_hidden.target_forward`` spied)."""
    import vllm_mlx_trio.worker.speculative.hidden as spec_hidden

    modes: list[str] = []
    real = spec_hidden.target_forward

    def recording(model, inputs, cache, *, mode):
        modes.append(mode)
        return real(model, inputs, cache, mode=mode)

    monkeypatch.setattr(spec_hidden, "target_forward", recording)
    return modes


def plain_greedy(model, prompt: list[int], n: int) -> list[int]:
    """``n`` greedy tokens after ``prompt``, one forward a token."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt]), cache=cache)
    out = []
    for _ in range(n):
        out.append(int(mx.argmax(logits[0, -1])))
        logits = model(mx.array([[out[-1]]]), cache=cache)
    return out


def speculative_greedy(model, drafter, prompt: list[int], n: int, k: int) -> tuple[list[int], int, int]:
    """(tokens, drafts proposed, drafts accepted): the runner's round written out (worker/speculative/drafter.py's
    docstring), rejected drafts dropped by the cache transaction where the cache cannot be trimmed, else trimmed."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

    from vllm_mlx_trio.worker.speculative.cache_txn import needs_transaction, open_transaction
    from vllm_mlx_trio.worker.speculative.hidden import target_forward

    cache, mode = make_prompt_cache(model), drafter.hidden_state_mode
    logits, hidden = target_forward(model, mx.array([prompt]), cache, mode=mode)
    last = int(mx.argmax(logits[0, -1]))
    drafter.start(prompt, hidden)
    out, proposed, accepted_total = [last], 0, 0
    while len(out) < n:
        drafts = drafter.propose(last, k)
        verified = [last, *drafts]
        txn = open_transaction(model, cache, verified) if needs_transaction(cache) else None
        logits, hidden = target_forward(model, mx.array([verified]), cache, mode=mode)
        targets = mx.argmax(logits[0], axis=-1).tolist()
        j = 0
        while j < len(drafts) and drafts[j] == targets[j]:
            j += 1
        if txn is not None:
            txn.keep(j + 1)
        else:
            trim_prompt_cache(cache, len(drafts) - j)
        accepted = [*drafts[:j], targets[j]]
        drafter.settle(accepted, hidden[:, : j + 1])
        proposed, accepted_total = proposed + len(drafts), accepted_total + j
        out.extend(accepted)
        last = accepted[-1]
    drafter.stop()
    return out[:n], proposed, accepted_total
