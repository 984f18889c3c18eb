"""The run API: from user-level options (paths or registry names, flags) to a finished generation.

``plan_run`` validates every option and reads the prompt *before* any model is fetched or loaded;
``execute_run`` loads the pair and generates. The CLI is a thin wrapper over these two calls;
embedders who already have paths can use :class:`~cactus_gguf.decoding.SpeculativeDecoder` directly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .backend import ContextOptions, ModelOptions
from .decoding import DecoderConfig, GenerationResult, SpeculativeDecoder
from .sampling import AcceptanceParams, SamplingParams

__all__ = ["RunRequest", "RunPlan", "plan_run", "execute_run", "result_json"]


@dataclass(frozen=True)
class RunRequest:
    """Options as a user gives them (CLI flags). ``explicit`` names the options the user set;
    the others may take a registry pair's recommended value (k, delta, sampling)."""

    verifier: str | None = None
    draft: str | None = None
    pair: str | None = None
    prompt: str | None = None
    prompt_file: str | None = None
    chat: bool = False
    n_predict: int = 128
    k: int = 8
    method: str = "cactus"
    delta: float = 1.0
    solver: str = "taylor"
    typical_epsilon: float = 0.09
    typical_alpha: float = 0.3
    accept_top_k: int = 5
    drafter: str = "model"
    draft_min: int = 0
    draft_p_min: float = 0.0
    ngram_max: int = 3
    ngram_min: int = 1
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int = -1
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int | None = None
    n_gpu_layers: int = -1
    n_gpu_layers_draft: int = -1
    flash_attn: str = "auto"
    stop: tuple[str, ...] = ()
    explicit: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class RunPlan:
    """A validated request: the models to use, the decoder config and the prompt."""

    verifier_spec: str
    draft_spec: str | None
    config: DecoderConfig
    prompt: str
    chat: bool
    n_predict: int
    seed: int | None
    stop: tuple[str, ...]
    pair_name: str | None = None


def _read_prompt(req: RunRequest) -> str:
    if req.prompt is not None and req.prompt_file is not None:
        raise ValueError("give the prompt with -p or -f, not both")
    if req.prompt_file is not None:
        path = Path(req.prompt_file)
        if not path.is_file():
            raise ValueError(f"prompt file not found: {path}")
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"prompt file {path} is not UTF-8 text (bad byte at offset {e.start}): "
                             "convert it to UTF-8") from None
    elif req.prompt is not None:
        text = req.prompt
    else:
        raise ValueError("no prompt: give one with -p TEXT or -f FILE")
    if not text.strip():
        raise ValueError("the prompt is empty: give some text to continue")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # undecodable bytes from the command line arrive as surrogates
        raise ValueError(f"the prompt is not valid UTF-8 (bad byte at position {e.start}): "
                         "pass UTF-8 text, or use -f with a UTF-8 file") from None
    return text


def choose_pair(pair: str | None, verifier: str | None, draft: str | None):
    """The registry pair to use, if any: ``pair`` by name, or the default pair when no model is
    given. Returns (PairEntry or None, verifier spec, draft spec).

    Raises ValueError for an unknown pair, or a pair given together with models.
    """
    from .registry import load_registry

    if pair is None and (verifier is not None or draft is not None):
        return None, verifier, draft
    if verifier is not None or draft is not None:
        raise ValueError("give either --pair or model paths/names, not both")
    registry = load_registry()
    if pair is None:
        entry = registry.default_pair
    elif pair in registry.pairs:
        entry = registry.pairs[pair]
    else:
        raise ValueError(f"unknown pair {pair!r}: see `cactus-gguf models` "
                         f"(pairs: {', '.join(sorted(registry.pairs))})")
    return entry, entry.verifier, entry.draft


def plan_run(req: RunRequest) -> RunPlan:
    """Validate ``req`` and settle which models to use, without touching a model file.

    Model names are resolved (and fetched) only by :func:`execute_run`.
    Raises ValueError (one line) for any invalid option or unreadable prompt.
    """
    values = {name: getattr(req, name) for name in
              ("k", "delta", "temperature", "top_k", "top_p")}
    pair, verifier, draft = choose_pair(req.pair, req.verifier, req.draft)
    pair_name = pair.name if pair is not None else None
    if pair is not None:
        if req.drafter == "ngram":
            draft = None
        recommended = {"k": pair.k, "delta": pair.delta, "temperature": pair.temperature,
                       "top_k": pair.top_k, "top_p": pair.top_p}
        cli_names = {"k": "k", "delta": "delta", "temperature": "temp", "top_k": "top_k",
                     "top_p": "top_p"}
        for name, value in recommended.items():
            if name not in req.explicit and cli_names[name] not in req.explicit:
                values[name] = value
    if verifier is None:
        raise ValueError("no verifier model: give VERIFIER (a .gguf path or a registry name)")
    if req.method != "none" and req.drafter == "model" and draft is None:
        raise ValueError(f"method {req.method} needs a DRAFT model; give one, or use --drafter ngram "
                         "or --method none")
    if req.drafter == "ngram" and draft is not None and pair_name is None:
        raise ValueError("the ngram drafter uses no draft model: drop DRAFT, or use --drafter model")

    if not isinstance(req.n_predict, int) or req.n_predict < 1:
        raise ValueError(f"-n/--n-predict must be >= 1, got {req.n_predict}")
    if not isinstance(req.seed, int) or req.seed >= 2**64:
        raise ValueError(f"-s/--seed must be an integer below 2**64 (negative = random), "
                         f"got {req.seed}")
    if math.isnan(values["delta"]) or values["delta"] < 0:
        raise ValueError(f"--delta must be a number >= 0 (nats), got {values['delta']}")
    sampling = SamplingParams(temperature=values["temperature"], top_k=values["top_k"],
                              top_p=values["top_p"], min_p=req.min_p)
    acceptance = None if req.method == "none" else AcceptanceParams(
        method=req.method, delta=values["delta"], solver=req.solver,
        typical_epsilon=req.typical_epsilon, typical_alpha=req.typical_alpha,
        accept_top_k=req.accept_top_k)
    config = DecoderConfig(
        k=values["k"], acceptance=acceptance, sampling=sampling, drafter=req.drafter,
        draft_min=req.draft_min, draft_p_min=req.draft_p_min, ngram_max=req.ngram_max,
        ngram_min=req.ngram_min,
        verifier_model=ModelOptions(n_gpu_layers=req.n_gpu_layers),
        draft_model=ModelOptions(n_gpu_layers=req.n_gpu_layers_draft),
        context=ContextOptions(n_ctx=req.n_ctx, n_batch=req.n_batch, n_threads=req.n_threads,
                               flash_attn=req.flash_attn))
    prompt = _read_prompt(req)
    return RunPlan(verifier_spec=verifier, draft_spec=draft if config.needs_draft_model else None,
                   config=config, prompt=prompt, chat=req.chat, n_predict=req.n_predict,
                   seed=None if req.seed < 0 else req.seed, stop=req.stop, pair_name=pair_name)


def execute_run(plan: RunPlan, on_text: Callable[[str], None] | None = None) -> GenerationResult:
    """Resolve (fetch if needed) the models, load them and generate.

    Raises ModelLoadError / VocabMismatchError / ContextLengthError / registry errors, all with
    one-line messages.
    """
    from .registry import resolve_model

    verifier = resolve_model(plan.verifier_spec)
    draft = resolve_model(plan.draft_spec) if plan.draft_spec is not None else None
    with SpeculativeDecoder(verifier, draft, plan.config) as decoder:
        prompt = (decoder.format_chat([{"role": "user", "content": plan.prompt}])
                  if plan.chat else plan.prompt)
        return decoder.generate(prompt, n_predict=plan.n_predict, stop=plan.stop, seed=plan.seed,
                                on_text=on_text)


def result_json(result: GenerationResult, plan: RunPlan) -> dict:
    """The ``--json`` object: text, settings and every statistic (seconds, tokens/s, nats)."""
    cfg = plan.config
    acc = cfg.acceptance
    out = {
        "text": result.text,
        "tokens": result.tokens,
        "stop_reason": result.stop_reason,
        "method": cfg.method,
        "delta": acc.delta if acc is not None and acc.method == "cactus" else None,
        "solver": acc.solver if acc is not None and acc.method == "cactus" else None,
        "k": cfg.k,
        "drafter": cfg.drafter if acc is not None else None,
        "typical_epsilon": acc.typical_epsilon if acc is not None and acc.method == "typical" else None,
        "typical_alpha": acc.typical_alpha if acc is not None and acc.method == "typical" else None,
        "accept_top_k": acc.accept_top_k if acc is not None and acc.method == "topk" else None,
        "draft_min": cfg.draft_min,
        "draft_p_min": cfg.draft_p_min,
        "seed": result.seed,
        "temperature": cfg.sampling.temperature,
        "top_k": cfg.sampling.top_k,
        "top_p": cfg.sampling.top_p,
        "min_p": cfg.sampling.min_p,
        "verifier": plan.verifier_spec,
        "draft": plan.draft_spec,
        "pair": plan.pair_name,
    }
    out.update(result.stats.as_dict())
    return out
