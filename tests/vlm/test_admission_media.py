"""Admission's media step with a fake loader and processor (no MLX): where it runs, and what
the Admit, the scheduler's Request and the cache lookup carry."""

from __future__ import annotations

import threading

import attrs
import numpy as np
import trio

from vllm_mlx_trio.actors.admission.actor import AdmissionActor, AdmissionLimits
from vllm_mlx_trio.actors.prefix.cache_client import CacheClient
from vllm_mlx_trio.core.params import SamplingParams
from vllm_mlx_trio.core.request import Request
from vllm_mlx_trio.errors import InvalidRequestError
from vllm_mlx_trio.messages import (
    Admit,
    ChatMessage,
    ChatPrompt,
    ImagePart,
    MediaInput,
    PrefixLookup,
    PrefixMatch,
    RequestFailed,
    RequestId,
    Submit,
    TextPart,
)
from vllm_mlx_trio.testing.fake_executor import FakeTokenizer

LIMITS = AdmissionLimits(
    max_context_tokens=999,
    default_max_tokens=4,
    max_stop_sequences=4,
    vocab_size=259,
    media_kinds=frozenset({"image_url"}),
)


@attrs.frozen
class Loaded:
    where: str
    image: object
    cache_key: str


class FakeLoader:
    def __init__(self):
        self.threads: list[int] = []

    def load_prompt_media(self, prompt: ChatPrompt):
        self.threads.append(threading.get_ident())
        parts = [part for message in prompt for _, part in message.media]
        if any(part.content_hash == "bad" for part in parts):
            raise InvalidRequestError("messages[0].content[1]: not an image.", param="messages[0].content[1]")
        return tuple(Loaded("messages[0].content[1]", None, f"key-{part.content_hash}") for part in parts)


class FakeProcessor:
    """Each image becomes 3 tokens starting where the text's token count puts them."""

    def expand(self, text, loaded):
        return text + "|" * 3 * len(loaded), [("image", np.zeros((12, 4)), (1, 2, 6)) for _ in loaded]

    def media_inputs(self, token_ids, items, loaded):
        start = len(token_ids) - 3 * len(loaded)
        return tuple(
            MediaInput(kind=k, start=start + 3 * i, num_tokens=3, pixels=p, grid_thw=g, cache_key=item.cache_key)
            for i, ((k, p, g), item) in enumerate(zip(items, loaded, strict=True))
        )


def image_prompt(content_hash: str = "h1") -> ChatPrompt:
    image = ImagePart(ref="data:image/png;base64,AAAA", content_hash=content_hash)
    return ChatPrompt(messages=(ChatMessage(role="user", content=(TextPart(text="look: "), image)),))


async def admit_one(prompt: ChatPrompt, loader: FakeLoader, params: SamplingParams):
    submit_send, submit_recv = trio.open_memory_channel(4)
    admit_send, admit_recv = trio.open_memory_channel(4)
    out_send, out_recv = trio.open_memory_channel(4)
    actor = AdmissionActor(
        submit_recv=submit_recv,
        admit_send=admit_send,
        tokenizer=FakeTokenizer(),
        limits=LIMITS,
        preprocess_threads=1,
        media_loader=loader,
        media_processor=FakeProcessor(),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.run)
        with submit_send:
            await submit_send.send(
                Submit(request_id=RequestId("img"), prompt=prompt, params=params, outbox=out_send, arrival_time=0.0)
            )
        admits = [admit async for admit in admit_recv]
    outputs = []
    while True:
        try:
            outputs.append(out_recv.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return admits, outputs


async def test_media_is_loaded_in_a_thread_and_travels_with_its_keys():
    loader = FakeLoader()
    with trio.fail_after(10):
        [admit], _ = await admit_one(image_prompt(), loader, SamplingParams(cache_salt="s"))
    assert loader.threads and loader.threads[0] != threading.get_ident()  # never the event loop
    assert isinstance(admit, Admit)
    [item] = admit.media
    assert admit.media_keys == ((item.start, "key-h1"),) and item.start == len(admit.prompt_token_ids) - 3
    # the media key goes by position (the prefix cache's block hashing), not into the whole prompt's keys
    assert admit.extra_keys == ()
    request = Request(admit, eos_token_ids=(1,))
    assert request.cache_keys == (("cache_salt", "s"),) and request.media == admit.media
    cache_send, cache_recv = trio.open_memory_channel(1)
    match_send, match_recv = trio.open_memory_channel(1)
    match_send.send_nowait(PrefixMatch(request_id=admit.request_id, num_cached_tokens=0, block_ids=()))
    with trio.fail_after(10):
        await CacheClient(cache_send, match_recv).lookup(request)
    lookup = cache_recv.receive_nowait()
    assert isinstance(lookup, PrefixLookup) and lookup.media_keys == admit.media_keys


async def test_a_bad_image_is_a_400_naming_the_part():
    with trio.fail_after(10):
        admits, outputs = await admit_one(image_prompt("bad"), FakeLoader(), SamplingParams())
    assert admits == []
    [failed] = outputs
    assert isinstance(failed, RequestFailed) and failed.error.param == "messages[0].content[1]"
