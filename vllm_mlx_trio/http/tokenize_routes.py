"""vLLM's ``POST /tokenize`` and ``POST /detokenize``: the served model's tokenizer over HTTP.

``/tokenize`` takes a ``prompt`` (tokenized as ``/v1/completions`` would, special tokens added
unless ``add_special_tokens`` is false) or chat ``messages`` (rendered by the chat template with
the chat route's options, then tokenized without special tokens unless asked: the token ids
``/v1/chat/completions`` would prefill). It answers ``{"count", "max_model_len", "tokens",
"token_strs"}``; ``token_strs`` (each token's vocabulary string) only with ``return_token_strs``.
``/detokenize`` takes ``tokens`` and answers ``{"prompt"}``, the text they decode to.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import msgspec
import quart

from ..actors.admission.chat_template import (
    ChatTemplateOptions,
    Tokenizer,
    call_tokenizer,
    has_media,
    prompt_chars,
    render_prompt,
)
from ..engine import Engine
from ..errors import InvalidRequestError
from ..messages import ChatPrompt
from .body import read_json_body
from .model_names import ServedNames
from .openai.requests import parse_chat
from .openai.schema_errors import bad, explain
from .tokenizer_access import TokenizerAccess


class TokenizeBody(msgspec.Struct, forbid_unknown_fields=True):
    """vLLM's TokenizeCompletionRequest and TokenizeChatRequest in one: ``prompt`` or ``messages``."""

    model: str | None = None
    prompt: str | None = None
    messages: list[Any] | None = None
    add_special_tokens: bool | None = None
    return_token_strs: bool | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    tools: list[Any] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeBody(msgspec.Struct, forbid_unknown_fields=True):
    model: str | None = None
    tokens: list[int] = msgspec.field(default_factory=list)


#: The chat-only fields passed on to the chat route's parser as they came.
_CHAT_FIELDS = ("tools", "chat_template_kwargs", "add_generation_prompt", "continue_final_message")


def register_tokenize_routes(app: quart.Quart, engine: Engine) -> None:
    access = TokenizerAccess(engine.model_info.tokenizer)

    @app.post("/tokenize")
    async def tokenize():
        raw = await read_json_body()
        body = decode(raw, TokenizeBody)
        check_model(body.model, engine)
        if (body.prompt is None) == (body.messages is None):
            raise InvalidRequestError("Exactly one of prompt or messages must be given.", param="prompt")
        if body.prompt is not None:
            work = partial(_encode, text=body.prompt, special=_flag(body.add_special_tokens, True), param="prompt")
            chars = len(body.prompt)
        else:
            prompt, options = _chat_prompt(raw, body, engine)
            work = partial(_encode_chat, prompt=prompt, options=options, special=_flag(body.add_special_tokens, False))
            chars = prompt_chars(prompt)
        tokens, strs = await access.run(partial(_with_strs, work=work, strs=bool(body.return_token_strs)), chars)
        return {
            "count": len(tokens),
            "max_model_len": engine.model_info.max_context_tokens,
            "tokens": tokens,
            "token_strs": strs,
        }

    @app.post("/detokenize")
    async def detokenize():
        body = decode(await read_json_body(), DetokenizeBody)
        check_model(body.model, engine)
        vocab = engine.model_info.vocab_size
        for i, token in enumerate(body.tokens):
            if not 0 <= token < vocab:
                raise bad(f"Token id {token} is out of vocabulary (0..{vocab - 1}).", f"tokens[{i}]")
        decode_all = partial(_decode, tokens=body.tokens)
        return {"prompt": await access.run(decode_all, len(body.tokens) * 4)}


def decode(raw: Any, schema: type[msgspec.Struct]) -> Any:
    """``raw`` as ``schema``; an unknown field or a wrong type is a 400 naming the field."""
    if not isinstance(raw, dict):
        raise InvalidRequestError("The request body must be a JSON object.")
    for name in raw:
        if name not in schema.__struct_fields__:
            raise bad(f"Unrecognized request argument supplied: {name}", name, "unknown_parameter")
    try:
        return msgspec.convert(raw, schema)
    except msgspec.ValidationError as exc:
        raise explain(str(exc), raw, schema) from None


def check_model(model: str | None, engine: Engine) -> None:
    """``model`` is optional on these routes (as in vLLM); when given it must be the served one."""
    if model is not None:
        ServedNames.from_config(engine.cfg).resolve(model)


def _chat_prompt(raw: dict, body: TokenizeBody, engine: Engine) -> tuple[ChatPrompt, ChatTemplateOptions]:
    """The messages as the chat route reads them, with its template options."""
    if body.chat_template is not None:
        raise InvalidRequestError(
            "chat_template is not accepted in a request: this server renders with its model's "
            "template (model.chat_template).",
            param="chat_template",
        )
    chat = {"model": engine.cfg.model_name, "messages": raw["messages"]}
    chat.update({name: raw[name] for name in _CHAT_FIELDS if raw.get(name) is not None})
    names = ServedNames.from_config(engine.cfg)
    parsed = parse_chat(chat, model_names=names, max_n=1, tool_parser=engine.output_format.tool_parser)
    if has_media(parsed.prompt):
        raise InvalidRequestError("/tokenize takes text messages only.", param="messages")
    ext = parsed.extensions
    options = ChatTemplateOptions(
        add_generation_prompt=ext.add_generation_prompt, continue_final_message=ext.continue_final_message
    )
    assert isinstance(parsed.prompt, ChatPrompt)
    return parsed.prompt, options


def _flag(value: bool | None, default: bool) -> bool:
    return default if value is None else value


def _encode(tokenizer: Tokenizer, *, text: str, special: bool, param: str) -> list[int]:
    return list(call_tokenizer(lambda: tokenizer.encode(text, add_special_tokens=special), param))


def _encode_chat(tokenizer: Tokenizer, *, prompt: ChatPrompt, options: ChatTemplateOptions, special: bool) -> list[int]:
    text = render_prompt(tokenizer, prompt, options)
    return _encode(tokenizer, text=text, special=special, param="messages")


def _with_strs(tokenizer: Tokenizer, *, work: Any, strs: bool) -> tuple[list[int], list[str] | None]:
    tokens = work(tokenizer)
    return tokens, (token_strings(tokenizer, tokens) if strs else None)


def token_strings(tokenizer: Any, tokens: list[int]) -> list[str]:
    """Each token's string in the vocabulary (Hugging Face's ``convert_ids_to_tokens``, as vLLM
    returns it), or its decoded text where the tokenizer has no vocabulary strings."""
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    if convert is not None:
        return list(convert(tokens))
    return [tokenizer.decode([token]) for token in tokens]


def _decode(tokenizer: Tokenizer, *, tokens: list[int]) -> str:
    return call_tokenizer(lambda: tokenizer.decode(tokens), "tokens")
