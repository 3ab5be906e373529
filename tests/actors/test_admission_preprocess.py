"""Admission's preprocessing threads: off the event loop, in order with one thread, a short
prompt overtaking a long one with two, no outbox left open by a client that leaves, media
refused by a text-only model and their hashes carried as prefix-cache keys."""

from __future__ import annotations

import threading

import pytest
import trio

from vllm_mlx_trio.actors.admission.actor import PREPROCESS_INLINE_CHARS, AdmissionActor, AdmissionLimits
from vllm_mlx_trio.core.params import SamplingParams
from vllm_mlx_trio.errors import InvalidRequestError
from vllm_mlx_trio.messages import (
    Accepted,
    ChatMessage,
    ImagePart,
    RequestFailed,
    RequestId,
    Submit,
    TextPart,
)
from vllm_mlx_trio.testing.fake_executor import FakeTokenizer
from vllm_mlx_trio.testing.harness import open_fake_engine

LIMITS = AdmissionLimits(max_context_tokens=100_000, default_max_tokens=4, max_stop_sequences=4, vocab_size=259)
LONG = "L" * PREPROCESS_INLINE_CHARS  # preprocessed in a thread
SHORT = "S" * PREPROCESS_INLINE_CHARS


class GatedTokenizer(FakeTokenizer):
    """Encoding a prompt that starts with "L" waits for ``release`` (in its thread); records
    which thread encoded what. Copies share the gate (deepcopy keeps them by ``__deepcopy__``)."""

    def __init__(self):
        self.release = threading.Event()
        self.started = threading.Event()
        self.threads: list[tuple[str, int]] = []

    def __deepcopy__(self, memo):
        return self

    def encode(self, text, add_special_tokens=True):
        self.threads.append((text[:1], threading.get_ident()))
        if text.startswith("L"):
            self.started.set()
            assert self.release.wait(10), "test never released the gate"
        return super().encode(text[:8], add_special_tokens)


class RecordingTokenizer(FakeTokenizer):
    """Keeps the turns the chat template got."""

    turns: list = []

    def apply_chat_template(self, messages, **kwargs):
        self.turns = messages
        return super().apply_chat_template(messages, **kwargs)


def submit(rid: str, prompt, outbox) -> Submit:
    return Submit(request_id=RequestId(rid), prompt=prompt, params=SamplingParams(), outbox=outbox, arrival_time=0.0)


async def wait_thread_event(event: threading.Event) -> None:
    await trio.to_thread.run_sync(event.wait, 10)


async def run_actor(nursery, tokenizer, threads: int, limits=LIMITS):
    submit_send, submit_recv = trio.open_memory_channel(8)
    admit_send, admit_recv = trio.open_memory_channel(8)
    actor = AdmissionActor(
        submit_recv=submit_recv, admit_send=admit_send, tokenizer=tokenizer, limits=limits, preprocess_threads=threads
    )
    await nursery.start(actor.run)
    return submit_send, admit_recv


@pytest.mark.parametrize(
    ("threads", "short", "order"),
    [
        (1, SHORT, ["long", "short"]),
        (1, "hi", ["long", "short"]),
        (2, SHORT, ["short", "long"]),
        (2, "hi", ["short", "long"]),
    ],
    ids=["1-thread", "1-thread-inline-short", "2-threads", "2-threads-inline-short"],
)
async def test_order_into_the_scheduler(threads, short, order):
    tokenizer = GatedTokenizer()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            submits, admits = await run_actor(nursery, tokenizer, threads)
            outboxes = [trio.open_memory_channel(4) for _ in range(2)]
            await submits.send(submit("long", LONG, outboxes[0][0]))
            await wait_thread_event(tokenizer.started)
            await submits.send(submit("short", short, outboxes[1][0]))
            if threads == 2:  # the short one is admitted while the long one is still tokenizing
                first = await admits.receive()
                assert first.request_id == "short" and not tokenizer.release.is_set()
                tokenizer.release.set()
                got = [first.request_id, (await admits.receive()).request_id]
            else:
                tokenizer.release.set()
                got = [(await admits.receive()).request_id, (await admits.receive()).request_id]
            submits.close()
    assert got == order
    on_the_loop = [text for text, ident in tokenizer.threads if ident == threading.get_ident()]
    assert on_the_loop == (["h"] if short == "hi" else [])  # a long prompt never is


async def test_threads_zero_preprocesses_inline():
    tokenizer = GatedTokenizer()
    tokenizer.release.set()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            submits, admits = await run_actor(nursery, tokenizer, 0)
            send, _recv = trio.open_memory_channel(4)
            await submits.send(submit("long", LONG, send))
            assert (await admits.receive()).request_id == "long"
            submits.close()
    assert [ident for _, ident in tokenizer.threads] == [threading.get_ident()]


async def test_client_leaving_during_preprocessing_leaks_no_outbox():
    tokenizer = GatedTokenizer()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            submits, admits = await run_actor(nursery, tokenizer, 1)
            long_send, long_recv = trio.open_memory_channel(4)
            queued_send, queued_recv = trio.open_memory_channel(4)
            await submits.send(submit("long", LONG, long_send))
            await wait_thread_event(tokenizer.started)
            await submits.send(submit("queued", LONG.replace("L", "Q"), queued_send))
            long_recv.close()  # both clients leave: one while tokenized, one while waiting
            queued_recv.close()
            tokenizer.release.set()
            submits.close()
    with pytest.raises(trio.EndOfChannel):
        admits.receive_nowait()  # nothing reached the scheduler
    for outbox in (long_send, queued_send):
        with pytest.raises(trio.ClosedResourceError):
            outbox.send_nowait(Accepted(num_prompt_tokens=1, max_tokens=1))  # closed by admission
    assert [text for text, _ in tokenizer.threads] == ["L"]  # the queued one was never tokenized


def image_prompt() -> tuple[ChatMessage, ...]:
    image = ImagePart(ref="data:image/png;base64,AAAA", content_hash="h1")
    return (ChatMessage(role="user", content=(TextPart(text="look: "), image)),)


async def test_a_text_only_model_refuses_media_with_the_part_path():
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            submits, _admits = await run_actor(nursery, FakeTokenizer(), 1)
            send, recv = trio.open_memory_channel(4)
            await submits.send(submit("img", image_prompt(), send))
            reply = await recv.receive()
            submits.close()
    assert isinstance(reply, RequestFailed) and isinstance(reply.error, InvalidRequestError)
    assert reply.error.param == "messages[0].content[1]"
    assert str(reply.error) == (
        "messages[0].content[1]: content part of type 'image_url' is not supported by this model."
    )


def attrs_evolve(submit_: Submit, **changes) -> Submit:
    import attrs

    return attrs.evolve(submit_, **changes)


def test_library_messages_with_a_string_are_one_text_part():
    message = ChatMessage(role="user", content="hi")
    assert message.content == (TextPart(text="hi"),) and message.text == "hi"
    parts = ChatMessage(role="user", content=[{"type": "text", "text": "a"}, TextPart(text="b")])
    assert parts.content == (TextPart(text="a"), TextPart(text="b")) and parts.text == "ab"
    with pytest.raises(TypeError):
        ChatMessage(role="user", content=[{"type": "image_url", "image_url": {"url": "x"}}])
    assert ChatMessage(role="user", content=image_prompt()[0].content).text is None


async def test_engine_slot_comes_back_when_the_client_leaves_during_preprocessing(monkeypatch):
    release, started = threading.Event(), threading.Event()
    encode = FakeTokenizer.encode

    def gated(self, text, add_special_tokens=True):
        if text.count("L") >= PREPROCESS_INLINE_CHARS:
            started.set()
            assert release.wait(10), "test never released the gate"
        return encode(self, text[:16], add_special_tokens)

    monkeypatch.setattr(FakeTokenizer, "encode", gated)  # the admission's copies too
    with trio.fail_after(20):
        async with open_fake_engine(step_s=0.001) as fake:
            engine = fake.engine
            async with trio.open_nursery() as nursery:
                nursery.start_soon(engine.submit, LONG)
                await wait_thread_event(started)
                assert engine.num_requests == 1
                nursery.cancel_scope.cancel()  # the client leaves while its prompt is tokenized
            assert engine.num_requests == 0  # its slot is back at once
            release.set()
            text = "".join([d.text async for d in engine.generate("hi", SamplingParams(max_tokens=2))])
            stats = engine.statistics()
    assert len(text) == 2  # served after the long one was dropped (one thread: in order)
    assert (stats.num_requests, stats.scheduler.num_finished, stats.scheduler.num_aborted) == (0, 1, 0)
