"""From the options a user gave (by name, as in cactus_gguf/options/) to a finished generation.

``plan_run`` settles every option — the user's values, else a registry pair's recommendation, else
the default — validates them and reads the prompt, all *before* any model is fetched or loaded;
``execute_run`` loads the pair and generates. The CLI is a thin wrapper over these two calls;
embedders who already have paths use :class:`~cactus_gguf.speculative.Engine` directly.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from ..errors import InputError
from ..options import (BY_NAME, MODEL_DRAFTERS, SELF_DRAFTERS, LoadOptions, Request,
                      check_speculation, check_value, options_in, validate_pairing)
from ..options.rule import rule_of
from ..options.values import parse_names
from ..stats import GenerationResult

__all__ = ["RunPlan", "ServePlan", "plan_run", "plan_serve", "open_engine", "execute_run",
           "result_json", "choose_pair", "settle", "read_file_options", "Interrupted",
           "load_of"]


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run; ``result`` is what was generated until then (stop_reason
    "interrupted"), or None when it came before generation began."""

    def __init__(self, result: GenerationResult | None) -> None:
        super().__init__()
        self.result = result


@dataclass(frozen=True)
class RunPlan:
    """A validated run: the models (still specs: paths or registry names), the engine's load
    options, the request, and the prompt text (chat: to be rendered with the model's template)."""

    verifier_spec: str
    draft_spec: str | None
    pair_name: str | None
    load: LoadOptions
    request: Request
    prompt: str
    chat: bool


def choose_pair(pair: str | None, verifier: str | None, draft: str | None):
    """The registry pair to use, if any: ``pair`` by name, the default pair when no model is
    given, or the pair whose verifier and draft are the two registry names given (so naming a
    pair's models gets its settings, as naming the pair does). Returns (PairEntry or None,
    verifier spec, draft spec).

    Raises InputError for an unknown pair, or a pair given together with models.
    """
    from ..registry import load_registry

    if pair is None and (verifier is not None or draft is not None):
        return _pair_of_names(verifier, draft), verifier, draft
    if verifier is not None or draft is not None:
        raise InputError("give either {pair} or model paths/names, not both", param="pair")
    registry = load_registry()
    if pair is None:
        entry = registry.default_pair
    elif pair in registry.pairs:
        entry = registry.pairs[pair]
    else:
        raise InputError(f"unknown pair {pair!r}: see `cactus-gguf models` "
                         f"(pairs: {', '.join(sorted(registry.pairs))})", param="pair")
    return entry, entry.verifier, entry.draft


def _pair_of_names(verifier: str | None, draft: str | None):
    """The registry pair whose verifier and draft are these registry model names (not files, as
    registry.resolve_model reads them: an existing file is a path), else None."""
    if verifier is None or draft is None or any(Path(m).expanduser().is_file()
                                                for m in (verifier, draft)):
        return None
    from ..registry import load_registry

    return next((p for p in load_registry().pairs.values()
                 if (p.verifier, p.draft) == (verifier, draft)), None)


def settle(given: Mapping[str, Any], pair=None, command: str | None = None) -> dict[str, Any]:
    """Every option's value: ``given`` (what the user set), else the pair's recommendation (for
    options a pair may recommend), else the default (for ``command``, when it has its own)."""
    unknown = sorted(set(given) - set(BY_NAME))
    if unknown:
        raise InputError(f"unknown option {unknown[0]!r}", param=unknown[0])
    values = {o.name: o.default_for(command) for o in BY_NAME.values()}
    if pair is not None:  # a command's own default (bench's delta grid) stays
        values.update({name: v for name, v in pair.settings.items() if BY_NAME[name].recommend
                       and command not in BY_NAME[name].command_defaults})
    values.update(given)
    return values


def _of_scope(values: Mapping[str, Any], scope: str) -> dict[str, Any]:
    return {o.name: values[o.name] for o in options_in(scope)}


def read_prompt(prompt: str | None, file: str | None) -> str:
    """The prompt text from ``prompt`` or the UTF-8 ``file`` ("-" = standard input; a leading
    byte-order mark is dropped). Empty text is a prompt too (the engine refuses a prompt only when
    it has no tokens: empty text for a model that adds no BOS). Raises InputError (one line) for
    both or neither, a missing or non-UTF-8 file."""
    if prompt is not None and file is not None:
        raise InputError("give the prompt with {prompt} or {file}, not both", param="prompt",
                         options=("file",))
    if file is not None:
        try:
            data = sys.stdin.buffer.read() if file == "-" else Path(file).read_bytes()
        except FileNotFoundError:
            raise InputError(f"prompt file not found: {file}", param="file") from None
        except (IsADirectoryError, PermissionError, OSError) as e:
            raise InputError(f"cannot read the prompt file {file}: {e.strerror}",
                             param="file") from None
        try:
            text = data.decode("utf-8-sig")  # a leading byte-order mark (editors write one) goes
        except UnicodeDecodeError as e:
            raise InputError(f"prompt file {file} is not UTF-8 text (bad byte at offset "
                             f"{e.start}): convert it to UTF-8", param="file") from None
    elif prompt is not None:
        text = prompt
    else:
        raise InputError("no prompt: give one with {prompt} TEXT or {file} FILE", param="prompt",
                         options=("file",))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # undecodable bytes from the command line arrive as surrogates
        raise InputError(f"the prompt is not valid UTF-8 (bad byte at position {e.start}): pass "
                         "UTF-8 text, or use {file} with a UTF-8 file", param="prompt",
                         options=("file",)) from None
    return text


def _looks_like_text(name: str, value: str) -> bool:
    """Whether a file-or-text option's value is the text itself rather than a file name."""
    v = value.strip()
    if "\n" in value or not v:
        return True  # (empty: refused as empty, not looked up as a file)
    if name == "json_schema":
        return v[:1] in ("{", "[", '"') or v in ("true", "false", "null")
    return "::=" in v or "{%" in v or "{{" in v  # a grammar's rule, a Jinja template's tag


def read_file_options(values: dict[str, Any]) -> dict[str, Any]:
    """Replace, in ``values`` (option name -> value), each file-or-text option's value that names
    a file (``--grammar g.gbnf``, ``--json-schema s.json``) by the file's UTF-8 text; the text
    itself stays. Raises InputError naming the option for a missing or unreadable file."""
    for o in BY_NAME.values():
        value = values.get(o.name)
        if not o.file_or_text or not isinstance(value, str) or _looks_like_text(o.name, value):
            continue
        try:
            values[o.name] = Path(value).read_text(encoding="utf-8-sig")  # a BOM is dropped
        except FileNotFoundError:
            raise InputError(f"{{{o.name}}}: file not found: {value} (give a file, or the text "
                             "itself)", param=o.name) from None
        except UnicodeDecodeError:
            raise InputError(f"{{{o.name}}}: {value} is not UTF-8 text", param=o.name) from None
        except OSError as e:
            raise InputError(f"{{{o.name}}}: cannot read {value}: {e.strerror}",
                             param=o.name) from None
    return values


def _plan(given: Mapping[str, Any], command: str) -> tuple[RunPlan, dict[str, Any]]:
    """The models, load options and default Request of ``command`` (run or serve), validated;
    the prompt not read yet. Returns (plan, every option's settled value)."""
    pair, verifier, draft = choose_pair(given.get("pair"), given.get("model"),
                                        given.get("model_draft"))
    values = read_file_options(settle(given, pair, command))
    if verifier is None:
        raise InputError("no verifier model: give VERIFIER (a .gguf path or a registry name)",
                         param="model")
    request = Request(**_of_scope(values, "request"))  # k = 0: no speculation, no draft loaded
    load = LoadOptions(**_of_scope(values, "load"))
    if request.k == "auto" and given.get("k_max") is None and request.k_max >= load.n_batch > 1:
        # -k auto's default ceiling fits a small -b (as llama-server starts with any -b): the
        # k + 1 verified tokens must go in one llama_decode; a -k-max given is checked as is
        request = request.replace(k_max=load.n_batch - 1)
    validate_pairing(load, request)
    uses_draft = request.speculates and request.drafter in MODEL_DRAFTERS
    if uses_draft and draft is None:
        raise InputError(f"method {request.method} needs a DRAFT model; give one, or use "
                         "{drafter} ngram or {method} none", param="model_draft",
                         options=("drafter", "method"))
    if request.drafter in SELF_DRAFTERS and given.get("model_draft") is not None:
        raise InputError(f"the {request.drafter} drafter uses no draft model: drop DRAFT, "
                         "or use {drafter} model", param="drafter")
    check_speculation(request, given)  # as the server checks a request (options/speculation.py)
    check_tensor_split(load)
    plan = RunPlan(verifier_spec=verifier, draft_spec=draft if uses_draft else None,
                   pair_name=pair.name if pair is not None else None, load=load, request=request,
                   prompt="", chat=bool(values.get("chat")))
    return plan, values


def plan_run(given: Mapping[str, Any]) -> RunPlan:
    """Validate the options the user set (option name -> value) and settle the rest, without
    touching a model file (names are resolved, and fetched, by :func:`execute_run`).

    Raises InputError (one line, ``param`` = the option at fault) for any invalid option or
    unreadable prompt.
    """
    plan, values = _plan(given, "run")
    return replace(plan, prompt=read_prompt(values["prompt"], values["file"]))


@dataclass(frozen=True)
class ServePlan:
    """A validated ``serve``: the models and default Request (``run``, its prompt unused), the
    serve options (host, port, api_key, alias, strict_model, max_queue, request_timeout,
    cors_origin), validated, and the model id clients see (``alias``, else the pair's name, else
    the verifier's)."""

    run: RunPlan
    settings: dict[str, Any]  # (``hosts``: ``host``'s addresses, one or more)
    model_id: str
    aliases: tuple[str, ...] = ()  # every ``--alias`` name (the id among them)
    tags: tuple[str, ...] = ()  # ``--tags``


def plan_serve(given: Mapping[str, Any]) -> ServePlan:
    """Like :func:`plan_run` for the server. Raises InputError."""
    plan, values = _plan(given, "serve")
    settings = {}
    for o in options_in("serve"):
        value = o.normalize(values[o.name]) if o.normalize is not None else values[o.name]
        settings[o.name] = check_value(o.name, value)
    aliases = parse_names(settings["alias"])
    settings["hosts"] = parse_names(settings["host"])
    if len(settings["hosts"]) > 1 and settings["port"] == 0:
        raise InputError("{host} names several addresses: they share one port, so give one "
                         "(--port 0, any free port, would differ between them; as llama-server)",
                         param="host")
    # several aliases: the first in sorted order is the id (llama-server keeps them in a std::set)
    model_id = (min(aliases) if aliases else plan.pair_name
                or Path(plan.verifier_spec).name.removesuffix(".gguf"))
    return ServePlan(run=plan, settings=settings, model_id=model_id, aliases=aliases,
                     tags=parse_names(settings["tags"]))


def open_engine(plan: RunPlan, probe: bool = False):
    """Resolve (fetch if needed) the plan's models and load them: an Engine whose defaults are
    the plan's Request. ``probe``: under ``k="auto"``, also get this machine's forward costs now
    (a cache hit, or the probe) rather than at the first request (the server does).
    Raises ModelLoadError / VocabMismatchError / registry errors."""
    from ..registry import resolve_model
    from ..speculative import Engine

    verifier = resolve_model(plan.verifier_spec)
    draft = resolve_model(plan.draft_spec) if plan.draft_spec is not None else None
    engine = Engine(verifier, draft, plan.load, defaults=plan.request)
    r = plan.request
    if probe and r.k == "auto" and r.speculates:
        try:
            engine.forward_costs(r.k_max)
        except BaseException:
            engine.close()
            raise
    return engine


def execute_run(plan: RunPlan, on_text: Callable[[str], None] | None = None,
                interrupted: Callable[[], bool] | None = None) -> GenerationResult:
    """Resolve (fetch if needed) the models, load them and generate.

    ``interrupted``: whether an interrupt is waiting that could not be raised where it arrived
    (the CLI's SIGINT handler records one that lands inside llama.cpp's abort callback:
    llama/abort.py); the prompt's processing asks it, also inside a chunk's decode, and the run
    then ends as a Ctrl-C does.

    Raises ModelLoadError / VocabMismatchError / ContextLengthError / registry errors, all with
    one-line messages; :class:`Interrupted` (a KeyboardInterrupt) with the partial result on
    Ctrl-C; RpcServerLostError (an RPC server died) with the partial result as ``e.result``.
    """
    from ..llama.devices import RpcServerLostError

    stream = placement = None

    def placed(result: GenerationResult | None) -> GenerationResult | None:
        if result is not None:
            result.placement = placement
        return result

    try:
        with open_engine(plan) as engine:
            placement = {role: c.model.placement for role, c in
                         (("verifier", engine.verifier), ("draft", engine.draft))
                         if c is not None and c.model.placement is not None} or None
            prompt = (engine.format_chat([{"role": "user", "content": plan.prompt}])
                      if plan.chat else plan.prompt)
            stream = engine.stream(prompt, cancel=interrupted)
            for piece in stream:
                if on_text is not None:
                    on_text(piece)
            if interrupted is not None and interrupted():  # seen while the prompt was processed
                stream.result.stop_reason = "interrupted"
                stream.result.message = "interrupted during prompt processing"
                raise KeyboardInterrupt
            return placed(stream.result)
    except KeyboardInterrupt:
        raise Interrupted(placed(stream.partial()) if stream is not None else None) from None
    except RpcServerLostError as e:  # the text so far is kept: the error carries it
        e.result = placed(stream.partial("error")) if stream is not None else None
        raise


def check_tensor_split(load: LoadOptions) -> None:
    """A ``tensor_split`` with nothing to split (no layer offloaded, no offload device) is refused
    before anything loads, not ignored as llama.cpp would (llama/devices.py). InputError."""
    if load.tensor_split is not None:
        from ..llama.devices import check_tensor_split as check

        check(load.tensor_split, load.n_gpu_layers, load.device, load.rpc)


def load_of(given: Mapping[str, Any], command: str = "run") -> LoadOptions:
    """The load options of ``command`` (run or serve) under the options the user set, every one
    validated first as that command would (InputError; run's prompt is not needed): what
    ``--list-devices`` places (llama/placement.py device_report; bench's: bench/run.py
    plan_bench)."""
    if command == "serve":
        return plan_serve(given).run.load
    return _plan(given, command)[0].load


def nothing_generated(plan: RunPlan) -> GenerationResult:
    """The result of a run interrupted before generation began (while the models loaded)."""
    from ..stats import GenerationStats

    return GenerationResult(text="", tokens=[], stop_reason="interrupted", stats=GenerationStats(),
                            seed=plan.request.seed, message="interrupted before generation began")


def result_json(result: GenerationResult, plan: RunPlan) -> dict:
    """The ``--json`` object: text, settings and every statistic (seconds, tokens/s, nats).
    Speculation settings that do not apply to the request are null (options/rule.py)."""
    r = plan.request
    out = {
        "text": result.text,
        "tokens": result.tokens,
        "stop_reason": result.stop_reason,
        "message": result.message,
        "n_ctx": result.n_ctx,
        # the whole rule that ran: every speculation setting of the options table where it applies
        # (method none when the request does not speculate; draft_temp: what the draft sampled at)
        **rule_of(r),
        "grammar": r.grammar,
        "json_schema": r.json_schema,
        "json_object": r.json_object,
        "seed": result.seed,
        "temperature": r.temperature,
        "top_k": r.top_k,
        "top_p": r.top_p,
        "min_p": r.min_p,
        "verifier": plan.verifier_spec,
        "draft": plan.draft_spec,
        "pair": plan.pair_name,
    }
    out.update(result.stats.as_dict())
    # where each model's layers went: {"verifier": {"layers": 29, "offloaded": 29, "devices":
    # {"Vulkan0": 29}, "output": "Vulkan0", "summary": "29/29 layers on Vulkan0"}, "draft": ...}
    out["placement"] = ({role: p.as_dict() for role, p in result.placement.items()}
                        if result.placement else None)
    return out
