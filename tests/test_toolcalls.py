"""Tool calls (cactus_gguf/prompting/toolcalls.py, server/tools.py): the calling convention read from a chat
template, the parser on text cut at every character, the grammar walked byte by byte, and the
server's answers on tiny models through the official openai client (non-streamed and streamed,
tool_choice required / named / none, the history of a round trip, the 400s); the conventions:
hermes, llama3, the generic format and Command R7B's."""
from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from cactus_gguf.errors import InputError
from cactus_gguf.sampling.constraints import _byte_tokenizer, grammar_spec
from cactus_gguf.prompting.toolcalls import (COHERE_MARKERS, ToolFormat, render_with_tools,
                                             tool_format, tool_grammar)
from cactus_gguf.prompting.toolparse import ToolCallParser
from support.server import LiveServer, client, serving
from support.tiny_gguf import CHAT_TEMPLATE, EOS, write_llama
from support.tools import (COMMAND_R7B_TEMPLATE, HERMES_TEMPLATE, LLAMA3_TEMPLATE, SCHEMAS,
                           TOOLS)


CALL_A = '<tool_call>\n{"name": "set_unit", "arguments": {"unit": "c", "loud": true}}\n</tool_call>'
CALL_B = '<tool_call>\n{"name": "beep", "arguments": {"n": 2}}\n</tool_call>'


# ---- the calling convention ---------------------------------------------------------------------

def test_the_convention_comes_from_the_template():
    assert tool_format(HERMES_TEMPLATE).kind == "hermes"
    assert tool_format(LLAMA3_TEMPLATE).kind == "llama3"
    assert tool_format(HERMES_TEMPLATE, lambda t: t == "<tool_call>") == \
        ToolFormat("hermes", special_open=True, special_close=False)
    # a template that never reads tools (prose that mentions them does not count): generic
    assert tool_format(CHAT_TEMPLATE).kind == "generic"
    assert tool_format("{% for m in messages %}{{ m.content }} (tools <tool_call>){% endfor %}"
                       ).kind == "generic"
    assert tool_format("chatml").kind == "generic"  # a built-in template by name
    with pytest.raises(InputError, match="parses Qwen / Hermes"):
        tool_format("{% if tools %}[TOOLS]{{ tools | tojson }}{% endif %}")
    with pytest.raises(InputError, match="no chat template"):
        tool_format(None)


def test_the_history_of_a_round_trip_renders_with_object_arguments():
    messages = [{"role": "user", "content": "set it"},
                {"role": "assistant", "content": "", "tool_calls": [{
                    "id": "call_1", "type": "function",
                    "function": {"name": "set_unit",
                                 "arguments": '{"unit": "f", "loud": false}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "done"}]
    text = render_with_tools(HERMES_TEMPLATE, messages, TOOLS, bos="<s>", eos="</s>")
    # the arguments reach the template as an object: tojson writes them once, not as a string
    assert '{"name": "set_unit", "arguments": {"unit": "f", "loud": false}}' in text
    assert "<tool_response>\ndone\n</tool_response>" in text and text.endswith("assistant:")
    assert json.dumps(TOOLS[0], ensure_ascii=False) in text


# ---- the parser ---------------------------------------------------------------------------------

def _parse_in_pieces(fmt, text, size):
    p = ToolCallParser(fmt, TOOLS)
    content, calls = [], []
    for i in range(0, len(text), size):
        c, k = p.feed(text[i:i + size])
        content.append(c)
        calls += k
    c, k = p.finish()
    return content + [c], calls + k


@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_hermes_calls_parse_at_any_cut_and_no_tag_leaks_into_the_content(size):
    text = "Sure.\n" + CALL_A + "\n" + CALL_B
    pieces, calls = _parse_in_pieces(ToolFormat("hermes"), text, size)
    assert "".join(pieces) == "Sure.\n"  # the blank between the calls is no content
    assert not any("<" in piece for piece in pieces)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("set_unit", {"unit": "c", "loud": True}), ("beep", {"n": 2})]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)


def test_what_is_not_a_call_stays_text():
    fmt = ToolFormat("hermes")
    for text in ["a < b and <tool_ and <tool_call",                 # tags that never open
                 '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>',  # not a tool
                 '<tool_call>\n{"name": "beep", "arguments": [1]}\n</tool_call>',  # not an object
                 '<tool_call>\n{"name": "beep", "argu']:              # cut short
        pieces, calls = _parse_in_pieces(fmt, text, 3)
        assert calls == [] and "".join(pieces) == text, text
    # small models' shapes under tool_choice auto: a ```json block, a reply that is the object
    fenced = 'Sure.\n```json\n{\n  "name": "beep",\n  "arguments": {"n": 1}\n}\n```\nDone.'
    pieces, calls = _parse_in_pieces(fmt, fenced, 3)
    assert "".join(pieces) == "Sure.\n\nDone." and [c.name for c in calls] == ["beep"]
    _, calls = _parse_in_pieces(fmt, '  {"name": "beep", "arguments": {"n": 3}}', 2)
    assert [c.name for c in calls] == ["beep"]
    for text in ['```json\n{"name": "beep", "arguments": {"n": 7}}\n```',  # invalid arguments
                 'See {"name": "beep", "arguments": {"n": 1}}',  # an object inside prose
                 '```json\n[1, 2]\n```', '```python\nprint(1)\n```']:
        pieces, calls = _parse_in_pieces(fmt, text, 2)
        assert calls == [] and "".join(pieces) == text, text
    # arguments inside may hold anything JSON: tags, braces, quotes
    echo = [{"type": "function", "function": {"name": "echo", "parameters": {
        "type": "object", "properties": {"s": {"type": "string"}}}}}]
    _, calls = ToolCallParser(fmt, echo).feed(
        '<tool_call>\n{"name": "echo", "arguments": {"s": "</tool_call> {\\"}"}}\n</tool_call>')
    assert json.loads(calls[0].arguments) == {"s": '</tool_call> {"}'}


def test_llama3_replies_are_one_json_call_or_text():
    fmt = ToolFormat("llama3")
    pieces, calls = _parse_in_pieces(
        fmt, '<|python_tag|>{"name": "beep", "parameters": {"n": 1}}; '
             '{"name": "set_unit", "parameters": {"unit": "f", "loud": false}}', 3)
    assert "".join(pieces) == "" and [c.name for c in calls] == ["beep", "set_unit"]
    pieces, calls = _parse_in_pieces(fmt, "It is {warm} today.", 2)
    assert calls == [] and "".join(pieces) == "It is {warm} today."
    pieces, calls = _parse_in_pieces(fmt, '{"x": 1} and more', 2)
    assert calls == [] and "".join(pieces) == '{"x": 1} and more'
    pieces, calls = _parse_in_pieces(fmt, '{"name": "beep", "parameters": {"n": 9}}', 2)
    assert calls == [], "arguments that do not validate are no call"


def test_stop_strings_end_the_content_never_a_call():
    fmt = ToolFormat("hermes")
    city = [{"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    call = '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    for size in (1, 3, 1000):
        # inside a call's arguments a stop string is no stop: the call stays whole
        p = ToolCallParser(fmt, city, stops=["Paris", "</"])
        pieces = [p.feed(call[i:i + size]) for i in range(0, len(call), size)] + [p.finish()]
        assert "".join(c for c, _ in pieces) == "" and not p.stopped
        assert [json.loads(k.arguments) for _, ks in pieces for k in ks] == [{"city": "Paris"}]
        # in the content it ends the reply there: the call after it never comes
        p = ToolCallParser(fmt, city, stops=["Paris"])
        text = "Weather in Paris?\n" + call
        pieces = [p.feed(text[i:i + size]) for i in range(0, len(text), size)] + [p.finish()]
        assert "".join(c for c, _ in pieces) == "Weather in " and p.stopped
        assert [k for _, ks in pieces for k in ks] == []
        # a stop string never spans a call: "Pa" + call + "ris" is no match
        p = ToolCallParser(fmt, city, stops=["Paris"])
        text = "Pa" + call + "ris."
        pieces = [p.feed(text[i:i + size]) for i in range(0, len(text), size)] + [p.finish()]
        assert "".join(c for c, _ in pieces) == "Paris." and not p.stopped
        assert len([k for _, ks in pieces for k in ks]) == 1
    p = ToolCallParser(ToolFormat("llama3"), TOOLS, stops=["warm"])
    assert p.feed("It is warm today.") == ("It is ", []) and p.stopped
    assert p.feed(" more") == ("", []) and p.finish() == ("", [])


def test_a_reply_cut_inside_a_call_drops_the_half_call():
    fmt = ToolFormat("hermes")
    for text, content in [('<tool_call>\n{"name": "beep", "argu', ""),
                          ("<tool_call>\n", ""), ("<tool_", ""),
                          ('Sure.\n<tool_call>\n{"name": "beep", "arguments": {"n": ', "Sure."),
                          (CALL_B + '\n<tool_call>\n{"name": "set_', "")]:
        for size in (1, 4, 1000):
            p = ToolCallParser(fmt, TOOLS)
            got = [p.feed(text[i:i + size]) for i in range(0, len(text), size)]
            got.append(p.finish(cut=True))
            assert "".join(c for c, _ in got) == content, (text, size)
            assert [k.name for _, ks in got for k in ks] == (["beep"] if text.startswith(CALL_B)
                                                             else []), text
    llama = ToolFormat("llama3")
    for text, names in [('{"name": "beep", "param', []), ("<|python", []),
                        ('{"name": "beep", "parameters": {"n": 1}}; {"name": "se', ["beep"])]:
        p = ToolCallParser(llama, TOOLS)
        content, calls = p.feed(text)
        rest, more = p.finish(cut=True)
        assert content + rest == "" and [k.name for k in calls + more] == names, text
    # a reply that ended by itself is not cut: what is no call stays text, as before
    p = ToolCallParser(fmt, TOOLS)
    p.feed('<tool_call>\n{"name": "beep", "argu')
    assert p.finish() == ('<tool_call>\n{"name": "beep", "argu', [])


def test_a_function_without_parameters_takes_no_arguments():
    ping = [{"type": "function", "function": {"name": "ping"}}]
    fmt = ToolFormat("hermes")
    grammar = tool_grammar(fmt, ping, "required")
    assert _walk(grammar, '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>')
    assert not _walk(grammar, '<tool_call>\n{"name": "ping", "arguments": {"x": 1}}\n</tool_call>')
    _, calls = ToolCallParser(fmt, ping).feed(
        '<tool_call>\n{"name": "ping", "arguments": {"x": 1}}\n</tool_call>')
    assert calls == []
    _, calls = ToolCallParser(fmt, ping).feed(
        '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>')
    assert [(c.name, c.arguments) for c in calls] == [("ping", "{}")]


# ---- the grammar ---------------------------------------------------------------------------------

def _walk(grammar: str, text: str) -> bool:
    """Whether the grammar lets ``text`` through byte by byte and may end there."""
    from llguidance import LLMatcher

    m = LLMatcher(_byte_tokenizer(), grammar_spec("grammar", grammar).compiled, log_level=0)
    return all(m.consume_token(b) for b in text.encode()) and m.is_accepting()


def _pydantic_tools():
    """openai.pydantic_function_tool() of a model with a sub-model ($defs and $ref), of a
    recursive one, and a hand-written tool whose own "Addr" definition differs."""
    from pydantic import BaseModel

    class Addr(BaseModel):
        city: str
        zip: int

    class Person(BaseModel):
        name: str
        home: Addr

    class Node(BaseModel):
        label: str
        children: list["Node"]

    other = {"type": "function", "function": {"name": "ship", "parameters": {
        "type": "object", "properties": {"to": {"$ref": "#/definitions/Addr"}}, "required": ["to"],
        "definitions": {"Addr": {"type": "object", "properties": {"street": {"type": "string"}},
                                 "required": ["street"], "additionalProperties": False}}}}}
    return [openai.pydantic_function_tool(Person), openai.pydantic_function_tool(Node), other]


def test_parameters_with_defs_and_refs_are_enforced_inside_the_call():
    """The call schema nests a tool's parameters under "arguments": their $defs / definitions and
    $ref pointers (recursive ones included) move with them, each tool's apart."""
    tools = _pydantic_tools()
    assert "$defs" in tools[0]["function"]["parameters"]
    fmt = ToolFormat("hermes")

    def call(name, args):
        return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args)}}}\n</tool_call>'

    person = {"name": "Ann", "home": {"city": "Paris", "zip": 75001}}
    tree = {"label": "a", "children": [{"label": "b", "children": [{"label": "c",
                                                                    "children": []}]}]}
    for grammar in (tool_grammar(fmt, tools, "required"), tool_grammar(fmt, tools, "auto"),
                    tool_grammar(fmt, tools, {"type": "function", "function": {"name": "Node"}})):
        assert _walk(grammar, call("Node", tree))
        assert not _walk(grammar, call("Node", {"label": "a", "children": [{"label": 1}]}))
    required = tool_grammar(fmt, tools, "required")
    assert _walk(required, call("Person", person))
    assert not _walk(required, call("Person", {"name": "Ann", "home": {"city": "Paris"}}))
    assert _walk(required, call("ship", {"to": {"street": "Main"}}))
    assert not _walk(required, call("ship", {"to": {"city": "Paris", "zip": 1}}))
    assert _walk(tool_grammar(ToolFormat("llama3"), tools, "required"),
                 json.dumps({"name": "Person", "parameters": person}))
    # the parser checks the arguments against the tool's own schema, refs and all
    _, calls = ToolCallParser(fmt, tools).feed(call("Person", person) + call("Node", tree))
    assert [json.loads(c.arguments) for c in calls] == [person, tree]


def test_the_grammar_lets_through_exactly_the_valid_calls():
    fmt = ToolFormat("hermes")
    required = tool_grammar(fmt, TOOLS, "required")
    assert _walk(required, CALL_A) and _walk(required, CALL_A + "\n" + CALL_B)
    assert _walk(required, CALL_A + "\n") and _walk(required, CALL_A + "\n" + CALL_B + "\n\n")
    assert not _walk(required, "Sure. " + CALL_A)  # required: calls only
    assert not _walk(required, CALL_A.replace('"c"', '"k"'))  # not in the enum
    assert not _walk(required, CALL_A.replace(', "loud": true', ""))  # a required argument
    assert not _walk(required, CALL_A.replace("set_unit", "reboot"))  # not a tool
    assert not _walk(tool_grammar(fmt, TOOLS, "required", parallel=False),
                     CALL_A + "\n" + CALL_B)
    named = tool_grammar(fmt, TOOLS, {"type": "function", "function": {"name": "beep"}})
    assert _walk(named, CALL_B) and not _walk(named, CALL_A)
    auto = tool_grammar(fmt, TOOLS, "auto")
    assert _walk(auto, "Just text.") and _walk(auto, "Let me.\n" + CALL_A)
    assert not _walk(auto, "Let me.\n" + CALL_A.replace("true", '"yes"'))  # bound at the tag
    llama = tool_grammar(ToolFormat("llama3"), TOOLS, "required")
    assert _walk(llama, '{"name": "beep", "parameters": {"n": 3}}')
    assert not _walk(llama, '{"name": "beep", "parameters": {"n": 4}}')
    llama_auto = tool_grammar(ToolFormat("llama3"), TOOLS, "auto")
    assert _walk(llama_auto, "Hello.") and not _walk(llama_auto, '{"x": 1}')


# ---- the server on tiny models ------------------------------------------------------------------

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("tools")
    files = {name: write_llama(d / f"{name}.gguf", seed=11, zero_output_rows=[EOS],
                               chat_template=template)
             for name, template in (("hermes", HERMES_TEMPLATE), ("llama3", LLAMA3_TEMPLATE),
                                    ("plain", CHAT_TEMPLATE), ("cohere", COMMAND_R7B_TEMPLATE))}
    # Command R7B's markers as control tokens, as its GGUFs hold them
    files["cohere-control"] = write_llama(d / "cohere-control.gguf", seed=11,
                                          zero_output_rows=[EOS], extra_control=COHERE_MARKERS,
                                          chat_template=COMMAND_R7B_TEMPLATE)
    return files


@pytest.fixture(scope="module")
def server(files):
    with serving(files["hermes"], files["hermes"], "-t", "1", "-c", "1024", "-k", "4",
                 "-n", "400", "--temp", "0.8") as s:
        yield s


def ask(c, choice="required", **kw):
    """One call (the tiny models almost never end by themselves: EOS's logit is 0, so with
    parallel calls allowed they call until max_tokens)."""
    return c.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}],
                                     tools=TOOLS, tool_choice=choice, seed=kw.pop("seed", 1),
                                     parallel_tool_calls=kw.pop("parallel_tool_calls", False),
                                     **kw)


def _validate(calls) -> None:
    assert calls
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_required_calls_validate_streamed_and_not(server):
    c = client(server)
    for seed in range(3):
        r = ask(c, seed=seed)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None
        _validate(choice.message.tool_calls)
        assert r.model_extra["speculative"]["acceptance_rate"] > 0  # speculation stayed on
    stream = list(ask(c, seed=0, stream=True))
    deltas = [ch.choices[0].delta for ch in stream if ch.choices]
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert [tc.index for tc in calls] == list(range(len(calls)))
    assert all(tc.id.startswith("call_") and tc.type == "function" for tc in calls)
    _validate(calls)
    assert "".join(d.content or "" for d in deltas) == ""
    assert stream[-1].choices[0].finish_reason == "tool_calls"
    # streamed and not, the same seed gives the same calls
    whole = ask(c, seed=0).choices[0].message.tool_calls
    assert [(t.function.name, t.function.arguments) for t in whole] == \
        [(t.function.name, t.function.arguments) for t in calls]


def test_a_named_function_is_the_one_called_and_none_calls_nothing(server):
    c = client(server)
    r = ask(c, {"type": "function", "function": {"name": "beep"}})
    calls = r.choices[0].message.tool_calls
    assert [t.function.name for t in calls] == ["beep"]
    _validate(calls)
    r = ask(c, "none", max_tokens=8)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "length"
    assert isinstance(r.choices[0].message.content, str)


def test_a_round_trip_sends_the_call_and_its_result_back(server):
    c = client(server)
    first = ask(c)
    call = first.choices[0].message.tool_calls[0]
    messages = [{"role": "user", "content": "go"},
                first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "ok"}]
    second = c.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=6,
                                       tool_choice="none", seed=2)
    assert second.choices[0].finish_reason == "length"
    # the history (the call, re-rendered by the template, and its result) is part of the prompt;
    # the tools stay in it under "none", so the first turn's prompt is reused from the cache
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 20
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens


def test_llama3_json_calls(files):
    with LiveServer(files["llama3"], "-t", "1", "-c", "1024", "--drafter", "ngram", "-n", "400",
                    "--temp", "0.8") as s:
        r = ask(client(s))
        assert r.choices[0].finish_reason == "tool_calls"
        _validate(r.choices[0].message.tool_calls)
    assert s.returncode == 0


BAD = [
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "reboot"}}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools.0.function.name"),
    ({"tools": [{"type": "function", "function": {"name": "a"}},
                {"type": "function", "function": {"name": "a"}}]}, "tools.1.function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": 7}}}]},
     "tools.0.function.parameters"),
    ({"tools": [TOOLS[0], {"type": "function", "function": {"name": "a", "parameters": {
        "type": "object", "properties": {"x": {"type": "strin"}}}}}]},
     "tools.1.function.parameters"),
    ({"functions": [{"name": "a"}]}, "functions"),
    ({"tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": "string"}}}],
      "tool_choice": "required"}, "tools.0.function.parameters"),
    ({"messages": [{"role": "user", "content": "x"},
                   {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                                                         "function": {"name": "beep",
                                                                      "arguments": "{}"}}]},
                   {"role": "tool", "tool_call_id": "call_2", "content": "ok"}]},
     "messages.2.tool_call_id"),
    ({"messages": [{"role": "user", "content": "x"},
                   {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]},
     "messages.1.tool_call_id"),
]


@pytest.mark.parametrize("extra,param", BAD, ids=[p for _, p in BAD])
def test_bad_tools_are_a_400_naming_the_field(server, extra, param):
    body = {"messages": [{"role": "user", "content": "x"}], "tools": TOOLS, **extra}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    # one line naming the field, never the internal grammar
    assert "\n" not in error["message"] and "%json" not in error["message"], error
    if param.startswith(("tools", "messages")):
        assert error["message"].startswith(param), error


def test_tools_from_pydantic_models_with_sub_models_are_called(server):
    """openai.pydantic_function_tool() of models with a sub-model or recursion ($defs, $ref):
    accepted, and the call follows the schema (it was a 400: Pointer '/$defs/Addr' does not
    exist)."""
    c = client(server)
    for tool in _pydantic_tools():  # one at a time: the tiny model's context is 1024
        r = c.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "go"}], tools=[tool], seed=3,
            tool_choice="required", parallel_tool_calls=False, max_tokens=300)
        assert r.choices[0].finish_reason == "tool_calls", r
        call = r.choices[0].message.tool_calls[0]
        assert call.function.name == tool["function"]["name"]
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


PARIS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"const": "Paris"}}, "required": ["city"],
    "additionalProperties": False}}}]


def test_a_stop_string_does_not_cut_a_tool_call(server):
    """stop applies to the content, never inside a call: "Paris" in the arguments is no stop
    (it was finish_reason "stop" and the cut markup as content)."""
    c = client(server)
    kw = dict(model="m", messages=[{"role": "user", "content": "Weather in Paris?"}],
              tools=PARIS, tool_choice="required", parallel_tool_calls=False, stop=["Paris"],
              seed=1, max_tokens=300)
    r = c.chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.choices[0].message.content is None
    assert [(t.function.name, t.function.arguments) for t in r.choices[0].message.tool_calls] \
        == [("get_weather", '{"city": "Paris"}')]
    chunks = [ch for ch in c.chat.completions.create(stream=True, **kw) if ch.choices]
    deltas = [ch.choices[0].delta for ch in chunks]
    assert [(t.function.name, t.function.arguments) for d in deltas for t in d.tool_calls or []] \
        == [("get_weather", '{"city": "Paris"}')]
    assert "".join(d.content or "" for d in deltas) == ""
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_stop_string_in_the_content_ends_the_reply(server):
    """tool_choice auto: the content is cut before the stop string, the reply ends there
    (finish_reason "stop"), and the engine stops soon after instead of running to max_tokens."""
    c = client(server)
    kw = dict(model="m", messages=[{"role": "user", "content": "go"}], tools=TOOLS,
              tool_choice="auto", seed=4, temperature=0.8)
    free = c.chat.completions.create(max_tokens=40, **kw).choices[0].message.content
    assert len(free) > 12, free
    stop = free[8:11]
    cut = free[:free.index(stop)]
    r = c.chat.completions.create(max_tokens=300, stop=[stop], **kw)
    assert r.choices[0].finish_reason == "stop", r
    assert r.choices[0].message.content == cut and r.choices[0].message.tool_calls is None
    assert r.usage.completion_tokens < 60  # not the 300 of max_tokens
    chunks = [ch for ch in c.chat.completions.create(max_tokens=300, stop=[stop], stream=True,
                                                     **kw) if ch.choices]
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_max_tokens_inside_a_call_sends_no_markup_and_no_half_call(server):
    c = client(server)
    for n in (1, 5, 12):
        r = ask(c, max_tokens=n)
        choice = r.choices[0]
        assert choice.finish_reason == "length" and choice.message.tool_calls is None, r
        assert not choice.message.content, r
        chunks = [ch for ch in ask(c, max_tokens=n, stream=True) if ch.choices]
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == ""
        assert not any(ch.choices[0].delta.tool_calls for ch in chunks)
        assert chunks[-1].choices[0].finish_reason == "length"


def test_tool_choice_null_is_auto_and_a_tool_without_parameters_takes_none(server):
    body = {"messages": [{"role": "user", "content": "go"}], "tools": TOOLS,
            "tool_choice": None, "parallel_tool_calls": None, "max_tokens": 4}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    c = client(server)
    for seed in range(3):
        r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}],
                                      tools=[{"type": "function", "function": {"name": "ping"}}],
                                      tool_choice="required", parallel_tool_calls=False,
                                      seed=seed, max_tokens=60)
        assert [(t.function.name, t.function.arguments)
                for t in r.choices[0].message.tool_calls] == [("ping", "{}")]


# ---- the generic format: a template that never reads tools -------------------------------------

GENERIC_PROMPT = (
    "These tools are available, one per line as JSON:\n"
    '{"name": "set_unit", "description": "units", "parameters": {"type": "object", "properties": '
    '{"unit": {"enum": ["c", "f"]}, "loud": {"type": "boolean"}}, "required": ["unit", "loud"], '
    '"additionalProperties": false}}\n'
    '{"name": "beep", "parameters": {"type": "object", "properties": {"n": {"enum": [1, 2, 3]}}, '
    '"required": ["n"], "additionalProperties": false}}\n\n'
    "Reply with a single JSON object and nothing else: ")
GENERIC_MANY = ('{"tool_calls": [{"name": "<tool>", "arguments": {<its arguments>}}, ...]} to '
                'call one or more of them, or {"response": "<your answer>"} to answer the user '
                "directly.")
GENERIC_ONE = ('{"tool_call": {"name": "<tool>", "arguments": {<its arguments>}}} to call one, '
               'or {"response": "<your answer>"} to answer the user directly.')


def test_a_template_without_tools_gets_the_generic_system_message_and_history():
    fmt = tool_format(CHAT_TEMPLATE)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "set it"},
                {"role": "assistant", "content": "", "tool_calls": [{
                    "id": "call_1", "type": "function",
                    "function": {"name": "set_unit", "arguments": '{"unit": "f", "loud": false}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "done"}]
    text = render_with_tools(CHAT_TEMPLATE, messages, TOOLS, bos="<s>", eos="</s>", fmt=fmt)
    assert text == (
        "system: Be brief.\n\n" + GENERIC_PROMPT + GENERIC_MANY + "\n"
        "user: set it\n"
        'assistant: {"tool_calls": [{"name": "set_unit", "arguments": {"unit": "f", '
        '"loud": false}}]}\n'
        'user: {"tool_result": {"name": "set_unit", "tool_call_id": "call_1", '
        '"content": "done"}}\n'
        "assistant:")
    # no system message: the tools' one opens the chat; one call at a time: its own shape
    text = render_with_tools(CHAT_TEMPLATE, messages[1:2], TOOLS, bos="<s>", eos="</s>",
                             fmt=fmt, parallel=False)
    assert text == "system: " + GENERIC_PROMPT + GENERIC_ONE + "\nuser: set it\nassistant:"
    # a template that refuses a system turn: the tools' message opens the first user turn
    strict = ("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system') }}"
              "{% endif %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:")
    text = render_with_tools(strict, messages[1:2], TOOLS, bos="<s>", eos="</s>", fmt=fmt)
    assert text == "user: " + GENERIC_PROMPT + GENERIC_MANY + "\n\nset it\nassistant:"


GENERIC_A = '{"name": "set_unit", "arguments": {"unit": "c", "loud": true}}'
GENERIC_B = '{"name": "beep", "arguments": {"n": 2}}'


def test_the_generic_grammar_forces_the_json_shape():
    fmt = ToolFormat("generic")
    many = '{"tool_calls": [' + GENERIC_A + ", " + GENERIC_B + "]}"
    one = '{"tool_call": ' + GENERIC_B + "}"
    answer = '{"response": "Hi {there}"}'
    auto = tool_grammar(fmt, TOOLS, "auto")
    assert _walk(auto, many) and _walk(auto, answer) and _walk(auto, answer + "\n")
    assert not _walk(auto, one)  # parallel calls: the list
    assert not _walk(auto, "Hi there")  # text: only inside a response
    assert not _walk(auto, '{"tool_calls": []}')  # at least one call
    assert not _walk(auto, many.replace('"c"', '"k"'))  # the arguments validate
    assert not _walk(auto, many.replace("beep", "reboot"))  # a tool's name
    assert not _walk(auto, '{"response": "a", "tool_calls": [' + GENERIC_B + "]}")
    single = tool_grammar(fmt, TOOLS, "auto", parallel=False)
    assert _walk(single, one) and _walk(single, answer) and not _walk(single, many)
    required = tool_grammar(fmt, TOOLS, "required")
    assert _walk(required, many) and not _walk(required, answer)
    named = tool_grammar(fmt, TOOLS, {"type": "function", "function": {"name": "beep"}})
    assert _walk(named, '{"tool_calls": [' + GENERIC_B + "]}") and not _walk(named, many)
    none = tool_grammar(fmt, TOOLS, "none")
    assert _walk(none, answer) and not _walk(none, many)


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_generic_replies_parse_into_calls_and_content(size):
    fmt = ToolFormat("generic")
    many = '{"tool_calls": [\n  ' + GENERIC_A + ",\n  " + GENERIC_B + "\n]}\n"
    pieces, calls = _parse_in_pieces(fmt, many, size)
    assert "".join(pieces) == ""
    assert [(c.name, c.arguments) for c in calls] == [
        ("set_unit", '{"unit": "c", "loud": true}'), ("beep", '{"n": 2}')]
    _, calls = _parse_in_pieces(fmt, '{"tool_call": ' + GENERIC_B + "}", size)
    assert [(c.name, c.arguments) for c in calls] == [("beep", '{"n": 2}')]
    # a response is the content, decoded (escapes, a surrogate pair split anywhere)
    answer = '{"response": "Say \\"hi\\"\\n\\ud83d\\ude00 {x}"}'
    pieces, calls = _parse_in_pieces(fmt, answer, size)
    assert calls == [] and "".join(pieces) == 'Say "hi"\n\U0001F600 {x}'
    if size == 1:  # streamed as the string grows, not held to the end
        assert sum(1 for p in pieces if p) > 5
    # what is not a generic reply stays text
    for text in ["Just text.", '{"x": 1}', '{"tool_calls": [{"name": "beep", "arguments": '
                 '{"n": 9}}]}']:
        pieces, calls = _parse_in_pieces(fmt, text, size)
        assert calls == [] and "".join(pieces) == text, text
    # cut short: the response so far, the whole calls before the cut
    p = ToolCallParser(fmt, TOOLS)
    assert p.feed('{"response": "Half an ans') == ("Half an ans", [])
    assert p.finish(cut=True) == ("", [])
    p = ToolCallParser(fmt, TOOLS)
    content, calls = p.feed('{"tool_calls": [' + GENERIC_B + ', {"name": "set_')
    assert content == "" and [c.name for c in calls] == ["beep"]
    assert p.finish(cut=True) == ("", [])
    # cut before any call was whole: the reply's text, not an empty answer
    p = ToolCallParser(fmt, TOOLS)
    assert p.feed('{"tool_calls": [{"name": "be') == ("", [])
    assert p.finish(cut=True) == ('{"tool_calls": [{"name": "be', [])
    # a stop string ends the response's text
    p = ToolCallParser(fmt, TOOLS, stops=["hi"])
    assert p.feed(answer) == ('Say "', []) and p.stopped


@pytest.fixture(scope="module")
def generic(files):
    with serving(files["plain"], files["plain"], "-t", "1", "-c", "1024", "-k", "4",
                 "-n", "400", "--temp", "0.8") as s:
        yield s


def test_a_template_without_tools_calls_in_the_generic_format(generic):
    c = client(generic)
    body = {"messages": [{"role": "user", "content": "go"}], "tools": TOOLS}
    prompt = httpx.post(generic.url + "/apply-template", json=body, timeout=60).json()["prompt"]
    assert prompt == "system: " + GENERIC_PROMPT + GENERIC_MANY + "\nuser: go\nassistant:"
    for seed in range(2):
        r = ask(c, seed=seed)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
        _validate(choice.message.tool_calls)
    stream = list(ask(c, seed=0, stream=True))
    deltas = [ch.choices[0].delta for ch in stream if ch.choices]
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert [tc.index for tc in calls] == list(range(len(calls)))
    assert "".join(d.content or "" for d in deltas) == ""
    assert stream[-1].choices[0].finish_reason == "tool_calls"
    whole = ask(c, seed=0).choices[0].message.tool_calls
    assert [(t.function.name, t.function.arguments) for t in whole] == \
        [(t.function.name, t.function.arguments) for t in calls]
    named = ask(c, {"type": "function", "function": {"name": "beep"}}, parallel_tool_calls=True)
    assert {t.function.name for t in named.choices[0].message.tool_calls} == {"beep"}
    _validate(named.choices[0].message.tool_calls)
    # none: the response's text, never its JSON
    r = ask(c, "none", max_tokens=40)
    assert r.choices[0].message.tool_calls is None
    assert isinstance(r.choices[0].message.content, str)
    assert not r.choices[0].message.content.startswith("{")
    streamed = list(ask(c, "none", max_tokens=40, stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in streamed if ch.choices) == \
        r.choices[0].message.content
    assert sum(1 for ch in streamed if ch.choices and ch.choices[0].delta.content) > 1
    # Anthropic's Messages and OpenAI's Responses plan their tools alike
    tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
             for t in TOOLS]
    m = httpx.post(generic.url + "/v1/messages", timeout=120, json={
        "model": "m", "max_tokens": 300, "tools": tools, "tool_choice": {"type": "any"},
        "messages": [{"role": "user", "content": "go"}]}).json()
    uses = [b for b in m["content"] if b["type"] == "tool_use"]
    assert m["stop_reason"] == "tool_use" and uses, m
    for b in uses:
        jsonschema.validate(b["input"], SCHEMAS[b["name"]])
    r = httpx.post(generic.url + "/v1/responses", timeout=120, json={
        "model": "m", "max_output_tokens": 300, "input": "go", "tool_choice": "required",
        "tools": [{"type": "function", **t["function"]} for t in TOOLS]}).json()
    calls = [o for o in r["output"] if o["type"] == "function_call"]
    assert calls, r
    for o in calls:
        jsonschema.validate(json.loads(o["arguments"]), SCHEMAS[o["name"]])


# ---- Command R7B: a plan, then calls in one action list or an answer ------------------------------

PLAN = "<|START_THINKING|>Beep, then set the unit.<|END_THINKING|>"
ACTION = ('<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "beep", "parameters": {"n": 2}},'
          '\n    {"tool_call_id": "1", "tool_name": "set_unit", "parameters": {"unit": "c", '
          '"loud": true}}\n]<|END_ACTION|>')
ANSWER = "<|START_RESPONSE|>It beeped twice.<|END_RESPONSE|>"
COHERE = ToolFormat("command_r7b")


def test_command_r7b_is_read_from_its_template_and_its_history_rendered_back():
    assert tool_format(COMMAND_R7B_TEMPLATE) == COHERE
    # a vocabulary with the markers as special tokens (Command R7B's GGUFs: control tokens)
    assert tool_format(COMMAND_R7B_TEMPLATE, lambda t: t in COHERE_MARKERS) == \
        ToolFormat("command_r7b", specials=frozenset(COHERE_MARKERS))
    messages = [{"role": "user", "content": "beep twice"},
                {"role": "assistant", "content": PLAN, "tool_calls": [
                    {"id": "call_a", "type": "function",
                     "function": {"name": "beep", "arguments": '{"n": 2}'}},
                    {"id": "call_b", "type": "function",
                     "function": {"name": "set_unit", "arguments": '{"unit": "c", "loud": true}'}}]},
                {"role": "tool", "tool_call_id": "call_a", "content": "beeped"},
                {"role": "assistant", "content": "<|START_THINKING|>Done.<|END_THINKING|>Beeped."}]
    text = render_with_tools(COMMAND_R7B_TEMPLATE, messages, TOOLS, bos="", eos="", fmt=COHERE)
    # the reply's plan (its content) is the turn's reasoning_content, before the calls; the
    # template numbers the calls; an answer's turn has no plan
    assert text.endswith(
        "<|USER_TOKEN|>beep twice<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
        "<|START_THINKING|>Beep, then set the unit.<|END_THINKING|><|START_ACTION|>["
        '{"tool_call_id": "0", "tool_name": "beep", "parameters": {"n": 2}}, '
        '{"tool_call_id": "1", "tool_name": "set_unit", "parameters": {"unit": "c", "loud": true}}'
        "]<|END_ACTION|><|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>"
        "<|START_TOOL_RESULT|>beeped<|END_TOOL_RESULT|><|END_OF_TURN_TOKEN|>"
        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_RESPONSE|>Beeped.<|END_RESPONSE|>"
        "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")
    # a reasoning_content of its own wins over the plan in the content
    text = render_with_tools(COMMAND_R7B_TEMPLATE, [messages[0], {
        **messages[1], "reasoning_content": "Mine."}], TOOLS, bos="", eos="", fmt=COHERE)
    assert "<|START_THINKING|>Mine.<|END_THINKING|><|START_ACTION|>" in text


@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_command_r7b_replies_parse_into_the_plan_the_calls_and_the_answer(size):
    pieces, calls = _parse_in_pieces(COHERE, PLAN + ACTION + "\n", size)
    # the plan stays content, markers and all (reasoning is not split out of the content)
    assert "".join(pieces) == PLAN
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("beep", {"n": 2}), ("set_unit", {"unit": "c", "loud": True})]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)
    # an answer's markers are no content
    pieces, calls = _parse_in_pieces(COHERE, PLAN + ANSWER, size)
    assert "".join(pieces) == PLAN + "It beeped twice." and calls == []
    pieces, calls = _parse_in_pieces(COHERE, ANSWER, size)
    assert "".join(pieces) == "It beeped twice." and calls == []
    # without markers (or a partial one) it is all text
    pieces, calls = _parse_in_pieces(COHERE, "Hi <|START_ there", size)
    assert "".join(pieces) == "Hi <|START_ there" and calls == []
    # blanks between the blocks are no content
    pieces, calls = _parse_in_pieces(COHERE, " \n" + PLAN + "\n" + ACTION + "\n\n", size)
    assert "".join(pieces) == PLAN and len(calls) == 2


def test_command_r7b_streams_each_call_as_it_closes_and_reads_malformed_lists_as_text():
    p = ToolCallParser(COHERE, TOOLS)
    assert p.feed(PLAN) == (PLAN, [])
    assert p.feed(ACTION[:60]) == ("", [])
    content, calls = p.feed(ACTION[60:100])  # the first call is whole
    assert content == "" and [c.name for c in calls] == ["beep"]
    content, calls = p.feed(ACTION[100:])
    assert content == "" and [c.name for c in calls] == ["set_unit"]
    assert p.finish() == ("", [])
    bad_tool = ACTION.replace('"beep"', '"reboot"')
    bad_args = ACTION.replace('"n": 2', '"n": 9')
    for text in [PLAN + bad_tool, PLAN + bad_args,
                 PLAN + "<|START_ACTION|>not a list<|END_ACTION|> after",
                 PLAN + "<|START_ACTION|>[]<|END_ACTION|>",
                 PLAN + ACTION[:60]]:  # ended inside the first call, not cut short
        pieces, calls = _parse_in_pieces(COHERE, text, 3)
        assert calls == [] and "".join(pieces) == text, text
    # a later item that is no call ends the list: the whole calls before it stay
    pieces, calls = _parse_in_pieces(COHERE, ACTION.replace('"unit": "c"', '"unit": "k"'), 3)
    assert "".join(pieces) == "" and [c.name for c in calls] == ["beep"]
    # a list without its closing marker: the calls are whole
    pieces, calls = _parse_in_pieces(COHERE, ACTION[:-len("<|END_ACTION|>")], 4)
    assert "".join(pieces) == "" and [c.name for c in calls] == ["beep", "set_unit"]
    # cut short (max_tokens): no half call, no markup; whole calls stay
    for n, names in ((len(PLAN) + 8, []), (len(PLAN) + 60, []),
                     (len(PLAN) + 100, ["beep"])):
        p = ToolCallParser(COHERE, TOOLS)
        content, calls = p.feed((PLAN + ACTION)[:n])
        more, rest = p.finish(cut=True)
        assert content + more == PLAN and [c.name for c in calls + rest] == names, n
    # stop strings end the content, never a call
    p = ToolCallParser(COHERE, TOOLS, stops=["then"])
    assert p.feed(PLAN + ACTION) == ("<|START_THINKING|>Beep, ", []) and p.stopped
    p = ToolCallParser(COHERE, TOOLS, stops=['"n"'])
    content, calls = p.feed(PLAN + ACTION)
    assert content == PLAN and len(calls) == 2 and not p.stopped


def _special_walk(grammar: str, text: str) -> bool:
    """_walk with a vocabulary that holds Command R7B's markers as special tokens."""
    from llguidance import LLMatcher, LLTokenizer, TokenizerWrapper

    ids = {m: 257 + i for i, m in enumerate(COHERE_MARKERS)}

    class Vocabulary:
        eos_token_id, bos_token_id = 256, None
        tokens = [bytes([i]) for i in range(256)] + [b"\xff<end>"] + [
            b"\xff" + m.encode() for m in COHERE_MARKERS]
        special_token_ids = [256, *ids.values()]

        def __call__(self, data: bytes) -> list[int]:
            return list(data)

    tokens, i = [], 0
    while i < len(text):
        marker = next((m for m in COHERE_MARKERS if text.startswith(m, i)), None)
        tokens += [ids[marker]] if marker else list(text[i].encode())
        i += len(marker) if marker else 1
    m = LLMatcher(LLTokenizer(TokenizerWrapper(Vocabulary())),
                  grammar_spec("grammar", grammar).compiled, log_level=0)
    return all(m.consume_token(t) for t in tokens) and m.is_accepting()


@pytest.mark.parametrize("special", [False, True], ids=["spelled", "special-tokens"])
def test_the_command_r7b_grammar_lets_through_exactly_the_valid_calls(special):
    fmt = ToolFormat("command_r7b", specials=frozenset(COHERE_MARKERS) if special else frozenset())
    walk = _special_walk if special else _walk
    one = ACTION.replace(',\n    {"tool_call_id": "1", "tool_name": "set_unit", "parameters": '
                         '{"unit": "c", "loud": true}}', "")
    required = tool_grammar(fmt, TOOLS, "required")
    assert walk(required, PLAN + ACTION) and walk(required, ACTION + "\n")
    assert walk(required, PLAN + "\n" + ACTION)
    assert not walk(required, PLAN + ANSWER) and not walk(required, "Sure. " + ACTION)
    assert not walk(required, ACTION.replace('"n": 2', '"n": 7'))  # not in the enum
    assert not walk(required, ACTION.replace('"0"', '"zero"'))  # the template's numbers
    assert not walk(required, "<|START_ACTION|>[]<|END_ACTION|>")  # at least one call
    single = tool_grammar(fmt, TOOLS, "required", parallel=False)
    assert walk(single, one) and not walk(single, ACTION)
    named = tool_grammar(fmt, TOOLS, {"type": "function", "function": {"name": "beep"}})
    assert walk(named, PLAN + one) and not walk(named, ACTION)
    auto = tool_grammar(fmt, TOOLS, "auto")  # free up to the action, bound from there
    assert walk(auto, PLAN + ACTION) and walk(auto, PLAN + ANSWER) and walk(auto, "Hello.")
    assert not walk(auto, PLAN + ACTION.replace('"n": 2', '"n": 7'))
    none = tool_grammar(fmt, TOOLS, "none")
    assert walk(none, PLAN + ANSWER) and not walk(none, PLAN + ACTION)


@pytest.mark.parametrize("vocabulary", ["cohere", "cohere-control"])
def test_command_r7b_calls_from_the_server(files, vocabulary):
    """A tiny model under Command R7B's template, its markers spelled out or control tokens (the
    engine writes those as nothing: the reply's text gets them back, server/tools.py
    text_of): named calls validate, streamed and not, and the round trip renders."""
    # a fixed k: -k auto drafts by measured seconds, so a seed's tokens could differ between
    # two runs of the same request (the stream below is compared with the whole answer)
    with LiveServer(files[vocabulary], "-t", "1", "-c", "1024", "--drafter", "ngram", "-k", "4",
                    "-n", "400", "--temp", "0.8") as s:
        c = client(s)
        prompt = httpx.post(s.url + "/apply-template", timeout=60, json={
            "messages": [{"role": "user", "content": "go"}], "tools": TOOLS}).json()["prompt"]
        assert prompt.endswith("<|USER_TOKEN|>go<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
                               "<|CHATBOT_TOKEN|>")
        # a plan's text runs free until its closing marker: the tiny model may never write it,
        # so some seeds end at max_tokens inside the plan; those that call, call validly
        called = 0
        for seed in range(4):
            r = ask(c, {"type": "function", "function": {"name": "beep"}}, seed=seed,
                    max_tokens=300)
            choice = r.choices[0]
            if choice.finish_reason == "tool_calls":
                called += 1
                assert [t.function.name for t in choice.message.tool_calls] == ["beep"]
                _validate(choice.message.tool_calls)
                assert (choice.message.content or "").startswith("<|START_THINKING|>") or \
                    choice.message.content is None
            else:
                assert choice.finish_reason == "length" and not choice.message.tool_calls
                assert choice.message.content.startswith("<|START_THINKING|>"), choice
        assert called, "no seed called"
        seed = next(seed for seed in range(4) if ask(
            c, {"type": "function", "function": {"name": "beep"}}, seed=seed,
            max_tokens=300).choices[0].finish_reason == "tool_calls")
        kw = dict(seed=seed, max_tokens=300)
        whole = ask(c, {"type": "function", "function": {"name": "beep"}}, **kw).choices[0]
        stream = [ch for ch in ask(c, {"type": "function", "function": {"name": "beep"}},
                                   stream=True, **kw) if ch.choices]
        deltas = [ch.choices[0].delta for ch in stream]
        assert [(t.function.name, t.function.arguments) for d in deltas
                for t in d.tool_calls or []] == [(t.function.name, t.function.arguments)
                                                  for t in whole.message.tool_calls]
        assert stream[-1].choices[0].finish_reason == "tool_calls"
        messages = [{"role": "user", "content": "go"},
                    whole.message.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": whole.message.tool_calls[0].id,
                     "content": "ok"}]
        prompt = httpx.post(s.url + "/apply-template", timeout=60, json={
            "messages": messages, "tools": TOOLS}).json()["prompt"]
        assert '"tool_call_id": "0", "tool_name": "beep", "parameters": ' in prompt
        assert prompt.endswith("<|START_TOOL_RESULT|>ok<|END_TOOL_RESULT|><|END_OF_TURN_TOKEN|>"
                               "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")
    assert s.returncode == 0
