"""Parsers of option values that are more than a type and a range: a JSON Schema, RPC server
addresses, a tensor split. Each raises InputError naming the option (``param``); the options table
applies
them (its ``normalize`` hooks) when a Request / LoadOptions is made, so before anything loads."""
from __future__ import annotations

import math
import re
from typing import Any

from ..errors import InputError

__all__ = ["normalize_json_schema", "parse_endpoints", "parse_tensor_split", "parse_synth_rates"]


def check_template(value: Any, param: str = "chat_template_file") -> Any:
    """A Jinja chat template's text, checked to compile (None stays None). Raises InputError
    (``param``) for empty text or a syntax error, with its line."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{{{param}}} is empty: give a Jinja chat template", param=param)
    import jinja2  # (optional at import: only a given template needs it)
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    # the syntax chat templates are rendered with: loop controls and the generation tag
    env = jinja2.Environment(extensions=[Jinja2ChatFormatter.IgnoreGenerationTags,
                                         "jinja2.ext.loopcontrols"])
    try:
        env.parse(value)
    except jinja2.TemplateSyntaxError as e:
        raise InputError(f"{{{param}}} is not a valid Jinja template: {e.message} at "
                         f"line {e.lineno}", param=param) from None
    return value


def builtin_chat_templates() -> tuple[str, ...]:
    """The names of llama.cpp's built-in chat templates (``llama_chat_builtin_templates``)."""
    import ctypes

    import llama_cpp  # (lazy: only --chat-template NAME needs the list)

    n = llama_cpp.llama_chat_builtin_templates(None, 0)
    names = (ctypes.c_char_p * n)()
    llama_cpp.llama_chat_builtin_templates(names, n)
    return tuple(name.decode("utf-8") for name in names)


def check_chat_template(value: Any) -> Any:
    """``--chat-template``'s value: the name of one of llama.cpp's built-in templates, or a
    Jinja template's text (checked to compile). A single word without Jinja markup that names
    no built-in template is refused (a misspelt name would otherwise be a template that
    prints itself)."""
    if value is None:
        return None
    if isinstance(value, str) and value in builtin_chat_templates():
        return value
    if isinstance(value, str) and value.strip() and not value.split()[1:] and \
            "{{" not in value and "{%" not in value:
        raise InputError(f"{{chat_template}} {value[:80]!r} is neither the name of a built-in "
                         f"template ({', '.join(builtin_chat_templates())}) nor a Jinja "
                         "template", param="chat_template")
    return check_template(value, "chat_template")


def normalize_json_schema(value: Any) -> Any:
    """A JSON Schema as a dict / bool or as JSON text -> compact JSON text, properties in the
    order given (the output follows it; None stays None). ``true`` (any JSON) is ``{}``.
    Raises InputError (param json_schema) for empty text, text that is not JSON, a value that
    cannot be JSON, a non-object schema or ``false`` (it matches nothing)."""
    import json

    if value is None:
        return None
    if isinstance(value, str):
        if not value.strip():
            raise InputError("{json_schema} is empty: give a JSON Schema object",
                             param="json_schema")
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise InputError(f"{{json_schema}} is not valid JSON ({e.msg} at line {e.lineno} "
                             f"column {e.colno}): give a JSON Schema object",
                             param="json_schema") from None
    if value is True:
        value = {}
    if value is False:
        raise InputError("{json_schema} is false, which no JSON matches: give a JSON Schema "
                         "object ({} or true = any JSON)", param="json_schema")
    if not isinstance(value, dict):
        raise InputError(f"{{json_schema}} must be a JSON Schema object, got "
                         f"{type(value).__name__}", param="json_schema")
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)  # key order matters
    except (TypeError, ValueError) as e:
        raise InputError(f"{{json_schema}} is not JSON data ({e}): use dicts, lists, strings, "
                         "numbers, booleans and None only", param="json_schema") from None


def normalize_logit_bias(value: Any) -> str | None:
    """llama-server's ``logit_bias`` -> compact JSON text ``[[key, bias], ...]`` in the order given
    (None, ``{}`` and ``[]`` -> None: no bias). It takes an object ``{key: bias}`` (OpenAI's form)
    or a list of ``[key, bias]`` pairs (or that JSON text); a key is a token id (an integer, or
    text that is one: ``"15"``) or any other text, which the engine tokenizes (no BOS, no special
    tokens) and biases token by token; a bias is a finite number added to the verifier's logit (and
    the draft's), or ``false``: the token is banned (-inf). Raises InputError (param logit_bias)
    for any other shape, a ``true`` or non-finite bias, or a key that is neither."""
    import json

    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise InputError(f"{{logit_bias}} is not valid JSON ({e.msg}): give an object "
                             "{token: bias} or a list of [token, bias] pairs",
                             param="logit_bias") from None
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, (list, tuple)):
        pairs = []
        for item in value:
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                raise InputError(f"{{logit_bias}} entries must be [token, bias] pairs, got "
                                 f"{json.dumps(item, default=str)[:40]}", param="logit_bias")
            pairs.append(tuple(item))
    else:
        raise InputError(f"{{logit_bias}} must be an object {{token: bias}} or a list of "
                         f"[token, bias] pairs, got {type(value).__name__}", param="logit_bias")
    out = []
    for key, bias in pairs:
        if isinstance(key, str) and re.fullmatch(r"\s*[+-]?\d+", key):
            key = int(key)  # an id written as text (JSON object keys are strings)
        elif isinstance(key, bool) or not isinstance(key, (int, str)) or key == "":
            raise InputError(f"{{logit_bias}} keys are token ids or non-empty text, got "
                             f"{key!r}", param="logit_bias")
        if bias is False:
            bias = False  # a ban: -inf on the logit
        elif (isinstance(bias, bool) or not isinstance(bias, (int, float))
              or not math.isfinite(bias)):
            raise InputError(f"{{logit_bias}} of {key!r} must be a finite number, or false to "
                             f"ban the token; got {bias!r}", param="logit_bias")
        out.append([key, bias if bias is False else float(bias)])
    return json.dumps(out, separators=(",", ":"), ensure_ascii=False) if out else None


def parse_endpoints(text: str, param: str = "rpc") -> list[str]:
    """``HOST:PORT[,HOST:PORT...]`` (llama.cpp's ``--rpc`` format) -> the endpoints, in order.
    Raises InputError naming the malformed entry."""
    out = []
    for item in (s.strip() for s in text.split(",")):
        host, sep, port = item.rpartition(":")
        if not item or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InputError(f"{{{param}}} entry {item!r} is not HOST:PORT (e.g. "
                             "192.168.1.20:50052); separate servers with commas", param=param)
        if "[" in host or ":" in host:
            raise InputError(f"{{{param}}} entry {item!r}: llama.cpp's RPC client takes IPv4 "
                             "addresses or host names, not IPv6", param=param)
        if item in out:
            raise InputError(f"{{{param}}} lists {item} twice", param=param)
        out.append(item)
    return out


def parse_tensor_split(text: str) -> list[float]:
    """``3,1`` (llama.cpp's ``--tensor-split``: the proportion of the model per device, in device
    order) -> [3.0, 1.0]. Raises InputError for a non-number, a value that is not finite (``inf``,
    ``nan``, ``1e400``), a negative value or all zeros."""
    try:
        values = [float(s) for s in text.replace("/", ",").split(",")]
    except ValueError:
        raise InputError(f"{{tensor_split}} must be comma-separated numbers (e.g. 3,1), got "
                         f"{text!r}", param="tensor_split") from None
    bad = next((v for v in values if not math.isfinite(v)), None)
    if bad is not None:  # float("1e400") is inf: a proportion must be a finite number
        raise InputError(f"{{tensor_split}} needs finite proportions (e.g. 3,1), got {bad} in "
                         f"{text!r}", param="tensor_split")
    if any(v < 0 for v in values) or not any(values):
        raise InputError(f"{{tensor_split}} needs non-negative proportions, not all 0; got {text!r}",
                         param="tensor_split")
    return values


def _endpoints(value: Any, name: str) -> Any:
    """``--rpc`` text checked and written without spaces; other types are left to the type check."""
    return ",".join(parse_endpoints(value, name)) if isinstance(value, str) else value


def _nonempty(value: Any, name: str) -> Any:
    """A text option that must say something (``--alias``): InputError for empty or blank text."""
    if isinstance(value, str) and not value.strip():
        raise InputError(f"{{{name}}} is empty: give a name", param=name)
    return value


def _tensor_split(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    return ",".join(f"{v:g}" for v in parse_tensor_split(value))


def parse_names(text: str | None) -> tuple[str, ...]:
    """A comma-separated list of names (``--alias``, ``--tags``, ``--host``), each stripped, the
    empty ones left out, in the order given, once each."""
    if text is None:
        return ()
    return tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))


def _names(value: Any, name: str) -> Any:
    """A comma-separated option that must name at least one thing: InputError otherwise."""
    if isinstance(value, str) and not parse_names(value):
        raise InputError(f"{{{name}}} names nothing: give one or more names, comma-separated",
                         param=name)
    return value


def _hosts(value: Any) -> Any:
    """``--host``: one address or several, comma-separated (llama-server's form); each an IP
    address or a host name. InputError for none, or for a Unix socket (``*.sock``), which llama-server
    takes and this server does not listen on."""
    _names(value, "host")
    for host in parse_names(value) if isinstance(value, str) else ():
        if host.endswith(".sock"):
            raise InputError(f"{{host}} {host!r} is a Unix socket: this server listens on TCP "
                             "addresses only", param="host")
    return value


def parse_synth_rates(value: Any) -> tuple[float, ...]:
    """llama-server's ``--spec-synth-rates P0,P1,...`` (text, or a list of numbers from a request
    body) -> the rates: r_i = the probability that draft position i (0-based) is accepted,
    unconditionally. Raises InputError (param spec_synth_rates) for a non-number, a rate that is
    not finite or outside [0, 1], or a rate above the one before it (llama-server's rules)."""
    name = "spec_synth_rates"
    try:
        items = value.split(",") if isinstance(value, str) else list(value)
        rates = tuple(float(v) for v in items if not isinstance(v, bool))
        if len(rates) != len(items):
            raise ValueError
    except (TypeError, ValueError):
        raise InputError(f"{{{name}}} must be comma-separated numbers (e.g. 0.8,0.6,0.4), got "
                         f"{value!r}", param=name) from None
    if not all(math.isfinite(r) and 0.0 <= r <= 1.0 for r in rates):
        raise InputError(f"{{{name}}} must be finite and within [0, 1], got {value!r}", param=name)
    if any(b > a for a, b in zip(rates, rates[1:])):
        raise InputError(f"{{{name}}} must not increase from one position to the next (each is "
                         f"the chance of reaching that position), got {value!r}", param=name)
    return rates


def _synth_rates(value: Any) -> Any:
    """``--spec-synth-rates`` checked and written as canonical text (None stays None)."""
    if value is None:
        return None
    return ",".join(repr(r) for r in parse_synth_rates(value))
