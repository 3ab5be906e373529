"""Tool formats with their own tags: ``qwen3_coder``, ``glm45``, ``deepseek_v3``, ``kimi_k2``."""

from __future__ import annotations

import logging
import re
from typing import ClassVar

from .json_formats import decode_arguments, decode_json_values
from .pair_arguments import PairArguments, PairTags
from .schema_values import coerce_value, property_schema, schema_types
from .streamed_call import CallHead
from .tool_stream import ToolFormat
from .types import MarkupError, RawCall

logger = logging.getLogger(__name__)

_NAME = re.compile(r"[\w.\-:/]+")


def _check_name(name: str) -> str:
    name = name.strip()
    if not _NAME.fullmatch(name):
        raise MarkupError(f"bad tool name {name[:80]!r}")
    return name


def _ready_between(text: str, begin: str, end: str) -> int | None:
    """Length of ``begin ... end`` at the start of ``text`` (after whitespace), once the end marker came."""
    if not text.lstrip().startswith(begin):
        return None
    at = text.find(end)
    return None if at < 0 else at + len(end)


#: The ``{`` of an arguments object, seen with the character after it (a key's quote or the closing brace).
_OBJECT_AHEAD = r'(?=\{\s*["}])'


def _text_valued(tools: dict, function_name: str, key: str, *, untyped: bool) -> bool:
    """The value of parameter ``key`` is the text as written: its schema allows only strings (or, with
    ``untyped``, gives no type)."""
    types = set(schema_types(property_schema(tools.get(function_name), key)))
    return types == {"string"} or (untyped and not types)


def _one_json_object(text: str) -> dict:
    values = decode_json_values(text)
    if len(values) != 1:
        raise MarkupError(f"expected one arguments object, got {len(values)} JSON values")
    return decode_arguments(values[0])


class Qwen3CoderFormat(ToolFormat):
    """Qwen3-Coder XML, newlines between the tags:
    ``<tool_call><function=f><parameter=x>value</parameter></function></tool_call>``.

    Values are text; the tool's schema types them (no schema: the string as written). Each parameter is
    sent as a member of the arguments' JSON once its closing tag is seen.
    """

    name = "qwen3_coder"
    regions = (("<tool_call>", "</tool_call>"), ("<function=", "</function>"))
    markup = ("<tool_call>", "</tool_call>")
    orphan_ends = {"<function=": "</tool_call>"}
    streams_arguments = True
    _FUNCTION = re.compile(r"<function=([^>\n]*)>(.*?)(?:</function>|\Z)", re.DOTALL)
    _PARAMETER = re.compile(r"<parameter=([^>\n]*)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)
    _TAGS = PairTags(
        pair=re.compile(r"\s*<parameter=([^>\n]*)>(.*?)(?:</parameter>|(?=<parameter=))", re.DOTALL),
        last_pair=re.compile(r"\s*<parameter=([^>\n]*)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL),
        opening=re.compile(r"\s*<parameter=([^>\n]*)>"),
        closing="</parameter>",
        ends_before=("<parameter=",),
        newlines_are_tags=True,
    )
    #: A call's head, once a parameter (or the call's end) shows its body is tags.
    _HEADS = {
        "<tool_call>": re.compile(r"\s*<function=([^>\n]*)>(?=\s*(?:<parameter=|</function>))"),
        "<function=": re.compile(r"([^>\n]*)>(?=\s*<parameter=)"),
    }

    def call_head(self, start: str, text: str) -> CallHead | None:
        head = self._HEADS[start].match(text)
        if head is None or not _NAME.fullmatch(head.group(1).strip()):
            return None
        name = head.group(1).strip()
        reader = PairArguments(
            self._TAGS, lambda k, v: self._value(name, k, v), lambda k: _text_valued(self.tools, name, k, untyped=True)
        )
        return CallHead(
            name=name, length=head.end(), end="</function>" if start == "<tool_call>" else None, reader=reader
        )

    def _value(self, function_name: str, key: str, value: str) -> tuple[str, object]:
        """A parameter's key and its value typed by the schema (one newline either side of it is the tags')."""
        value = value[1:] if value.startswith("\n") else value
        value = value[:-1] if value.endswith("\n") else value
        key = key.strip()
        return key, coerce_value(value, property_schema(self.tools.get(function_name), key), untyped_as_json=False)

    def parse_region(self, start: str, body: str) -> list[RawCall]:
        text = body if start == "<tool_call>" else start + body
        functions = self._FUNCTION.findall(text)
        if not functions or self._FUNCTION.sub("", text).strip():
            raise MarkupError("expected <function=name>...</function>")
        return [self._call(name, params) for name, params in functions]

    def _call(self, name: str, params: str) -> RawCall:
        name = _check_name(name)
        arguments = dict(self._value(name, key, value) for key, value in self._PARAMETER.findall(params))
        if self._PARAMETER.sub("", params).strip():
            raise MarkupError("text outside <parameter=...> tags")
        return RawCall(name=name, arguments=arguments)


class Glm45Format(ToolFormat):
    """GLM 4.5/4.6/4.7: ``<tool_call>name\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>\\n</tool_call>``.

    Values are text; the schema types them, and values of untyped parameters are read as JSON when they are.
    Each pair is sent as a member of the arguments' JSON once its ``</arg_value>`` is seen.
    """

    name = "glm45"
    regions = (("<tool_call>", "</tool_call>"),)
    markup = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
    streams_arguments = True
    _PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)
    _TAGS = PairTags(
        pair=re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL),
        last_pair=re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL),
        opening=re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>", re.DOTALL),
        closing="</arg_value>",
    )
    _HEAD = re.compile(r"\s*([^\s<]+)\s*(?=<arg_key>)")

    def call_head(self, start: str, text: str) -> CallHead | None:
        head = self._HEAD.match(text)
        if head is None or not _NAME.fullmatch(head.group(1)):
            return None
        name = head.group(1)
        reader = PairArguments(
            self._TAGS, lambda k, v: self._value(name, k, v), lambda k: _text_valued(self.tools, name, k, untyped=False)
        )
        return CallHead(name=name, length=head.end(), reader=reader)

    def _value(self, function_name: str, key: str, value: str) -> tuple[str, object]:
        key = key.strip()
        return key, coerce_value(value, property_schema(self.tools.get(function_name), key), untyped_as_json=True)

    def parse_region(self, start: str, body: str) -> list[RawCall]:
        name, _, rest = body.partition("<arg_key>")
        name = _check_name(name)
        rest = "<arg_key>" + rest if rest else ""
        if self._PAIR.sub("", rest).strip():
            raise MarkupError("text outside <arg_key>/<arg_value> pairs")
        arguments = dict(self._value(name, key, value) for key, value in self._PAIR.findall(rest))
        return [RawCall(name=name, arguments=arguments)]


class _SectionFormat(ToolFormat):
    """A section of calls, each ``CALL_BEGIN ... CALL_END``; each call is sent once it ends.

    A call written without its section (the model dropped the section marker) is read too.
    """

    CALL_BEGIN: ClassVar[str]
    CALL_END: ClassVar[str]
    streams_arguments = True
    #: A call's head from after its ``CALL_BEGIN`` up to its arguments object (group ``name``, maybe ``id``).
    _HEAD: ClassVar[re.Pattern]

    def call_head(self, start: str, text: str) -> CallHead | None:
        """A call whose arguments are a JSON object streams: after its ``CALL_BEGIN`` (unless that opened the
        region), up to the object; the call ends at its ``CALL_END``."""
        lone = start == self.CALL_BEGIN
        if not lone:
            stripped = text.lstrip()
            if not stripped.startswith(self.CALL_BEGIN):
                return None
            offset = len(text) - len(stripped) + len(self.CALL_BEGIN)
        head = self._HEAD.match(text, 0 if lone else offset)
        if head is None or not _NAME.fullmatch(self._head_name(head)):
            return None
        call_id = head["id"] if "id" in head.re.groupindex else None
        end = None if lone else self.CALL_END
        return CallHead(name=self._head_name(head), length=head.end(), call_id=call_id, end=end)

    def _head_name(self, head: re.Match) -> str:
        return head["name"]

    def ready_call(self, region_text: str) -> int | None:
        return _ready_between(region_text, self.CALL_BEGIN, self.CALL_END)

    def parse_region(self, start: str, body: str) -> list[RawCall]:
        if start == self.CALL_BEGIN:  # a lone call: body is its inside
            return [call for call in (self._call(body),) if call is not None]
        parts = body.split(self.CALL_BEGIN)
        if parts[0].strip():
            if len(parts) == 1:
                raise MarkupError("no call in the section")
            logger.warning("%s tool parser: text before the first call dropped: %.200r", self.name, parts[0])
        return [call for call in map(self._call, parts[1:]) if call is not None]

    def _call(self, part: str) -> RawCall | None:
        """One call from the text after its ``CALL_BEGIN`` (up to and with its ``CALL_END``, if any)."""
        inner, found, after = part.partition(self.CALL_END)
        if found and after.strip():
            raise MarkupError("text after a call")
        return self._read_call(inner)

    def _read_call(self, inner: str) -> RawCall | None:
        """The call, or None for one the family's markup says to skip (with a WARNING)."""
        raise NotImplementedError


class DeepSeekV3Format(_SectionFormat):
    """DeepSeek V3 / R1:
    ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name\\n```json\\n{...}\\n```<｜tool▁call▁end｜>``
    ... ``<｜tool▁calls▁end｜>``; also V3.1's
    ``<｜tool▁call▁begin｜>name<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``.
    """

    name = "deepseek_v3"
    CALL_BEGIN, SEP, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
    regions = (("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"), (CALL_BEGIN, CALL_END))
    markup = (regions[0][0], CALL_BEGIN, SEP, CALL_END, regions[0][1])
    _FENCED = re.compile(r"\s*([^\s`]+)\s*```(?:json)?\s*(.*?)\s*```\s*\Z", re.DOTALL)
    _HEAD = re.compile(
        rf"\s*(?:function\s*{SEP}\s*(?P<name>[^\s`<]+)\s*```(?:json)?\s*|(?P<v31>[^\s<]+?)\s*{SEP}\s*){_OBJECT_AHEAD}"
    )

    def _head_name(self, head: re.Match) -> str:
        return head["name"] or head["v31"]

    def _read_call(self, inner: str) -> RawCall | None:
        if self.SEP not in inner:
            raise MarkupError("no tool separator in the call")
        head, rest = inner.split(self.SEP, 1)
        fenced = self._FENCED.match(rest)
        if fenced:
            return RawCall(name=_check_name(fenced.group(1)), arguments=_one_json_object(fenced.group(2)))
        return RawCall(name=_check_name(head), arguments=_one_json_object(rest))


class KimiK2Format(_SectionFormat):
    """Kimi K2: ``<|tool_calls_section_begin|><|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{...}
    <|tool_call_end|><|tool_calls_section_end|>``; the model's id (``functions.name:0``) is the call's id.

    The id may lack ``functions.`` (``name:0``) or be a bare counter (``0``): the name is then the
    request's only tool, or the one tool whose parameters hold every argument given; a call whose
    name cannot be told, or whose id is not one of these shapes, is skipped with a WARNING.
    """

    name = "kimi_k2"
    CALL_BEGIN, ARGS, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
    regions = (
        ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),
        ("<|tool_call_section_begin|>", "<|tool_call_section_end|>"),
        (CALL_BEGIN, CALL_END),
    )
    markup = (*{marker for region in regions for marker in region}, ARGS)
    reasoning_ends = tuple(start for start, _ in regions)
    _HEAD = re.compile(rf"\s*(?P<id>(?:functions\.)?(?P<name>[\w.\-]+?):\d+)\s*{re.escape(ARGS)}\s*{_OBJECT_AHEAD}")
    _ID = re.compile(r"\s*(?:((?:functions\.)?([\w.\-]+?):\d+)|(\d+))\s*\Z")

    def _read_call(self, inner: str) -> RawCall | None:
        if self.ARGS not in inner:
            raise MarkupError("no arguments marker in the call")
        head, args = inner.split(self.ARGS, 1)
        arguments = _one_json_object(args)
        match = self._ID.match(head)
        name = None if match is None else match.group(2) or self._tool_for(arguments)
        if match is None or name is None:
            logger.warning("kimi_k2 tool parser: call skipped, no tool name in its id %.80r", head.strip())
            return None
        return RawCall(name=name, arguments=arguments, id=(match.group(1) or match.group(3)))

    def _tool_for(self, arguments: dict) -> str | None:
        """The tool a bare-counter call is to: the only one, or the only one with all these parameters."""
        if len(self.tools) == 1:
            return next(iter(self.tools))
        fitting = [
            name
            for name, function in self.tools.items()
            if set(arguments) <= set((function.get("parameters") or {}).get("properties") or {})
        ]
        return fitting[0] if len(fitting) == 1 else None
