"""System and developer turns reach strict chat templates in a form they take."""

from __future__ import annotations

import jinja2
import pytest

from vllm_mlx_trio.actors.admission.chat_template import render_prompt
from vllm_mlx_trio.errors import InvalidRequestError
from vllm_mlx_trio.messages import ChatMessage, ChatPrompt, ImagePart
from vllm_mlx_trio.prompting.system_turns import developer_as_system, merged_system_turns

#: Qwen3.5-style: a system turn anywhere but first is an error; unknown roles are left out.
STRICT = (
    "{% for m in messages %}"
    "{% if m.role == 'system' and not loop.first %}{{ raise_exception('System message must be at the beginning.') }}"
    "{% elif m.role in ('system', 'user', 'assistant') %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endif %}"
    "{% endfor %}"
)
#: A template that renders every role as given, developer included (harmony-like).
OPEN = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{# developer #}"


class JinjaTokenizer:
    def __init__(self, source: str):
        self.chat_template = source
        env = jinja2.Environment()
        env.globals["raise_exception"] = self._raise
        self._template = env.from_string(source)

    @staticmethod
    def _raise(message: str):
        raise jinja2.TemplateError(message)

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **_):
        return self._template.render(messages=messages)


def turns(*pairs: tuple[str, str]) -> tuple[ChatMessage, ...]:
    return tuple(ChatMessage(role=role, content=text) for role, text in pairs)


def test_developer_turns_become_system_unless_the_template_names_the_role():
    sent = turns(("developer", "be terse"), ("user", "hi"))
    assert [m.role for m in developer_as_system(sent, STRICT)] == ["system", "user"]
    assert developer_as_system(sent, OPEN) == sent
    assert (
        render_prompt(JinjaTokenizer(STRICT), ChatPrompt(messages=sent)) == "<system>be terse</system><user>hi</user>"
    )


def test_several_system_turns_merge_to_the_front_only_when_the_template_refuses_them():
    sent = turns(("system", "core"), ("system", "AGENTS.md"), ("user", "hi"), ("system", "plugin"))
    merged = merged_system_turns(sent)
    assert merged is not None and [m.role for m in merged] == ["system", "user"]
    assert merged[0].text == "core\n\nAGENTS.md\n\nplugin"
    rendered = render_prompt(JinjaTokenizer(STRICT), ChatPrompt(messages=sent))
    assert rendered == "<system>core\n\nAGENTS.md\n\nplugin</system><user>hi</user>"
    # a template that takes them as sent sees exactly what the client sent
    assert render_prompt(JinjaTokenizer(OPEN), ChatPrompt(messages=sent)) == (
        "[system]core[system]AGENTS.md[user]hi[system]plugin"
    )


def test_nothing_to_merge_keeps_the_template_error_as_a_400():
    assert merged_system_turns(turns(("system", "one"), ("user", "hi"))) is None
    assert merged_system_turns(turns(("user", "hi"))) is None
    media = (ChatMessage(role="system", content=(ImagePart(ref="x", content_hash="h"),)), *turns(("system", "b")))
    assert merged_system_turns(media) is None
    raising = JinjaTokenizer("{{ raise_exception('no tools here') }}")
    with pytest.raises(InvalidRequestError, match="no tools here") as caught:
        render_prompt(raising, ChatPrompt(messages=turns(("system", "a"), ("system", "b"))))
    assert caught.value.param == "messages"
