"""Responses ``tools`` of every kind Codex sends, as the function tools a chat template renders.

- ``function``: as given.
- ``custom`` (freeform input, e.g. Codex's ``apply_patch``): a function with one string
  parameter, ``input``; a grammar ``format`` is shown to the model in the description, and is
  enforced only when ``tool_choice`` forces the tool (the whole reply is then the input).
- ``namespace`` (an MCP server's tools): each child function is rendered under the flat name
  ``<namespace><name>`` (``mcp__github__`` + ``create_issue``; ``__`` is put between when the
  namespace does not end in ``_``), and its calls go back as ``{"name", "namespace"}``.
- Hosted tools (``web_search``, ``file_search``, ``image_generation`` ...): run by OpenAI's
  servers, not by a model; they are left out of the prompt (Codex sends ``web_search`` by
  default). ``tool_choice`` naming one is a 400.
- Any other ``type`` is a 400 naming ``tools[i].type``.

A :class:`ToolRoute` maps each rendered name back to the kind of item its call becomes.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Literal

import attrs

from ...errors import InvalidRequestError

logger = logging.getLogger(__name__)

#: Tools OpenAI's servers run themselves; a local model cannot, so they are not rendered.
HOSTED_TOOL_TYPES = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "file_search",
        "code_interpreter",
        "image_generation",
        "computer_use_preview",
        "local_shell",
        "tool_search",
        "mcp",
    }
)
_FUNCTION_FIELDS = frozenset({"type", "name", "description", "parameters", "strict", "defer_loading"})
_CUSTOM_FIELDS = frozenset({"type", "name", "description", "format", "defer_loading"})
_NAMESPACE_FIELDS = frozenset({"type", "name", "description", "tools"})
#: The one parameter a custom tool's freeform input travels in.
CUSTOM_INPUT = "input"


@attrs.frozen
class ToolRoute:
    """What a call of one rendered tool name is on the way out."""

    kind: Literal["function", "custom"]
    name: str
    namespace: str | None = None
    #: custom tools: ``{"type": "grammar", "syntax": "lark" | "regex", "definition"}`` or None (free text).
    grammar: dict[str, Any] | None = None


@attrs.frozen
class DeclaredTools:
    """The chat tools to render, and each rendered name's route."""

    functions: tuple[dict[str, Any], ...]
    routes: dict[str, ToolRoute]


def _bad(param: str, message: str, code: str | None = None) -> InvalidRequestError:
    return InvalidRequestError(f"{param}: {message}", param=param, code=code)


def declared_tools(tools: list[dict[str, Any]]) -> DeclaredTools:
    functions: list[dict[str, Any]] = []
    routes: dict[str, ToolRoute] = {}
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _bad(where, "each tool must be an object.")
        kind = tool.get("type")
        if kind == "namespace":
            _namespace(tool, where, functions, routes)
        elif kind in ("function", "custom"):
            _add(_one_tool(tool, where, None), where, functions, routes)
        elif kind in HOSTED_TOOL_TYPES:
            logger.debug("hosted tool %s left out of the prompt (tools[%d])", kind, i)
        else:
            raise _bad(
                f"{where}.type",
                f"tools of type {kind!r:.60} are not supported by this server.",
                "unsupported_parameter",
            )
    return DeclaredTools(functions=tuple(functions), routes=routes)


def _add(rendered: tuple[dict[str, Any], ToolRoute], where: str, functions: list, routes: dict[str, ToolRoute]) -> None:
    function, route = rendered
    name = function["function"]["name"]
    if name in routes:
        raise _bad(f"{where}.name", f"tool names must be unique; {name!r:.80} is given twice.")
    routes[name] = route
    functions.append(function)


def _namespace(tool: dict[str, Any], where: str, functions: list, routes: dict[str, ToolRoute]) -> None:
    _known_fields(tool, _NAMESPACE_FIELDS, where)
    namespace = _name(tool, where)
    children = tool.get("tools")
    if not isinstance(children, list) or not children:
        raise _bad(f"{where}.tools", "a namespace needs a non-empty array of tools.")
    for j, child in enumerate(children):
        inner = f"{where}.tools[{j}]"
        if not isinstance(child, dict) or child.get("type") not in ("function", "custom"):
            kind = child.get("type") if isinstance(child, dict) else child
            raise _bad(
                f"{inner}.type",
                f"a namespace holds function or custom tools, not {kind!r:.60}.",
                "unsupported_parameter",
            )
        _add(_one_tool(child, inner, namespace), inner, functions, routes)


def _one_tool(tool: dict[str, Any], where: str, namespace: str | None) -> tuple[dict[str, Any], ToolRoute]:
    custom = tool["type"] == "custom"
    _known_fields(tool, _CUSTOM_FIELDS if custom else _FUNCTION_FIELDS, where)
    name = _name(tool, where)
    if custom:
        grammar = _custom_format(tool.get("format"), f"{where}.format")
        parameters = _custom_parameters(grammar)
    else:
        grammar = None
        parameters = tool.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise _bad(f"{where}.parameters", "must be a JSON schema object.")
    function: dict[str, Any] = {"name": flat_name(namespace, name), "parameters": parameters}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    route = ToolRoute(kind="custom" if custom else "function", name=name, namespace=namespace, grammar=grammar)
    return {"type": "function", "function": function}, route


def flat_name(namespace: str | None, name: str) -> str:
    """The name a namespaced tool is rendered (and called) under."""
    if namespace is None:
        return name
    return f"{namespace}{name}" if namespace.endswith("_") else f"{namespace}__{name}"


def _custom_format(fmt: Any, where: str) -> dict[str, Any] | None:
    if fmt is None or fmt == {"type": "text"}:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "grammar":
        raise _bad(where, 'must be {"type": "text"} or {"type": "grammar", "syntax", "definition"}.')
    if fmt.get("syntax") not in ("lark", "regex"):
        raise _bad(f"{where}.syntax", "must be 'lark' or 'regex'.")
    if not isinstance(fmt.get("definition"), str) or not fmt["definition"]:
        raise _bad(f"{where}.definition", "must be a non-empty string.")
    return {"type": "grammar", "syntax": fmt["syntax"], "definition": fmt["definition"]}


def _custom_parameters(grammar: dict[str, Any] | None) -> dict[str, Any]:
    about = "The tool's input, as free text."
    if grammar is not None:
        about = f"The tool's input; it must follow this {grammar['syntax']} grammar:\n{grammar['definition']}"
    properties = {CUSTOM_INPUT: {"type": "string", "description": about}}
    return {"type": "object", "properties": properties, "required": [CUSTOM_INPUT]}


def custom_input(arguments: str) -> str:
    """A custom tool call's input from the arguments the model wrote (``{"input": ...}``; any
    other text is taken as the input itself)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get(CUSTOM_INPUT), str):
        return value[CUSTOM_INPUT]
    return arguments


def _name(tool: dict[str, Any], where: str) -> str:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise _bad(f"{where}.name", "must be a non-empty string.")
    return name


def _known_fields(tool: dict[str, Any], known: frozenset[str], where: str) -> None:
    unknown = sorted(set(tool) - known)
    if unknown:
        raise _bad(f"{where}.{unknown[0]}", "unrecognized field.", "unknown_parameter")
