"""Tool calls: the prompt from a GGUF's own chat template with its ``tools``, the calls parsed out
of the text a model writes, and the grammar that makes them valid.

A chat template that supports tools reads a ``tools`` variable (OpenAI's list of
``{"type": "function", "function": {"name", "description", "parameters"}}``) and writes the
model's calling convention into the prompt. Two such conventions are parsed, and a template that
never reads ``tools`` gets a third, this server's own:

``hermes``   Qwen 2.5 / 3, Hermes 2 Pro and the many templates that copied them: each call is
             ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, anywhere in the
             reply, several in a row for parallel calls. Recognised by ``<tool_call>`` in the
             template.
``llama3``   Llama 3.1 / 3.2 / 3.3: the whole reply is one JSON object ``{"name": ...,
             "parameters": {...}}`` (optionally after ``<|python_tag|>``). Recognised by the
             Llama 3 header tokens in a template that reads ``tools``.
``command_r7b``  Cohere's Command R7B: a reply is an optional plan, ``<|START_THINKING|>...
             <|END_THINKING|>``, then either the answer, ``<|START_RESPONSE|>...<|END_RESPONSE|>``,
             or the calls, ``<|START_ACTION|>[{"tool_call_id": "0", "tool_name": ...,
             "parameters": {...}}, ...]<|END_ACTION|>`` (one JSON list, several items for parallel
             calls). Recognised by ``<|START_ACTION|>`` and ``<|START_RESPONSE|>`` in the
             template, which renders calls, results and the plan (``reasoning_content``)
             itself. The plan stays in the content, markers and all (the server does not split
             reasoning out); the answer's markers do not.
``generic``  A template that never reads ``tools`` (the JSON shapes of the generic
             format of earlier llama-server releases): the tools are described in a system message
             added to the chat (:func:`generic_system_prompt`), earlier calls and results are
             written into the messages as that JSON, and the whole reply is one JSON object:
             ``{"tool_calls": [{"name", "arguments"}, ...]}`` (``{"tool_call": {...}}`` when
             parallel calls are off) or ``{"response": "text for the user"}``.

Parsing takes the JSON with ``json.JSONDecoder.raw_decode`` at the position the convention puts
it (after ``<tool_call>`` or a ```` ```json ```` fence, or at the reply's first non-blank
character), so a call's arguments may hold any JSON, tags and braces included. A call is kept
only when it names a tool and its arguments validate against the tool's parameters; anything
else stays text.

The grammar (llguidance's Lark syntax, the ``%llguidance`` grammars of llama.cpp) is built from
the tools' JSON schemas: each call must be ``{"name": <one tool's name>, "arguments": <valid
under that tool's parameters>}``. ``tool_choice`` ``auto`` lets the model write text, then calls
(like llama-server's lazy grammar, the constraint binds from the call's opening tag on, which the
text cannot contain); ``required`` allows calls only; a named function allows only a call of
it. Where ``<tool_call>`` is one special token of the vocabulary (Qwen 2.5), the grammar names
that token; otherwise it spells the text. The generic reply is one JSON schema: the calls'
object, the response's, or (``auto``) either; ``none`` leaves only the response, so its tools
and prompt stay those of the other choices.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..errors import InputError
from ..sampling.constraints import _JSON_OPTIONS as JSON_OPTIONS

__all__ = ["ToolFormat", "tool_format", "render_with_tools", "tool_grammar",
           "template_reads_tools", "generic_system_prompt", "special_markup"]

HERMES, LLAMA3, COMMAND_R7B, GENERIC = "hermes", "llama3", "command_r7b", "generic"
OPEN, CLOSE = "<tool_call>", "</tool_call>"
FENCE, FENCE_END = "```json", "```"  # a Markdown JSON block: how small models also write calls
PYTHON_TAG = "<|python_tag|>"
# Command R7B's markers: its plan, its answer and its calls
THINK_OPEN, THINK_CLOSE = "<|START_THINKING|>", "<|END_THINKING|>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<|START_RESPONSE|>", "<|END_RESPONSE|>"
ACTION_OPEN, ACTION_CLOSE = "<|START_ACTION|>", "<|END_ACTION|>"
COHERE_MARKERS = (THINK_OPEN, THINK_CLOSE, RESPONSE_OPEN, RESPONSE_CLOSE, ACTION_OPEN,
                  ACTION_CLOSE)
_DECODER = json.JSONDecoder()
BLANK = "BLANK: /[ \\t\\n]{1,2}/\n"  # at most two: a model must not pad forever


@dataclass(frozen=True)
class ToolFormat:
    """How a model writes its calls: ``kind`` (hermes, llama3, command_r7b or generic);
    ``special_open`` / ``special_close``: the opening / closing tag is one special token of the
    vocabulary (the grammar then names the token rather than its text); ``specials``: the same
    for command_r7b, the markers that are one special token each."""

    kind: str
    special_open: bool = False
    special_close: bool = False
    specials: frozenset = frozenset()

    @property
    def arguments_key(self) -> str:
        return "parameters" if self.kind in (LLAMA3, COMMAND_R7B) else "arguments"

    @property
    def name_key(self) -> str:
        return "tool_name" if self.kind == COMMAND_R7B else "name"


def special_markup(fmt: ToolFormat) -> tuple[str, ...]:
    """The convention's tags and markers that are one special token each: a reply must show
    them in its text for the parser to read it (llama-server's preserved tokens), where the
    engine writes a control token as nothing."""
    if fmt.kind == HERMES:
        return tuple(t for t, special in ((OPEN, fmt.special_open), (CLOSE, fmt.special_close))
                     if special)
    return tuple(m for m in COHERE_MARKERS if m in fmt.specials)


def template_reads_tools(template: str) -> bool:
    """Whether a Jinja chat template uses the ``tools`` variable (its syntax tree, not a
    substring: a template mentioning "tools" in its prose does not count)."""
    import jinja2
    from jinja2 import meta
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    env = jinja2.Environment(extensions=[Jinja2ChatFormatter.IgnoreGenerationTags,
                                         "jinja2.ext.loopcontrols"])
    try:
        return "tools" in meta.find_undeclared_variables(env.parse(template))
    except jinja2.TemplateSyntaxError as e:
        raise InputError(f"the model's chat template is not valid Jinja: {e}") from None


def tool_format(template: str | None, is_special=lambda text: False) -> ToolFormat:
    """The calling convention of a chat template. ``is_special(text)``: whether the vocabulary
    holds ``text`` as one special token. A template that never reads ``tools`` (a built-in
    template's name included) gets the generic format. Raises InputError (HTTP 400) when there
    is no template, or it takes tools in a convention none of the parsers reads."""
    if not template:
        raise InputError("this model has no chat template (tokenizer.chat_template), so it cannot "
                         "be given tools", param="tools")
    if not template_reads_tools(template):
        return ToolFormat(GENERIC)
    if ACTION_OPEN in template and RESPONSE_OPEN in template:
        return ToolFormat(COMMAND_R7B, specials=frozenset(m for m in COHERE_MARKERS
                                                          if is_special(m)))
    if OPEN in template:
        return ToolFormat(HERMES, is_special(OPEN), is_special(CLOSE))
    if "<|start_header_id|>" in template:
        return ToolFormat(LLAMA3)
    raise InputError("this model's chat template takes tools, but in a calling convention this "
                     "server does not parse (it parses Qwen / Hermes <tool_call>, Llama 3.x "
                     "JSON and Command R7B <|START_ACTION|> calls)", param="tools")


def render_with_tools(template: str, messages: Sequence[dict], tools: Sequence[dict] | None, *,
                      bos: str, eos: str, variables: Mapping[str, Any] | None = None,
                      fmt: ToolFormat | None = None, parallel: bool = True) -> str:
    """``messages`` rendered with the template and ``tools`` (None: the template's own no-tools
    branch), ending with the assistant's turn opened. Assistant messages may carry
    ``tool_calls`` (OpenAI's, arguments as JSON text: given to the template as objects, the
    convention of Hugging Face templates, which write them with ``tojson``) and
    ``reasoning_content``; ``tool`` messages carry the results; ``variables`` are given to the
    template too (as render_chat's). ``fmt`` generic (with tools): the
    messages as :func:`generic_messages` writes them, ``parallel`` choosing the calls' shape;
    command_r7b: an assistant's plan at the start of its content (the reply's, markers and all)
    is its ``reasoning_content`` (:func:`_plan_apart`).
    InputError when the template raises (its own checks)."""
    import jinja2

    from .templates import apply_template

    variables = dict(variables or {})
    generic = fmt is not None and fmt.kind == GENERIC and bool(tools)
    cohere = fmt is not None and fmt.kind == COMMAND_R7B
    chat = (generic_messages(messages, tools, parallel) if generic else
            [_for_template(_plan_apart(m) if cohere else m) for m in messages])
    try:
        try:
            return apply_template(template, chat, bos=bos, eos=eos,
                                  tools=list(tools) if tools else None, **variables)
        except (jinja2.TemplateError, ValueError, TypeError):
            if not generic or chat[0]["role"] != "system":
                raise
            # a template without a system turn (Gemma's, Mistral's raise): the tools' message
            # opens the first user turn instead
            return apply_template(template, _system_in_first_user(chat), bos=bos, eos=eos,
                                  tools=list(tools), **variables)
    except (jinja2.TemplateError, ValueError, TypeError) as e:
        raise InputError(f"the model's chat template refused these messages: {e}",
                         param="messages") from None


def generic_system_prompt(tools: Sequence[dict], parallel: bool = True) -> str:
    """The system message that tells a model whose template never reads ``tools`` what it may
    call and how to answer (the generic format): one line per tool (its function object as
    JSON), then the two shapes of a reply."""
    lines = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    if parallel:
        calls = ('{"tool_calls": [{"name": "<tool>", "arguments": {<its arguments>}}, ...]} '
                 "to call one or more of them")
    else:
        calls = '{"tool_call": {"name": "<tool>", "arguments": {<its arguments>}}} to call one'
    return (f"These tools are available, one per line as JSON:\n{lines}\n\n"
            f"Reply with a single JSON object and nothing else: {calls}, or "
            '{"response": "<your answer>"} to answer the user directly.')


def generic_messages(messages: Sequence[dict], tools: Sequence[dict],
                     parallel: bool = True) -> list[dict]:
    """The messages as a template without tools reads them under the generic format: the
    tools' system message (:func:`generic_system_prompt`, after the chat's own system text in
    one system message), each assistant ``tool_calls`` written into its content as the JSON the
    model answers with, and each ``tool`` result a user message ``{"tool_result": {"name",
    "tool_call_id", "content"}}`` (a template need not know the tool role)."""
    prompt = generic_system_prompt(tools, parallel)
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system" and (out[0].get("content") or ""):
        out[0]["content"] = f"{out[0]['content']}\n\n{prompt}"
    elif out and out[0].get("role") == "system":
        out[0]["content"] = prompt
    else:
        out.insert(0, {"role": "system", "content": prompt})
    names: dict[str, str] = {}  # call id -> the function it called
    for i, m in enumerate(out):
        calls = m.pop("tool_calls", None)
        if calls and m.get("role") == "assistant":
            written = []
            for call in _for_template({"tool_calls": calls})["tool_calls"]:
                fn = call.get("function") or {}
                written.append({"name": fn.get("name"), "arguments": fn.get("arguments", {})})
                if call.get("id"):
                    names[call["id"]] = fn.get("name")
            obj = ({"tool_call": written[0]} if len(written) == 1 and not parallel else
                   {"tool_calls": written})
            text = m.get("content") or ""
            m["content"] = (text + "\n\n" if text else "") + json.dumps(obj, ensure_ascii=False)
        elif m.get("role") == "tool":
            result = {"name": m.get("name") or names.get(m.get("tool_call_id") or ""),
                      "tool_call_id": m.get("tool_call_id"), "content": m.get("content") or ""}
            out[i] = {"role": "user", "content": json.dumps(
                {"tool_result": {k: v for k, v in result.items() if v is not None}},
                ensure_ascii=False)}
    return out


def _system_in_first_user(messages: list[dict]) -> list[dict]:
    """The system message's text moved to the start of the first user message."""
    system, rest = messages[0]["content"], [dict(m) for m in messages[1:]]
    for m in rest:
        if m.get("role") == "user":
            m["content"] = f"{system}\n\n{m.get('content') or ''}"
            return rest
    return [{"role": "user", "content": system}, *rest]


def _plan_apart(message: dict) -> dict:
    """A Command R7B assistant message whose content opens with the plan a reply carries
    (``<|START_THINKING|>...<|END_THINKING|>``): the plan's text as its ``reasoning_content``
    (unless it has one), the rest as its content, as the template writes a turn (the plan before
    the calls; none before an answer)."""
    content = message.get("content")
    if message.get("role") != "assistant" or not isinstance(content, str):
        return message
    head = content.lstrip()
    end = head.find(THINK_CLOSE)
    if not head.startswith(THINK_OPEN) or end < 0:
        return message
    out = {**message, "content": head[end + len(THINK_CLOSE):].lstrip()}
    if not out.get("reasoning_content"):
        out["reasoning_content"] = head[len(THINK_OPEN):end]
    return out


def _for_template(message: dict) -> dict:
    calls = message.get("tool_calls")
    if not calls:
        return message
    out = []
    for call in calls:
        fn = dict(call.get("function") or {})
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                fn["arguments"] = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                pass  # not JSON: the template gets the text as it is
        out.append({**call, "function": fn})
    return {**message, "tool_calls": out}


# -------------------------------------------------------------------------------------------------
# The grammar
# -------------------------------------------------------------------------------------------------

NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}


def arguments_schema(function: dict) -> dict:
    """The JSON schema a call's arguments follow, from an OpenAI function: its ``parameters``,
    which describe an object (a schema without ``type`` is taken as one: ``{}`` is any object);
    no ``parameters``: the function takes no arguments (``{}`` only, as OpenAI's)."""
    params = function.get("parameters")
    if params is None:
        return NO_ARGUMENTS
    return params if "type" in params else {**params, "type": "object"}


# keywords whose values are data, not schemas: a "$ref" key inside them is no reference
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
# keywords whose values map names to schemas (a property named "const" is a schema)
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions",
                          "dependentSchemas"})


def _local_ref(ref: str, name: str) -> str:
    """A ``$ref`` of tool ``name``'s arguments schema, rewritten for the call schema, where that
    schema is ``#/$defs/<name>`` and its own ``$defs`` / ``definitions`` entry N is
    ``#/$defs/<name>.$defs.N`` / ``#/$defs/<name>.definitions.N``. Refs that are not JSON
    pointers into the document stay as they are (the grammar engine judges them)."""
    if ref == "#":
        return f"#/$defs/{name}"
    if not ref.startswith("#/"):
        return ref
    parts = ref[2:].split("/")
    if parts[0] in ("$defs", "definitions") and len(parts) > 1:
        return "/".join([f"#/$defs/{name}.{parts[0]}.{parts[1]}", *parts[2:]])
    return f"#/$defs/{name}/{ref[2:]}"


def _rewrite_refs(node: Any, name: str) -> Any:
    if isinstance(node, list):
        return [_rewrite_refs(x, name) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str):
            out[key] = _local_ref(value, name)
        elif key in _DATA_KEYWORDS:
            out[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {k: _rewrite_refs(v, name) for k, v in value.items()}
        else:
            out[key] = _rewrite_refs(value, name)
    return out


def _hoisted(name: str, schema: dict, defs: dict) -> dict:
    """Tool ``name``'s arguments schema as it sits inside the call schema. A schema with
    ``$defs`` / ``definitions`` or a local ``$ref`` (pydantic's sub-models, recursive schemas)
    refers to its own root, which is no longer the document's: it moves into ``defs`` (the call
    schema's root ``$defs``) with its definitions beside it and every local ``$ref`` rewritten,
    and a ``$ref`` to it takes its place. Any other schema stays inline, unchanged."""
    own = {key: schema[key] for key in ("$defs", "definitions") if isinstance(schema.get(key), dict)}
    rewritten = _rewrite_refs(schema, name)
    if not own and rewritten == schema:
        return schema
    defs[name] = {k: v for k, v in rewritten.items() if k not in own}
    for key, entries in own.items():
        for entry, sub in entries.items():
            defs[f"{name}.{key}.{entry}"] = _rewrite_refs(sub, name)
    return {"$ref": f"#/$defs/{name}"}


# a Command R7B call's number: the template numbers its calls "0", "1", ... (a call's OpenAI id
# is the server's own, as the other conventions'); short, so a model cannot write one forever
ACTION_ID = {"type": "string", "pattern": "^[0-9]{1,4}$"}


def _call_schema(fmt: ToolFormat, tool: dict, defs: dict) -> dict:
    fn = tool["function"]
    params = _hoisted(fn["name"], arguments_schema(fn), defs)
    props = {fmt.name_key: {"const": fn["name"]}, fmt.arguments_key: params}
    if fmt.kind == COMMAND_R7B:
        props = {"tool_call_id": ACTION_ID, **props}
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False}


def tool_grammar(fmt: ToolFormat, tools: Sequence[dict], choice: str | dict,
                 parallel: bool = True) -> str:
    """The Lark grammar (``%llguidance``) of a reply under ``choice``: "auto" (text, then calls),
    "required" (calls only), {"type": "function", "function": {"name": N}} (one call of N) or
    "none" (text that opens no call). ``parallel`` False allows one call. ``tools``: validated
    OpenAI tool objects."""
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    chosen = [t for t in tools if named is None or t["function"]["name"] == named]
    defs: dict = {}  # the arguments schemas that refer to their own root (_hoisted)
    head = "%llguidance {}\n"
    if fmt.kind == GENERIC:
        reply = _generic_schema(fmt, chosen, choice, parallel, defs)
        if defs:
            reply["$defs"] = defs
        reply["x-guidance"] = JSON_OPTIONS
        return head + f"start: %json {json.dumps(reply, ensure_ascii=False)} BLANK?\n" + BLANK
    one = _call_schema(fmt, chosen[0], defs) if len(chosen) == 1 else {
        "anyOf": [_call_schema(fmt, t, defs) for t in chosen]}
    if fmt.kind == COMMAND_R7B:  # one list of calls
        one = {"type": "array", "items": one, "minItems": 1, **({} if parallel else
                                                                 {"maxItems": 1})}
    if defs:
        one["$defs"] = defs
    # whitespace between JSON tokens and unimplemented keywords as for --json-schema
    one["x-guidance"] = JSON_OPTIONS
    body = "%json " + json.dumps(one, ensure_ascii=False)
    # blanks may end a reply of calls: a model that writes a newline after its last call would
    # otherwise be held to another call (Qwen2.5-Coder does, calling until max_tokens)
    if fmt.kind == COMMAND_R7B:
        return head + _cohere_rules(fmt, body, choice)
    if fmt.kind == LLAMA3:
        # a reply is a call, or text that does not start with "{"
        text = 'TEXT: /([ \\t\\n]*[^{ \\t\\n](.|\\n)*)?/\n'
        if choice == "none":
            return head + "start: TEXT\n" + text
        if choice == "auto":
            return head + f"start: call | TEXT\ncall: {body}\n" + text
        return head + f"start: {body} BLANK?\n" + BLANK
    open_ = OPEN if fmt.special_open else json.dumps(OPEN)
    close = CLOSE if fmt.special_close else json.dumps(CLOSE)
    call = f'call: {open_} "\\n" {body} "\\n" {close}\n'
    # TEXT holds no opening tag, spelled out or (a special token is no character) as the token:
    # a call always starts where the grammar binds it
    text = f"TEXT: /(.|\\n)*/ & ~/(.|\\n)*{_regex(OPEN)}(.|\\n)*/\n"
    if choice == "none":
        return head + "start: TEXT\n" + text
    if choice == "auto":
        calls = "(TEXT call)*" if parallel else "(TEXT call)?"
        if not fmt.special_open:
            # a spelled-out tag ends the text inside one lazy lexeme (llguidance's structural
            # tags): a greedy TEXT lexeme would never hand the tag over
            calls = calls.replace("TEXT call", "call")
            call = (f'call: opening "\\n" {body} "\\n" {close}\n'
                    f"opening[lazy]: TEXT {open_}\n")
        return head + f"start: {calls} TEXT\n" + call + text
    more = ' ("\\n" call)*' if parallel else ""
    return head + f"start: call{more} BLANK?\n" + call + BLANK


def _cohere_rules(fmt: ToolFormat, body: str, choice: str | dict) -> str:
    """The rules of a Command R7B reply whose list of calls is ``body`` (``%json``). ``auto``:
    anything up to ``<|START_ACTION|>`` (plan and answer unconstrained, as llama-server's lazy
    grammar), then the list and ``<|END_ACTION|>``; ``none``: anything without it; ``required``
    and a named function: an optional plan, then the calls. A marker that is one special token
    is named (no text lexeme can hold it), else spelled out, and a spelled-out marker ends the
    text before it inside one lazy lexeme (as hermes's tag)."""
    def tag(marker: str) -> str:
        return marker if marker in fmt.specials else json.dumps(marker)

    calls = f"calls: BLANK? {body} BLANK? {tag(ACTION_CLOSE)}\n" + BLANK
    if choice not in ("auto", "none"):
        if THINK_OPEN in fmt.specials and THINK_CLOSE in fmt.specials:
            plan = f"plan: {THINK_OPEN} FREE? {THINK_CLOSE}\nFREE: /(.|\\n)+/\n"
        else:
            plan = (f"plan[lazy]: {tag(THINK_OPEN)} PLAN {tag(THINK_CLOSE)}\n"
                    "PLAN: /(.|\\n)*/\n")
        return f"start: plan? BLANK? {tag(ACTION_OPEN)} calls BLANK?\n" + plan + calls
    if ACTION_OPEN in fmt.specials:
        # the other markers, where special, come between the pieces of text
        pieces = " | ".join(["FREE", *(m for m in (THINK_OPEN, THINK_CLOSE, RESPONSE_OPEN,
                                                   RESPONSE_CLOSE) if m in fmt.specials)])
        text = f"text: ({pieces})*\nFREE: /(.|\\n)+/\n"
        if choice == "none":
            return "start: text\n" + text
        return f"start: text ({ACTION_OPEN} calls BLANK?)?\n" + text + calls
    text = f"TEXT: /(.|\\n)*/ & ~/(.|\\n)*{_regex(ACTION_OPEN)}(.|\\n)*/\n"
    if choice == "none":
        return "start: TEXT\n" + text
    return (f"start: TEXT | opening calls BLANK?\nopening[lazy]: TEXT {tag(ACTION_OPEN)}\n"
            + text + calls)


def _generic_schema(fmt: ToolFormat, chosen: Sequence[dict], choice: str | dict, parallel: bool,
                    defs: dict) -> dict:
    """The JSON schema of a generic reply: the calls' object (``tool_calls``, a list of at least
    one call; ``tool_call``, one call, when ``parallel`` is off), the response's
    (``{"response": string}``), or under ``auto`` either."""
    def obj(key: str, value: dict) -> dict:
        return {"type": "object", "properties": {key: value}, "required": [key],
                "additionalProperties": False}

    response = obj("response", {"type": "string"})
    if choice == "none":
        return response
    one = [_call_schema(fmt, t, defs) for t in chosen]
    call = one[0] if len(one) == 1 else {"anyOf": one}
    calls = (obj("tool_calls", {"type": "array", "items": call, "minItems": 1}) if parallel else
             obj("tool_call", call))
    return {"anyOf": [calls, response]} if choice == "auto" else calls


def _regex(text: str) -> str:
    return "".join("\\" + c if c in "\\.^$*+?()[]{}|/" else c for c in text)
