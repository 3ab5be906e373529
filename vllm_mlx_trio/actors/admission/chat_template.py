"""Chat templating and tokenizing, as admission (and count_tokens) do it: a request's turns,
tools and template options through the tokenizer's chat template, with the template's and
tokenizer's own errors mapped to a 400 naming what could not be processed."""

from __future__ import annotations

import json
from typing import Any, Protocol

import attrs

from ...core.billing_header import SYSTEM_ROLES, stable_billing_header
from ...core.params import SamplingParams
from ...errors import InvalidRequestError
from ...messages import ChatMessage, ChatPrompt, TextPart
from ...output_format import chat_template_text
from ...prompting.system_turns import developer_as_system, merged_system_turns
from ...prompting.tool_prompt import template_takes_tools, tools_in_system_prompt

Prompt = str | ChatPrompt

#: ``apply_chat_template`` arguments a request's template kwargs may not set: admission sets them.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "tokenize",
        "add_generation_prompt",
        "return_dict",
        "continue_final_message",
        "chat_template",
    }
)


class Tokenizer(Protocol):
    """What admission and detokenization need from a tokenizer (mlx-lm's TokenizerWrapper)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str: ...

    def apply_chat_template(self, messages: list[dict], **kwargs: Any) -> Any: ...


@attrs.frozen(slots=True, kw_only=True)
class ChatTemplateOptions:
    """How a chat prompt is rendered (vLLM's ``add_generation_prompt``/``continue_final_message``)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False

    @classmethod
    def of(cls, params: SamplingParams) -> ChatTemplateOptions:
        return cls(
            add_generation_prompt=params.add_generation_prompt,
            continue_final_message=params.continue_final_message,
        )

    def kwargs(self) -> dict[str, bool]:
        """apply_chat_template's keywords (``continue_final_message`` only when set: older
        tokenizers do not take it)."""
        if self.continue_final_message:
            return {"add_generation_prompt": False, "continue_final_message": True}
        return {"add_generation_prompt": self.add_generation_prompt}


def tokenize_prompt(tokenizer: Tokenizer, prompt: Prompt, template: ChatTemplateOptions | None = None) -> list[int]:
    """Apply the chat template (for chat turns) and tokenize; errors become 400s."""
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequestError("The prompt must not be empty.", param="prompt")
        return call_tokenizer(lambda: tokenizer.encode(prompt), "prompt")
    text = render_prompt(tokenizer, prompt, template)
    return call_tokenizer(lambda: tokenizer.encode(text, add_special_tokens=False), "messages")


def render_prompt(tokenizer: Tokenizer, prompt: ChatPrompt, template: ChatTemplateOptions | None = None) -> str:
    """The chat template applied to the turns (media parts as ``{"type": "image"}`` placeholders),
    a billing header at the start of the system turn made the same on every request
    (core/billing_header.py); tools written into the system turn where the template cannot
    render them (prompting/tool_prompt.py); developer turns as system ones where the template does not know
    the role, and the system turns merged into one at the front where the template refuses
    them as sent (prompting/system_turns.py)."""
    prompt = as_prompt(prompt)
    if not prompt:
        raise InvalidRequestError("messages must not be empty.", param="messages")
    source = chat_template_text(tokenizer)
    if prompt.tools and source is not None and not template_takes_tools(source):
        prompt = tools_in_system_prompt(prompt)
    messages = developer_as_system(prompt.messages, source)
    options = (template or ChatTemplateOptions()).kwargs()
    arguments = _template_arguments(prompt)

    def render(turns: tuple[ChatMessage, ...]) -> str:
        dicts = [_turn(m) for m in _with_stable_header(turns)]
        return tokenizer.apply_chat_template(dicts, tokenize=False, **options, **arguments)

    try:
        return render(messages)
    except Exception as exc:  # boundary: a strict template refusing the system turns as sent
        merged = merged_system_turns(messages)
        if merged is None:
            raise _template_error(exc) from exc
    return call_tokenizer(lambda: render(merged), "messages")


def has_media(prompt: str | ChatPrompt | tuple[ChatMessage, ...]) -> bool:
    """Whether a chat prompt has an image or video part."""
    return not isinstance(prompt, str) and any(message.media for message in prompt)


def as_prompt(prompt: str | ChatPrompt | tuple[ChatMessage, ...]) -> Prompt:
    """Text, or chat turns as a :class:`ChatPrompt` (bare turns: no tools, no template kwargs)."""
    if isinstance(prompt, str | ChatPrompt):
        return prompt
    return ChatPrompt(messages=prompt)


def _template_arguments(prompt: ChatPrompt) -> dict[str, Any]:
    arguments = prompt.template_arguments()
    for key, _ in prompt.template_kwargs:
        if key in RESERVED_TEMPLATE_KWARGS:
            raise InvalidRequestError(
                f"chat_template_kwargs may not set {key!r}: the server sets it.", param="chat_template_kwargs"
            )
    return arguments


def call_tokenizer(fn: Any, param: str) -> Any:
    try:
        return fn()
    except Exception as exc:  # boundary: tokenizer / Jinja errors are the request's fault
        raise _template_error(exc, param) from exc


def _template_error(exc: Exception, param: str = "messages") -> InvalidRequestError:
    return InvalidRequestError(f"Could not process {param}: {type(exc).__name__}: {exc}", param=param)


def prompt_chars(prompt: str | ChatPrompt | tuple[ChatMessage, ...]) -> int:
    """The characters the template and tokenizer work through: the turns' text, the calls
    they made, and the tools rendered with them (the cost that decides inline or a thread)."""
    if isinstance(prompt, str):
        return len(prompt)
    chars = sum(len(p.text) for m in prompt for p in m.content if isinstance(p, TextPart))
    chars += sum(len(call.arguments) + len(call.name) for m in prompt for call in m.tool_calls)
    tools = prompt.tools if isinstance(prompt, ChatPrompt) else None
    return chars + (len(json.dumps(tools)) if tools else 0)


def _with_stable_header(messages: tuple[ChatMessage, ...]) -> tuple[ChatMessage, ...]:
    """The turns, a billing header at the very start of the first one made stable when that
    turn is a system (or developer) turn; every other turn and part as given."""
    head = messages[0]
    if head.role not in SYSTEM_ROLES or not head.content or not isinstance(head.content[0], TextPart):
        return messages
    text = head.content[0].text
    stable = stable_billing_header(text)
    if stable == text:
        return messages
    return (attrs.evolve(head, content=(TextPart(text=stable), *head.content[1:])), *messages[1:])


def _turn(message: ChatMessage) -> dict[str, Any]:
    """One message as chat templates expect it: ``content`` a string when every part is text
    (as it always was), else OpenAI-style parts with ``{"type": "image"}`` placeholders;
    ``name``, ``tool_calls``, ``tool_call_id`` and ``reasoning_content`` only when set."""
    text = message.text
    content: Any = text
    if text is None:
        content = [
            {"type": "text", "text": p.text} if isinstance(p, TextPart) else {"type": p.kind.removesuffix("_url")}
            for p in message.content
        ]
    turn = {"role": message.role, "content": content}
    if message.name is not None:
        turn["name"] = message.name
    if message.tool_calls:
        turn["tool_calls"] = [call.template_dict() for call in message.tool_calls]
    if message.tool_call_id is not None:
        turn["tool_call_id"] = message.tool_call_id
    if message.reasoning is not None:
        turn["reasoning_content"] = message.reasoning  # the name Qwen3's and vLLM's templates read
    return turn
