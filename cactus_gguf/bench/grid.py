"""The benchmark's configurations, as data: acceptance rule x drafter x draft length k x δ.

Every family but ``none`` (the verifier alone) is crossed with the k grid, the Cactus families also
with the δ grid. ``schedule`` interleaves them prompt by prompt (the order rotated by one per
prompt), so machine drift slows every configuration alike.
"""
from __future__ import annotations

import math

from typing import Sequence

from ..errors import InputError
from ..options import MODEL_DRAFTERS

__all__ = ["FAMILIES", "METHODS", "config_grid", "k_order", "default_methods", "needs_draft_model",
           "request_for", "schedule", "with_schema"]

# Configuration families, as data: the acceptance rule (None = the verifier alone), who drafts,
# and whether the family is crossed with the δ grid. Every family but none is crossed with k.
# ``budget``: what δ bounds for a Cactus family (the options table; "target" if absent);
# ``solver``: the
# Cactus solver (the base request's --solver when absent). A configuration name ``family@D`` runs a
# per-δ family at that δ only (``cactus-exact@1``), whatever the δ grid.
FAMILIES: dict[str, dict] = {
    "none": {"acceptance": None, "drafter": None, "per_delta": False},
    # the draft model decoding alone with the same warps (``decoder``: which model decodes): its
    # own answers' length and style, beside the verifier's
    "draft": {"acceptance": None, "drafter": None, "per_delta": False, "decoder": "draft"},
    "sps": {"acceptance": "sps", "drafter": "model", "per_delta": False},
    # the paper's rule, whatever --protect-ends / --top-gap the base request (or its pair) has:
    # ``protect_ends`` / ``top_gap`` False = off (inf), True = the base request's value (PROTECT_ENDS
    # / TOP_GAP when that is off); the families without the key run the base request's
    "cactus": {"acceptance": "cactus", "drafter": "model", "per_delta": True,
               "protect_ends": False, "top_gap": False},
    "cactus-output": {"acceptance": "cactus", "drafter": "model", "per_delta": True,
                      "budget": "output", "protect_ends": False, "top_gap": False},
    # the paper's rule with the exact binary-KL solver (the others use --solver, Taylor by default)
    "cactus-exact": {"acceptance": "cactus", "drafter": "model", "per_delta": True,
                     "solver": "exact", "protect_ends": False, "top_gap": False},
    # Cactus with protected ends only
    "cactus-ends": {"acceptance": "cactus", "drafter": "model", "per_delta": True,
                    "protect_ends": True, "top_gap": False},
    # Cactus with protected ends, relaxed only near the verifier's top: the product default
    "cactus-ends-gap": {"acceptance": "cactus", "drafter": "model", "per_delta": True,
                        "protect_ends": True, "top_gap": True},
    "typical": {"acceptance": "typical", "drafter": "model", "per_delta": False},
    "ears": {"acceptance": "ears", "drafter": "model", "per_delta": False},
    "topk": {"acceptance": "topk", "drafter": "model", "per_delta": False},
    "ngram": {"acceptance": "sps", "drafter": "ngram", "per_delta": False},  # lossless lookup
    "ngram-cactus": {"acceptance": "cactus", "drafter": "ngram", "per_delta": True},
    # prompt lookup on a full --ngram-max match, else the draft model; Cactus at the base δ
    "hybrid": {"acceptance": "cactus", "drafter": "hybrid", "per_delta": False},
    # the verifier's own next-n (MTP) layer drafts (Qwen3.5): SpS, and Cactus at the base δ
    "mtp-sps": {"acceptance": "sps", "drafter": "mtp", "per_delta": False},
    "mtp": {"acceptance": "cactus", "drafter": "mtp", "per_delta": False},
}
METHODS = tuple(FAMILIES)
PROTECT_ENDS = 0.1  # cactus-ends's threshold when the base request's is off
TOP_GAP = 0.5  # cactus-ends-gap's gap (nats) when the base request's is inf


def default_methods(has_draft_model: bool = True) -> tuple[str, ...]:
    """The default set: none, sps, cactus (the paper's rule), cactus-ends-gap (the product
    default), typical and ngram. Without a draft model only the configurations that need none
    (none, ngram)."""
    methods = ["none", "sps", "cactus", "cactus-ends-gap", "typical", "ngram"]
    if not has_draft_model:
        methods = [m for m in methods if not needs_draft_model(m)]
    return tuple(methods)


def needs_draft_model(method: str) -> bool:
    fam = FAMILIES[_family(method)[0]]
    return fam["drafter"] in MODEL_DRAFTERS or fam.get("decoder") == "draft"


def _family(name: str) -> tuple[str, float | None]:
    """``cactus-exact@1`` -> ("cactus-exact", 1.0); ``sps`` -> ("sps", None). Raises InputError
    for a δ that is not a number >= 0 or given to a family without δ."""
    if "@" not in name:
        return name, None
    fam, _, d = name.partition("@")
    try:
        delta = float(d)
    except ValueError:
        delta = -1.0
    if not delta >= 0 or not FAMILIES.get(fam, {}).get("per_delta"):
        raise InputError(f"configuration {name!r}: `family@D` needs a Cactus family and a δ >= 0 "
                         "(e.g. cactus-exact@1)", param="configs")
    return fam, delta



def _fmt_num(x: float) -> str:
    return f"{x:g}"


def k_order(k) -> tuple:
    """Sort key of grid k values: the fixed lengths in order, then ``auto``."""
    return (1, 0) if k == "auto" else (0, k)


def config_grid(methods: Sequence[str], deltas: Sequence[float], ks: Sequence[int]) -> list[dict]:
    """The configurations of one run, in the base order (rotated per prompt by :func:`schedule`).

    Each is a dict: ``id`` (unique, file-safe), ``label`` (for people), ``method`` (a FAMILIES
    name), ``acceptance`` (the native rule, None for none), ``drafter`` (None/"model"/"ngram"/"hybrid"),
    ``decoder`` ("verifier", or "draft" for the draft model alone),
    ``k`` (None for none and draft; an integer or ``"auto"``, the cost-aware draft length up to the base
    request's k_max), ``delta`` and ``budget`` (the Cactus families only). ``none`` and ``draft``
    come once;
    every other family once per k, and once per δ for the Cactus ones.

    Raises InputError for an unknown method, an empty grid, a k < 1 or a δ < 0.
    """
    unknown = [m for m in methods if _family(m)[0] not in METHODS]
    if unknown:
        raise InputError(f"unknown configuration {unknown[0]!r}: choose from {', '.join(METHODS)}")
    if not methods:
        raise InputError("no configurations to run")
    if not ks or any(k != "auto" and (not isinstance(k, int) or k < 1) for k in ks):
        raise InputError(f"{{k}} values must be integers >= 1 or auto in the benchmark grid (the "
                         f"verifier alone is the none configuration), got {list(ks)}", param="k")
    if any(not (isinstance(d, (int, float)) and d >= 0) for d in deltas):
        raise InputError(f"delta values must be >= 0 nats, got {list(deltas)}")
    if any(FAMILIES[m]["per_delta"] and "@" not in m for m in methods if m in FAMILIES) and not deltas:
        raise InputError("cactus needs at least one delta")
    multi_k = len(ks) > 1
    out: list[dict] = []
    for alone, label in (("none", "none"), ("draft", "draft alone")):
        if alone in methods:
            out.append({"id": alone, "label": label, "method": alone, "acceptance": None,
                        "drafter": None, "decoder": FAMILIES[alone].get("decoder", "verifier"),
                        "k": None, "delta": None, "budget": None})
    for k in ks:
        suffix = f" k={k}" if multi_k else ""
        for name in methods:
            m, only = _family(name)
            fam = FAMILIES[m]
            if fam["acceptance"] is None:
                continue
            common = {"method": m, "acceptance": fam["acceptance"], "drafter": fam["drafter"], "k": k,
                      "budget": fam.get("budget", "target") if fam["per_delta"] else None}
            if fam.get("solver"):
                common["solver"] = fam["solver"]
            for key in ("protect_ends", "top_gap"):
                if key in fam:
                    common[key] = fam[key]
            if fam["per_delta"]:
                for d in (deltas if only is None else (only,)):
                    out.append({"id": f"{m}-d{_fmt_num(d)}-k{k}",
                                "label": f"{m} δ={_fmt_num(d)}{suffix}", **common, "delta": float(d)})
            else:
                out.append({"id": f"{m}-k{k}", "label": f"{m}{suffix}", **common, "delta": None})
    return out



def with_schema(configs: list[dict], mode: str) -> list[dict]:
    """The configurations for prompts that carry a JSON Schema: ``off`` as they are, ``on`` each
    constrained by the prompt's schema (id ``...-schema``, label ``... +schema``), ``both``."""
    constrained = [{**c, "id": f"{c['id']}-schema", "label": f"{c['label']} +schema",
                    "constrained": True} for c in configs]
    return {"off": configs, "on": constrained, "both": configs + constrained}[mode]


def request_for(base, cfg: dict, json_schema: str | None = None):
    """The Request of configuration ``cfg`` (a :func:`config_grid` dict) on top of ``base``:
    its acceptance rule, drafter, k (``auto``: up to base's k_max) and δ, and for a ``constrained``
    one the prompt's ``json_schema`` (in place of any constraint of base); everything else (warps,
    seed, n_predict) as in base."""
    if cfg.get("constrained") and json_schema is not None:
        base = base.replace(json_schema=json_schema, grammar=None, json_object=False)
    if cfg["acceptance"] is None:
        return base.replace(method="none")
    changes = {"method": cfg["acceptance"], "drafter": cfg["drafter"], "k": cfg["k"]}
    if cfg["delta"] is not None:
        changes["delta"] = cfg["delta"]
    if cfg.get("budget"):
        changes["budget"] = cfg["budget"]
    if cfg.get("solver"):
        changes["solver"] = cfg["solver"]
    if cfg.get("protect_ends") is False:
        changes["protect_ends"] = "off"
    elif cfg.get("protect_ends"):
        changes["protect_ends"] = (base.protect_ends if base.protect_ends != "off"
                                   else PROTECT_ENDS)
    if cfg.get("top_gap") is False:
        changes["top_gap"] = math.inf
    elif cfg.get("top_gap"):
        changes["top_gap"] = base.top_gap if base.top_gap != math.inf else TOP_GAP
    return base.replace(**changes)


def schedule(n_prompts: int, n_configs: int) -> list[tuple[int, int]]:
    """Run order as (prompt index, config index) pairs: prompt by prompt, every configuration,
    the configuration order rotated by one at each prompt (prompt i starts with config i mod C)."""
    order = []
    for i in range(n_prompts):
        r = i % n_configs if n_configs else 0
        order += [(i, c) for c in list(range(r, n_configs)) + list(range(r))]
    return order

