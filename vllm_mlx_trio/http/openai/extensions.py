"""vLLM's request extension fields: the ones that mean something here are honoured, a documented
few that mean nothing here are accepted and ignored, and the rest stay a 400.

vLLM's OpenAI server takes fields beyond OpenAI's (``include_stop_str_in_output``,
``skip_special_tokens``, ``priority``...), and routers in front of it add them on their own
(vllm-router adds SGLang's ``no_stop_trim`` to every body). :func:`split` takes these fields out
of a body before :mod:`.requests` checks the OpenAI shape, and :func:`apply` folds them into the
parsed request. ``server.unknown_fields = "ignore"`` also drops any other field the route does
not know (with one DEBUG line each), for clients that send their own extras.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import attrs
import msgspec

from ...errors import InvalidRequestError
from .responses import ResponseBuilder
from .schema_errors import bad, explain, is_off_value

logger = logging.getLogger(__name__)

UnknownFields = Literal["reject", "ignore"]
UNKNOWN_FIELDS_POLICIES: tuple[str, ...] = ("reject", "ignore")


class VllmExtensions(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The extension fields honoured here, as sent (None: absent or null)."""

    include_stop_str_in_output: bool | None = None
    #: SGLang's name for ``include_stop_str_in_output`` (vllm-router sends it).
    no_stop_trim: bool | None = None
    skip_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    #: Chat only: the last (assistant) message's content opens the answer (vLLM's chat ``echo``).
    echo: bool | None = None
    priority: int | None = None
    request_id: str | None = None
    return_tokens_as_token_ids: bool | None = None
    #: Chat only (vLLM): false leaves the reasoning out of the reply (it is still generated and counted).
    include_reasoning: bool | None = None
    #: Chat only (SGLang): false keeps the reasoning in ``content``, unsplit.
    separate_reasoning: bool | None = None
    #: Chat only (SGLang): false sends the reasoning in one delta when it ends, not as it is generated.
    stream_reasoning: bool | None = None


#: The reasoning options: honoured on chat, accepted and ignored on completions (nothing is
#: split out of a completion's text; vllm-router sends them with every body).
_REASONING_OPTIONS = frozenset({"include_reasoning", "separate_reasoning", "stream_reasoning"})
#: Honoured on both routes; chat's ``echo``, template options and reasoning options on chat only.
_CHAT_ONLY = frozenset({"echo", "add_generation_prompt", "continue_final_message", *_REASONING_OPTIONS})
HONOURED = frozenset(VllmExtensions.__struct_fields__)

#: Accepted and ignored (one DEBUG line), with the reason: they have no meaning on this server.
IGNORED: dict[str, str] = {
    "spaces_between_special_tokens": "fast tokenizers (every mlx-lm model's) join special tokens as they are",
    "length_penalty": "only weighs beam search, which this server does not run",
    "kv_transfer_params": "no disaggregated prefill/decode here",
}

#: Accepted only at these values (what vLLM does by default); any other value is a 400.
OFF_ONLY: dict[str, tuple] = {
    "use_beam_search": (None, False),
    "truncate_prompt_tokens": (None,),
    "prompt_logprobs": (None,),
    "allowed_token_ids": (None,),
    "bad_words": (None, []),
    "return_token_ids": (None, False),
    "return_hidden_states": (None, False),
    "add_special_tokens": (None,),
    "logits_processors": (None, []),
    "vllm_xargs": (None, {}),
    "mm_processor_kwargs": (None, {}),
}


@attrs.frozen(kw_only=True)
class Extensions:
    """What the honoured fields ask of one request, settled."""

    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    echo: bool = False
    priority: int = 0
    request_id: str | None = None
    return_tokens_as_token_ids: bool = False
    include_reasoning: bool = True
    separate_reasoning: bool = True
    stream_reasoning: bool = True

    def params(self) -> dict[str, Any]:
        """The SamplingParams fields these set."""
        return {
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "skip_special_tokens": self.skip_special_tokens,
            "add_generation_prompt": self.add_generation_prompt,
            "continue_final_message": self.continue_final_message,
            "priority": self.priority,
        }


def split(
    body: Any, known: frozenset[str], *, chat: bool, unknown_fields: UnknownFields = "reject"
) -> tuple[Any, Extensions]:
    """``body`` without the extension fields (and, with ``"ignore"``, without unknown ones), and
    the extensions it asked for. A body that is not an object is left for the parser to refuse."""
    if not isinstance(body, dict):
        return body, Extensions()
    honoured = HONOURED if chat else HONOURED - _CHAT_ONLY
    taken: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for name, value in body.items():
        if name in honoured:
            taken[name] = value
        elif name in IGNORED:
            logger.debug("ignoring %s: %s", name, IGNORED[name])
        elif name in _REASONING_OPTIONS and not chat:
            logger.debug("ignoring %s: a completion's text has no reasoning split out", name)
        elif name in OFF_ONLY and name not in known:
            if not is_off_value(value, OFF_ONLY[name]):
                raise bad(f"{name} is not supported by this server.", name, "unsupported_parameter")
        elif name not in known and unknown_fields == "ignore":
            logger.debug("ignoring unknown request field %s (server.unknown_fields = ignore)", name)
        else:
            rest[name] = value
    return rest, _settle(_decode(taken))


def _decode(taken: dict[str, Any]) -> VllmExtensions:
    """The honoured fields, typed; a wrong type is a 400 worded like the OpenAI fields' ones."""
    try:
        return msgspec.convert(taken, VllmExtensions)
    except msgspec.ValidationError as exc:
        raise explain(str(exc), taken, VllmExtensions) from None


def _settle(ext: VllmExtensions) -> Extensions:
    """The honoured fields' values, defaults filled in and contradictions refused."""
    if ext.request_id is not None and not 1 <= len(ext.request_id) <= MAX_REQUEST_ID_CHARS:
        raise bad(f"request_id must be 1 to {MAX_REQUEST_ID_CHARS} characters.", "request_id")
    continue_final = bool(ext.continue_final_message)
    add_generation = (not continue_final) if ext.add_generation_prompt is None else ext.add_generation_prompt
    if continue_final and add_generation:
        raise InvalidRequestError(
            "add_generation_prompt and continue_final_message cannot both be true.", param="continue_final_message"
        )
    return Extensions(
        include_stop_str_in_output=bool(ext.include_stop_str_in_output or ext.no_stop_trim),
        skip_special_tokens=True if ext.skip_special_tokens is None else ext.skip_special_tokens,
        add_generation_prompt=add_generation,
        continue_final_message=continue_final,
        echo=bool(ext.echo),
        priority=0 if ext.priority is None else ext.priority,
        request_id=ext.request_id,
        return_tokens_as_token_ids=bool(ext.return_tokens_as_token_ids),
        include_reasoning=ext.include_reasoning is not False,
        separate_reasoning=ext.separate_reasoning is not False,
        stream_reasoning=ext.stream_reasoning is not False,
    )


#: Longest ``request_id`` accepted (it becomes the response's id).
MAX_REQUEST_ID_CHARS = 128


def echo_text(prompt: Any, ext: Extensions) -> str:
    """Chat ``echo``: the last message's text when it is the assistant's (vLLM's rule), else ""."""
    if not ext.echo or isinstance(prompt, str) or not prompt or prompt[-1].role != "assistant":
        return ""
    return prompt[-1].text or ""


class TokenIdSpeller:
    """``return_tokens_as_token_ids``: logprobs spell each token ``token_id:<id>`` (vLLM's form),
    so a client can tell tokens apart whose text is not valid UTF-8 on its own."""

    def decode(self, token_ids: list[int]) -> str:
        return "".join(f"token_id:{token_id}" for token_id in token_ids)


def extended_builder(parsed: Any, *, chat: bool, model: str, tokenizer: Any) -> ResponseBuilder:
    """The route's ResponseBuilder, with what the extensions change: the response id
    (``request_id``), the tokens' spelling in logprobs, the chat ``echo``."""
    ext: Extensions = parsed.extensions
    speller = TokenIdSpeller() if ext.return_tokens_as_token_ids else tokenizer
    builder = ResponseBuilder(chat=chat, model=model, logprobs=parsed.params.logprobs is not None, tokenizer=speller)
    if ext.request_id is not None:
        builder.id = f"{'chatcmpl' if chat else 'cmpl'}-{ext.request_id}"
    if chat:
        builder.echo = echo_text(parsed.prompt, ext)
    return builder
