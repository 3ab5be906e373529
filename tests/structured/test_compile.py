"""Constraint specs compiled into llguidance grammars: what each kind accepts, the cache,
reasoning first, forced tool calls, and 400s that name the problem."""

from __future__ import annotations

import json

import pytest

from vllm_mlx_trio.core.constraint import ConstraintSpec, ReasoningMarkers, canonical_json
from vllm_mlx_trio.errors import InvalidRequestError
from vllm_mlx_trio.structured import ConstraintCompiler, compile_constraint

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
THINK = ReasoningMarkers("<think>", "</think>")
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
NOARGS = {"type": "function", "function": {"name": "ping"}}


@pytest.fixture
def compiler(llg_tokenizer):
    return ConstraintCompiler(lambda: llg_tokenizer)


def accepts(compiled, tokenizer, text: str) -> bool:
    """The whole text is a complete sentence of the grammar."""
    matcher = compiled.new_matcher()
    return matcher.consume_tokens(tokenizer.tokenize_str(text)) and matcher.is_accepting()


def spec(kind: str, body: object = "", **kw) -> ConstraintSpec:
    return ConstraintSpec(kind=kind, body=body if isinstance(body, str) else json.dumps(body), **kw)


@pytest.mark.parametrize(
    ("constraint", "good", "bad"),
    [
        (spec("json_schema", canonical_json(SCHEMA)), '{"name":"a","age":3}', '{"name":"a"}'),
        (spec("json_object"), '{"x":[1,2]}', "[1]"),
        (spec("regex", r"\d{3}-[a-z]+"), "123-abc", "12-abc"),
        (spec("choice", ["yes", 'no "way"']), 'no "way"', "maybe"),
        (spec("grammar", 'start: "a" NUM\nNUM: /[0-9]+/\n'), "a42", "b42"),
    ],
)
def test_each_kind_accepts_its_sentences_only(compiler, llg_tokenizer, constraint, good, bad):
    compiled = compiler.compile(constraint)
    assert accepts(compiled, llg_tokenizer, good)
    assert not accepts(compiled, llg_tokenizer, bad)


def test_json_has_no_free_whitespace(compiler, llg_tokenizer):
    """whitespace_flexible = false: a random model cannot pad with whitespace forever."""
    compiled = compiler.compile(spec("json_schema", canonical_json(SCHEMA)))
    assert not accepts(compiled, llg_tokenizer, '{"name": "a", "age": 3}')


def test_compiled_grammars_are_cached_by_spec_and_evicted_least_recently_used(llg_tokenizer):
    built = []
    compiler = ConstraintCompiler(lambda: built.append(1) or llg_tokenizer, cache_size=2)
    assert built == []  # the tokenizer is built on the first constrained request, not before
    a, b, c = (spec("regex", pattern) for pattern in ("a+", "b+", "c+"))
    first = compiler.compile(a)
    assert compiler.compile(spec("regex", "a+")) is first  # an equal spec: a cache hit
    compiler.compile(b)
    compiler.compile(a)  # a is now the most recently used
    compiler.compile(c)  # evicts b
    assert (compiler.compiles, compiler.cached, built) == (3, 2, [1])
    compiler.compile(a)
    assert compiler.compiles == 3
    compiler.compile(b)
    assert compiler.compiles == 4


def test_the_reasoning_markers_are_part_of_the_key(compiler):
    plain = compiler.compile(spec("json_object"))
    thinking = compiler.compile(spec("json_object"), reasoning=THINK)
    assert plain is not thinking and compiler.compiles == 2


def test_a_thinking_block_may_come_first(compiler, llg_tokenizer):
    compiled = compiler.compile(spec("json_schema", canonical_json(SCHEMA)), reasoning=THINK)
    assert accepts(compiled, llg_tokenizer, '<think>let me see {"no json" here</think>\n{"name":"a","age":1}')
    assert accepts(compiled, llg_tokenizer, '{"name":"a","age":1}')  # the block is optional
    assert not accepts(compiled, llg_tokenizer, 'prose {"name":"a","age":1}')


def test_a_prompt_that_opened_the_block_continues_inside_it(compiler, llg_tokenizer):
    inside = ReasoningMarkers("<think>", "</think>", starts_inside=True)
    compiled = compiler.compile(spec("regex", "[0-9]+"), reasoning=inside)
    assert accepts(compiled, llg_tokenizer, "still thinking</think>42")
    assert not accepts(compiled, llg_tokenizer, "42")  # still thinking: the block must close first


def test_hermes_forced_calls_one_or_more(compiler, llg_tokenizer):
    compiled = compiler.compile(spec("tool_calls", [WEATHER, NOARGS], tool_call_format="hermes"))
    one = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    two = one + '\n<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'
    assert accepts(compiled, llg_tokenizer, one)
    assert accepts(compiled, llg_tokenizer, two)
    assert not accepts(compiled, llg_tokenizer, one.replace('"city"', '"town"'))  # arguments follow the schema
    assert not accepts(compiled, llg_tokenizer, one.replace("get_weather", "rm_rf"))  # only the given tools
    single = compiler.compile(spec("tool_calls", [WEATHER, NOARGS], tool_call_format="hermes", parallel=False))
    assert accepts(compiled, llg_tokenizer, one) and not accepts(single, llg_tokenizer, two)


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        ("mistral", '[TOOL_CALLS][{"name": "ping", "arguments": {}}, {"name": "ping", "arguments": {}}]'),
        ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Oslo"}}'),
        (None, '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'),  # no parser named: hermes
    ],
)
def test_other_tool_call_markups(compiler, llg_tokenizer, fmt, text):
    assert accepts(compiler.compile(spec("tool_calls", [WEATHER, NOARGS], tool_call_format=fmt)), llg_tokenizer, text)


@pytest.mark.parametrize(
    ("constraint", "param", "words"),
    [
        (spec("json_schema", {"type": "strange"}), "response_format", "strange"),
        (spec("json_schema", {"type": "string", "format": "weird"}), "response_format", "weird"),
        (spec("json_schema", {"$ref": "#/$defs/missing"}), "response_format", "missing"),
        (spec("json_schema", "[1, 2]"), "response_format", "JSON object"),
        (spec("regex", "[a-"), "guided_regex", "unclosed"),
        (spec("grammar", "start: nothing_here"), "guided_grammar", "nothing_here"),
        (spec("choice", []), "choice", "non-empty"),
        (spec("tool_calls", []), "tool_choice", "at least one tool"),
        (spec("tool_calls", [{"type": "function", "function": {}}]), "tools[0]", "name"),
        (spec("tool_calls", [WEATHER], tool_call_format="kimi_k2"), "tool_choice", "kimi_k2"),
    ],
)
def test_invalid_or_unsupported_specs_are_400s_naming_the_problem(compiler, constraint, param, words):
    with pytest.raises(InvalidRequestError) as info:
        compiler.compile(constraint)
    assert info.value.param == param
    assert words in str(info.value)


def test_without_a_tokenizer_the_grammar_is_only_checked():
    assert compile_constraint(spec("regex", "a+"), reasoning=None).grammar
    with pytest.raises(InvalidRequestError):
        compile_constraint(spec("regex", "(a"), reasoning=None)


def test_the_cache_key_covers_every_field():
    base = spec("tool_calls", [WEATHER])
    others = [
        spec("tool_calls", [NOARGS]),
        spec("tool_calls", [WEATHER], tool_call_format="mistral"),
        spec("tool_calls", [WEATHER], parallel=False),
        spec("regex", base.body),
    ]
    assert len({base.key, *(o.key for o in others)}) == 5
    assert spec("tool_calls", [WEATHER]).key == base.key


def test_the_admission_step_builds_the_tokenizer_once_and_sees_an_opened_thinking_block(demo_tiny_dir):
    from transformers import PreTrainedTokenizerFast

    from vllm_mlx_trio import SamplingParams
    from vllm_mlx_trio.structured.admission import ConstraintStep

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(demo_tiny_dir / "tokenizer.json"))
    step = ConstraintStep(vocab_size=512, eos_token_ids=(2,), reasoning_markers=("<think>", "</think>"))
    plain = SamplingParams(max_tokens=4)
    assert step.attach(plain, [5, 6], tokenizer) is plain  # no constraint: nothing built
    params = SamplingParams(constraint=spec("regex", "[0-9]+"))
    opened = step.attach(params, tokenizer.encode("user: hi\nassistant: <think>"), tokenizer).grammar
    closed = step.attach(params, tokenizer.encode("<think>done</think>\n"), tokenizer).grammar
    assert opened.reasoning.starts_inside and not closed.reasoning.starts_inside
    assert step.compiler.compiles == 2
    assert step.attach(params, tokenizer.encode("x"), tokenizer).grammar is closed  # cached


def test_agent_client_tool_schemas_compile_and_a_bad_one_is_named():
    """Schemas as Claude Code and Codex send them ($schema, additionalProperties: false, enum,
    format: uri, minLength) compile for forced calls; one llguidance cannot take is a 400
    naming that tool, not the grammar's internal rule."""
    from vllm_mlx_trio.bench.agents.shapes import TOOL_SPECS

    tools = [{"type": "function", "function": {"name": n, "parameters": s}} for n, _, s in TOOL_SPECS]
    spec = ConstraintSpec(kind="tool_calls", body=canonical_json(tools), tool_call_format="hermes")
    compile_constraint(spec, reasoning=None)
    broken = {"type": "object", "properties": {"path": {"$ref": "#/$defs/Missing"}}}
    tools.append({"type": "function", "function": {"name": "Glob", "parameters": broken}})
    spec = ConstraintSpec(kind="tool_calls", body=canonical_json(tools), tool_call_format="llama3_json")
    with pytest.raises(InvalidRequestError) as caught:
        compile_constraint(spec, reasoning=None)
    assert caught.value.param == "tools"
    assert str(caught.value).startswith("Invalid or unsupported parameters schema for tool 'Glob': ")
    assert "/$defs/Missing" in str(caught.value)


XML_TOOL = {
    "type": "function",
    "function": {
        "name": "edit_file",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "mode": {"type": "string", "enum": ["append", "replace"]},
                "line": {"type": "integer"},
                "dry_run": {"type": "boolean"},
            },
            "required": ["path", "line"],
        },
    },
}
XML_OUTPUTS = {
    "qwen3_coder": (
        "<tool_call>\n<function=edit_file>\n<parameter=path>\nsrc/a b.py\n</parameter>\n"
        "<parameter=mode>\nreplace\n</parameter>\n<parameter=line>\n12\n</parameter>\n</function>\n</tool_call>"
    ),
    "glm45": (
        "<tool_call>edit_file\n<arg_key>path</arg_key>\n<arg_value>src/a b.py</arg_value>\n"
        "<arg_key>mode</arg_key>\n<arg_value>replace</arg_value>\n<arg_key>line</arg_key>\n<arg_value>12</arg_value>\n"
        "</tool_call>"
    ),
}


@pytest.mark.parametrize("markup", sorted(XML_OUTPUTS))
def test_forced_calls_in_xml_markups_take_the_models_own_form_and_parse_back(markup, llg_tokenizer):
    from llguidance import LLMatcher

    from vllm_mlx_trio.parsers import OutputParser
    from vllm_mlx_trio.structured.grammar import build_grammar

    spec = ConstraintSpec(kind="tool_calls", body=canonical_json([XML_TOOL]), tool_call_format=markup)
    grammar = build_grammar(spec)
    text = XML_OUTPUTS[markup]
    matcher = LLMatcher(llg_tokenizer, grammar)
    assert matcher.consume_tokens(llg_tokenizer.tokenize_str(text)) and matcher.is_accepting()
    wrong = LLMatcher(llg_tokenizer, grammar)  # the required "line" left out
    assert not (wrong.consume_tokens(llg_tokenizer.tokenize_str(text.replace("12", "x"))) and wrong.is_accepting())
    parser = OutputParser(tool_parser=markup, reasoning_parser=None, tools=(XML_TOOL,))
    parser.feed(text)
    parser.finish()
    [call] = parser.message().tool_calls
    assert json.loads(call.arguments) == {"path": "src/a b.py", "mode": "replace", "line": 12}
