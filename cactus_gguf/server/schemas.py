"""The OpenAI request bodies the server accepts, and how they become an engine Request.

Field names are OpenAI's (``max_tokens``, ``max_completion_tokens``, ``stop``, ``seed``,
``stream_options``...) plus llama.cpp's extensions (``top_k``, ``min_p``, ``cache_prompt``) and
cactus-gguf's ``speculative`` object (every speculation setting of the options table: ``method``,
``delta``, ``k`` (an integer or ``"auto"``), ``top_gap``, ``protect_ends``, ``ears_alpha``,
``draft_min``, ...; generated in speculative.py; or ``false``: the verifier alone for this
request). Structured output: OpenAI's ``response_format``
(``{"type": "json_object"}``, ``{"type": "json_schema", "json_schema": {"schema": {...}}}``) and
llama-server's ``grammar`` (GBNF) and ``json_schema`` fields. Values are validated by the one options
schema (the options table), so the server accepts exactly what ``cactus-gguf run`` accepts; an
error names
the field as the client wrote it. Fields that would change what a response means and that this
server does not implement (legacy functions, penalties, several choices) are refused with a 400,
never silently ignored.

llama-server's own answer-changing fields: ``n_predict`` is its name of ``max_tokens`` (-1 = no
limit); ``n_probs`` and ``post_sampling_probs`` ask for log-probabilities, as OpenAI's
``logprobs`` / ``top_logprobs`` do (logprobs.py); ``repeat_penalty``, ``typical_p``,
``mirostat``, ``dry_multiplier``, ``xtc_probability``, ``top_n_sigma``, ``dynatemp_range``,
``min_keep``, ``n_cmpl``, ``n_indent`` and ``t_max_predict_ms`` (honoured by
/infill), ``grammar_lazy``, ``lora`` and ``samplers``
are not implemented and are refused unless they hold the value that changes nothing
(repeat_penalty 1, mirostat 0, ...), which llama-server also treats as off. ``logit_bias`` and
``ignore_eos`` are honoured: added to the verifier's and the draft's logits before the warps
(docs/maths.md "Logit bias"); so are the stream telemetry fields ``timings_per_token`` and
``return_progress`` (core.py).

Validation follows OpenAI's: types are strict (``"stream": "yes"``, ``"max_tokens": "3"`` or
``3.5`` are a 400, not coerced; an integer is a valid float), at most 4 stop strings, none empty,
``max_tokens`` >= 1 (left out: the server's ``-n``, which may be -1 = no limit).
"""
from __future__ import annotations

import json
from typing import Any, Literal, Union

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo,
                      field_validator)

from ..errors import InputError
from ..options.speculation import check_speculation
from .logprobs import request_fields as logprob_fields
from .speculative import SPECULATIVE_FIELDS, Speculative

MAX_STOP = 4  # OpenAI's limit on stop strings
MAX_N = 16  # choices per prompt (n); the prompts x n choices are generated one after another

# Strict types, as OpenAI validates: no "3" for 3, no "yes" for true (an int is a valid float).
_STRICT = ConfigDict(strict=True)

__all__ = ["ChatCompletionRequest", "CompletionRequest", "Speculative", "to_request",
           "openai_param"]


class JsonSchemaFormat(BaseModel):
    """OpenAI's ``response_format.json_schema``: ``schema`` is the JSON Schema (``name``,
    ``description`` and ``strict`` are accepted; the output always follows the schema)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)
    name: str | None = None
    description: str | None = None
    strict: bool | None = None
    schema_: Union[dict[str, Any], bool, None] = Field(default=None, alias="schema")


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``: ``text`` (no constraint), ``json_object``, ``json_schema``;
    llama-server's ``{"type": "json_object", "schema": {...}}``: JSON following the schema."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    # llama-server's: a json_object that follows this schema
    schema_: Union[dict[str, Any], bool, None] = Field(default=None, alias="schema")


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: str
    text: str | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Union[str, list[ContentPart], None] = None


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # unknown: see unsupported()
    model: str | None = None
    max_tokens: int | None = None
    n_predict: int | None = None  # llama-server's name of max_tokens (-1: no limit)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    stop: Union[str, list[str], None] = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    user: str | None = None
    cache_prompt: bool | None = None
    id_slot: int | None = None  # llama-server's: the slot to run on (-1: any)
    speculative: Union[Speculative, bool, None] = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    # llama-server's forms: {token: bias} or [[token, bias], ...], a token an id or text, a bias
    # a number or false (banned); checked by the options table (options/values.py)
    logit_bias: Union[dict[str, Any], list[Any], None] = None
    ignore_eos: bool | None = None  # llama-server's: every end-of-generation token banned
    # llama-server's stream telemetry: each chunk's timings, prompt_progress chunks
    timings_per_token: bool | None = None
    return_progress: bool | None = None
    logprobs: Union[bool, int, None] = None
    response_format: ResponseFormat | None = None
    grammar: str | None = None  # llama-server's: GBNF text
    json_schema: Union[dict[str, Any], bool, None] = None  # llama-server's: a JSON Schema
    verbose: bool | None = None  # llama-server's: the answer also carries __verbose (openai_api)


class ChatCompletionRequest(_Common):
    messages: list[Message]
    max_completion_tokens: int | None = None
    top_logprobs: int | None = None
    # the chat template's switches (Hugging Face's names, as llama-server and vLLM take them): a
    # final assistant message is continued unless continue_final_message is false
    add_generation_prompt: bool = True
    continue_final_message: bool | None = None
    # llama-server's: variables for the chat template (enable_thinking, ...: Engine.template_variables)
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("messages")
    @classmethod
    def _not_empty(cls, messages: list[Message], info: ValidationInfo) -> list[Message]:
        """At least one message (OpenAI's check), unless the body is another API's converted
        one that allows none (``chat_request``'s ``empty``: an Anthropic body, as llama-server
        renders its empty list)."""
        if not messages and not (info.context or {}).get("empty_messages"):
            raise ValueError("List should have at least 1 item after validation, not 0")
        return messages


class CompletionRequest(_Common):
    # a prompt (text or ids) or several (texts, id lists, or both): one choice each
    prompt: Union[str, list[int], list[Union[str, list[int]]]]
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None


# Fields that change a response's meaning and are not implemented: refused, not ignored.
_REFUSED = {
    "functions": "legacy function calls", "function_call": "legacy function calls",
    "audio": "audio output", "modalities": "output modalities", "prediction": "predicted outputs",
}


def _number(test):
    """A neutral-value test of a numeric field: a number (not a bool) that passes ``test``."""
    return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and test(v)


# llama-server's fields that change the answer and are not implemented here: accepted at the value
# that leaves sampling as it is (as llama-server itself skips the sampler there: common/sampling.cpp
# and src/llama-sampler.cpp of the vendored llama.cpp), refused at any other. The fields that only
# tune one of these (repeat_last_n, mirostat_tau, dry_base, xtc_threshold, ...) change nothing
# while it is off. (field, what the neutral value is, its test)
_NEUTRAL = (
    ("repeat_penalty", "1", _number(lambda v: v == 1)),
    ("typical_p", "1", _number(lambda v: v >= 1)),
    ("mirostat", "0", _number(lambda v: v == 0)),
    ("dry_multiplier", "0", _number(lambda v: v == 0)),
    ("xtc_probability", "0", _number(lambda v: v <= 0)),
    ("top_n_sigma", "-1", _number(lambda v: v <= 0)),
    ("dynatemp_range", "0", _number(lambda v: v <= 0)),
    ("min_keep", "0", _number(lambda v: v == 0)),
    ("n_cmpl", "1", _number(lambda v: v == 1)),
    ("n_indent", "0", _number(lambda v: v == 0)),  # honoured by /infill (fim.py), a field there
    ("t_max_predict_ms", "0 or -1", _number(lambda v: v <= 0)),  # as n_indent
    ("grammar_lazy", "false", lambda v: v is False),
    ("lora", "[]", lambda v: v == []),
)


def unsupported(body: _Common) -> tuple[str, str] | None:
    """(field, why) of the first field this server would have to ignore, or None."""
    extra = body.model_extra or {}
    for name, what in _REFUSED.items():
        value = extra.get(name)
        if value is not None and value != []:
            return name, f"{what} are not supported by this server" if what.endswith("s") else \
                f"{what} is not supported by this server"
    for name, neutral, is_neutral in _NEUTRAL:
        if name in extra and extra[name] is not None and not is_neutral(extra[name]):
            return name, (f"{name} is not supported by this server (only {neutral}, which "
                          f"changes nothing), got {json.dumps(extra[name])[:40]}: leave it out")
    if extra.get("samplers") is not None:  # llama-server's sampler order
        return "samplers", ("samplers is not supported by this server: both models are warped "
                            "by top_k, top_p, min_p, then temperature (llama.cpp's default order), "
                            "so the acceptance test compares like with like: leave it out")
    if not 1 <= body.n <= MAX_N:
        return "n", f"n must be in [1, {MAX_N}] (choices per prompt), got {body.n}"
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(body, name):
            return name, f"{name} is not supported by this server (only 0)"
    if isinstance(body, CompletionRequest):
        if body.echo:
            return "echo", "echo is not supported by this server"
        if body.best_of not in (None, 1):
            return "best_of", "only best_of=1 is supported"
    return None


# Request option name -> the OpenAI field a client wrote it as.
_OPENAI_NAMES = {"n_predict": "max_tokens",
                 **{name: f"speculative.{name}" for name in SPECULATIVE_FIELDS}}


def openai_param(option: str | None, body: _Common | None = None) -> str | None:
    """How the client named the option at fault (``n_predict`` -> ``max_tokens``...)."""
    if option == "n_predict" and isinstance(body, ChatCompletionRequest) and \
            body.max_completion_tokens is not None:
        return "max_completion_tokens"
    if option == "n_predict" and body is not None and body.n_predict is not None:
        return "n_predict"
    if option in ("json_schema", "json_object") and body is not None and \
            body.response_format is not None:
        return "response_format"
    return _OPENAI_NAMES.get(option, option) if option else None


def constraint_fields(body: _Common) -> dict[str, Any]:
    """The Request's output-constraint fields a body sets (all three, so a request's constraint
    replaces the server's default one); {} when the body names none. InputError for a
    ``json_schema`` response_format without its schema, or two constraints at once."""
    given = {}
    rf = body.response_format
    if rf is not None:
        if rf.type == "json_object" and rf.schema_ is not None:  # llama-server's extension
            given["json_schema"] = rf.schema_
        elif rf.type == "json_object":
            given["json_object"] = True
        elif rf.type == "json_schema":
            if rf.json_schema is None or rf.json_schema.schema_ is None:
                raise InputError('response_format of type "json_schema" needs '
                                 '"json_schema": {"schema": {...}}', param="response_format")
            given["json_schema"] = rf.json_schema.schema_
    if body.grammar is not None:
        given["grammar"] = body.grammar
    if body.json_schema is not None:
        given["json_schema"] = body.json_schema
    if len(given) > 1 or (rf is not None and rf.type != "text" and body.json_schema is not None):
        raise InputError("give one output constraint: response_format, grammar or json_schema",
                         param="response_format" if rf is not None else "grammar")
    if not given and rf is None:
        return {}
    return {"grammar": None, "json_schema": None, "json_object": False, **given}


def overrides(body: _Common) -> dict[str, Any]:
    """The Request fields a body sets (everything else keeps the server's defaults).
    InputError for what OpenAI refuses and the options schema allows: max_tokens < 1 (the
    schema's -1 = no limit is the server's -n, when a body leaves max_tokens out), more than
    MAX_STOP stop strings."""
    out: dict[str, Any] = {}
    n = getattr(body, "max_completion_tokens", None)
    name = "max_completion_tokens" if n is not None else "max_tokens"
    n = n if n is not None else body.max_tokens
    if n is not None:
        if n < 1:
            raise InputError(f"{name} must be >= 1, got {n} (leave it out for the server's "
                             "default, its -n)", param=name)
        out["n_predict"] = n
    if body.n_predict is not None:  # llama-server's name, and its -1 = no limit
        if n is not None and n != body.n_predict:
            raise InputError(f"n_predict is llama-server's name of {name}: give one of them, not "
                             f"both ({body.n_predict} and {n})", param="n_predict")
        if body.n_predict < 1 and body.n_predict != -1:
            raise InputError(f"n_predict must be >= 1, or -1 = until the end of generation or a "
                             f"full context (as llama-server), got {body.n_predict}",
                             param="n_predict")
        out["n_predict"] = body.n_predict
    for name in ("temperature", "top_p", "top_k", "min_p", "seed", "cache_prompt", "logit_bias",
                 "ignore_eos", "timings_per_token", "return_progress", "id_slot"):
        value = getattr(body, name)
        if value is not None:
            out[name] = value
    if body.stop is not None:
        out["stop"] = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop)
        if len(out["stop"]) > MAX_STOP:
            raise InputError(f"stop takes at most {MAX_STOP} strings (as OpenAI), got "
                             f"{len(out['stop'])}", param="stop")
    speculative = body.speculative
    if speculative is False:
        out["method"] = "none"
    elif isinstance(speculative, Speculative):
        out.update({k: v for k, v in speculative.model_dump().items() if v is not None})
    elif speculative is True or speculative is None:
        pass
    out.update(constraint_fields(body))
    # log-probabilities: OpenAI's logprobs / top_logprobs, llama-server's n_probs; every route
    # reads the raw log-softmax unless post_sampling_probs is true (server/logprobs.py)
    out.update(logprob_fields(body, chat=isinstance(body, ChatCompletionRequest),
                              post_sampling=getattr(body, "POST_SAMPLING_PROBS", False)))
    return out


def to_request(base, body: _Common):
    """``base`` (the server's default Request) with the body's fields; InputError naming the
    OpenAI field for a value the options schema refuses, or for a combination ``cactus-gguf run``
    refuses (options/speculation.py: the one check both make, ``given`` = the fields the body
    sets; the server's own defaults were checked when it started)."""
    refused = unsupported(body)
    if refused:
        raise InputError(refused[1], param=refused[0])
    try:
        changes = overrides(body)
        request = base.replace(**changes)
        check_speculation(request, given=changes)
        return request
    except InputError as e:  # named as the client wrote it: max_tokens, speculative.k ...
        raise InputError(e.render(lambda n: openai_param(n, body)),
                         param=openai_param(e.param, body)) from None


def chat_messages(body: ChatCompletionRequest) -> list[dict]:
    """The messages as the chat template takes them: text, or a list of text parts, which
    reaches the template as llama-server gives it (a list for a template that reads typed
    content, joined with newlines for one that takes text: prompting/text.py); "developer" is
    OpenAI's newer name of "system"."""
    out = []
    for i, m in enumerate(body.messages):
        content = m.content
        if isinstance(content, list):
            parts = []
            for part in content:
                if part.type != "text" or part.text is None:
                    raise InputError(f"messages[{i}].content: only text parts are supported, got "
                                     f"{part.type!r}", param=f"messages[{i}].content")
                parts.append({"type": "text", "text": part.text})
            content = parts
        out.append({"role": "system" if m.role == "developer" else m.role,
                    "content": content or "", **reasoning_of(m, i)})
    return out


def reasoning_of(message: Message, i: int) -> dict[str, str]:
    """``{"reasoning_content": text}`` of an assistant message that carries its reasoning
    (llama-server's field; a thinking template renders it, e.g. in ``<think>``), else {}."""
    reasoning = (message.model_extra or {}).get("reasoning_content")
    if reasoning is None or message.role != "assistant":
        return {}
    if not isinstance(reasoning, str):
        raise InputError(f"messages[{i}].reasoning_content must be a string",
                         param=f"messages[{i}].reasoning_content")
    return {"reasoning_content": reasoning}


def given(**fields: Any) -> dict[str, Any]:
    """The fields that are set (not None): what a converted body passes on (responses.py,
    anthropic.py), leaving the rest to the chat body's defaults."""
    return {name: value for name, value in fields.items() if value is not None}


def chat_request(body: dict, empty: bool = False) -> ChatCompletionRequest:
    """A chat body another API converted (responses.py, anthropic.py), validated; InputError
    naming the place at fault (``messages.1.content``). ``empty``: no message is a chat too
    (the template renders an empty list)."""
    try:
        return ChatCompletionRequest.model_validate(body, context={"empty_messages": empty})
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InputError(f"{where}: {first['msg']}", param=where) from None


def chat_format(body: ChatCompletionRequest) -> dict[str, Any]:
    """The chat template's switches of a body, as Engine.format_chat takes them. InputError for
    ``continue_final_message`` true with ``add_generation_prompt`` true (its default), as
    llama-server and vLLM refuse it: the last message is either continued or followed by the
    assistant's new turn."""
    if body.continue_final_message and body.add_generation_prompt:
        raise InputError("continue_final_message and add_generation_prompt cannot both be true: "
                         "set add_generation_prompt false to continue the last assistant message",
                         param="continue_final_message")
    return {"add_generation_prompt": body.add_generation_prompt,
            "continue_final_message": body.continue_final_message,
            "template_kwargs": body.chat_template_kwargs}


def completion_prompts(body: CompletionRequest) -> list[str | list[int]]:
    """The prompts of a body, each a string or token ids: one, or a list of several (strings or
    id lists, OpenAI's batched prompt). InputError for an empty one."""
    p = body.prompt
    if isinstance(p, list) and p and all(isinstance(x, int) for x in p):
        return [p]  # token ids: one prompt
    prompts = p if isinstance(p, list) else [p]
    # (an empty string is a prompt: the model's BOS, when it adds one; the engine says if not)
    if not prompts or any(isinstance(x, list) and not x for x in prompts):
        raise InputError("the prompt is empty", param="prompt")
    if any(isinstance(x, int) for x in prompts):
        raise InputError("prompt: token ids and strings cannot be mixed in one list (give a "
                         "list of id lists and strings for several prompts)", param="prompt")
    return prompts


def completion_prompt(body: CompletionRequest) -> str | list[int]:
    """The one prompt of a body (completion_prompts); InputError when it has several."""
    prompts = completion_prompts(body)
    if len(prompts) != 1:
        raise InputError(f"this needs one prompt, got {len(prompts)}", param="prompt")
    return prompts[0]
