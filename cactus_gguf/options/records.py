"""The records of the Python API: :class:`Request` (one generation) and :class:`LoadOptions` (an
engine's models and contexts), frozen dataclasses written out field by field from the one options
table (__init__.py): each field is ``opt(name)``, its default and its Option, from which the
validation reads the allowed values. The package re-exports them, so callers import them from there.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from ..errors import InputError
from .grammar import grammar_spec
from .option import Option
from .table import BY_NAME, check_value, options_in


_OWN = object()


def opt(name: str, default: Any = _OWN) -> Any:
    """The dataclass field of option ``name``: its default (a tuple for a multiple-valued option)
    and the Option itself as ``metadata["option"]``, where validation finds it. Every record
    whose fields are options (Request, LoadOptions, and the parameter sets below them) declares
    them with this, so the table stays the one declaration. ``default``: a record's own default
    where it is not the product's (AcceptanceParams: the paper's rule, a math record)."""
    o = BY_NAME[name]
    if default is _OWN:
        default = tuple(o.default) if o.multiple else o.default
    return field(default=default, metadata={"option": o})


def option_of(f: dataclasses.Field) -> Option | None:
    """The Option a dataclass field declared with :func:`opt` carries, else None."""
    return f.metadata.get("option")


def check_fields(record) -> None:
    """Validate every field of ``record`` that carries an Option (:func:`opt`), as
    :func:`check_value`; fields without one are the record's own business."""
    for f in dataclasses.fields(record):
        if option_of(f) is not None:
            check_value(f.name, getattr(record, f.name))


def _fields_doc(scope: str) -> str:
    """The fields part of a record's docstring (indented as the docstring it is appended to)."""
    lines = ["", "", "    Fields (name: type = default; allowed values; meaning), from OPTIONS:"]
    for o in options_in(scope):
        allowed = (", ".join(o.choices) if o.choices else o.range.describe() if o.range else "")
        kind = " | ".join((o.type.__name__,) + tuple(repr(w) for w in o.words))
        lines.append(f"        {o.name}: {kind} = {o.default!r}"
                     + (f"; {allowed}" if allowed else "") + f"; {o.help}")
    lines += ["", "    Raises InputError (param = the field) for a value out of range or an "
              "unknown name.", "    "]
    return "\n".join(lines)


class _OptionRecord:
    """What Request and LoadOptions share: keyword-only construction that refuses an unknown name
    with InputError (``param`` = the name), each field normalized and checked against its Option
    (:func:`opt`), and ``replace()``. ``_SCOPE`` names the table scope the fields come from
    (tests/test_options.py checks the two agree)."""

    _SCOPE: ClassVar[str]

    def __new__(cls, *args: Any, **values: Any):
        # Before the dataclass __init__, so an unknown name is an InputError, not a TypeError.
        _refuse_unknown(cls, values)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            o = option_of(f)
            value = getattr(self, f.name)
            if o.normalize is not None:
                value = o.normalize(value)
                object.__setattr__(self, f.name, value)
            if o.multiple:  # one string is one value (as llama-cpp-python's stop); None is none
                value = ((value,) if isinstance(value, str) else () if value is None
                         else tuple(value) if isinstance(value, list) else value)
                object.__setattr__(self, f.name, value)
            check_value(o.name, value)
        self._check()

    def _check(self) -> None:
        """Rules between fields (after each field is checked on its own)."""

    def replace(self, **changes: Any):
        """A copy with ``changes`` applied (validated). Raises InputError for an unknown name."""
        _refuse_unknown(type(self), changes)
        return dataclasses.replace(self, **changes)


def _refuse_unknown(cls: type, values: Mapping[str, Any]) -> None:
    unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise InputError(f"unknown {cls._SCOPE} option {unknown[0]!r}", param=unknown[0])


@dataclass(frozen=True, kw_only=True)
class Request(_OptionRecord):
    """The settings of one generation: sampling warps, acceptance rule, draft length and drafter,
    n_predict, stop strings, seed. Frozen; ``replace(**changes)`` derives a new one. Units: delta
    in nats; seed < 0 draws a random seed. Each field is the option of the same name in
    ``OPTIONS`` (default, allowed values, help)."""

    _SCOPE: ClassVar[str] = "request"

    n_predict: int = opt("n_predict")
    k: int | str = opt("k")  # an int or "auto"
    k_max: int = opt("k_max")
    method: str = opt("method")
    delta: float = opt("delta")
    solver: str = opt("solver")
    budget: str = opt("budget")
    output_kl: bool = opt("output_kl")
    typical_epsilon: float = opt("typical_epsilon")
    typical_alpha: float = opt("typical_alpha")
    accept_top_k: int = opt("accept_top_k")
    ears_alpha: float = opt("ears_alpha")
    top_gap: float = opt("top_gap")
    protect_ends: float | str = opt("protect_ends")  # a number or "off"
    top_gap_scope: str = opt("top_gap_scope")
    drafter: str = opt("drafter")
    ngram_max: int = opt("ngram_max")
    ngram_min: int = opt("ngram_min")
    draft_window: int = opt("draft_window")
    draft_vocab: str = opt("draft_vocab")
    draft_min: int = opt("draft_min")
    draft_p_min: float = opt("draft_p_min")
    spec_synth_rates: str | None = opt("spec_synth_rates")  # canonical "P0,P1,..." text
    spec_synth_len: float | None = opt("spec_synth_len")
    temperature: float = opt("temperature")
    draft_temp: float | None = opt("draft_temp")  # None: the request's temperature
    top_k: int = opt("top_k")
    top_p: float = opt("top_p")
    min_p: float = opt("min_p")
    backend_sampling: str = opt("backend_sampling")
    seed: int = opt("seed")
    stop: tuple[str, ...] = opt("stop")  # also given as one str, a list or None
    grammar: str | None = opt("grammar")
    json_schema: str | None = opt("json_schema")  # also given as a dict; kept as JSON text
    json_object: bool = opt("json_object")
    logit_bias: str | None = opt("logit_bias")  # also given as a dict or a list; kept as JSON
    ignore_eos: bool = opt("ignore_eos")
    timings_per_token: bool = opt("timings_per_token")  # server: streamed chunks' timings
    return_progress: bool = opt("return_progress")  # server: prompt_progress chunks
    cache_prompt: bool = opt("cache_prompt")
    id_slot: int = opt("id_slot")
    n_probs: int | None = opt("n_probs")  # None: no log-probabilities
    post_sampling_probs: bool = opt("post_sampling_probs")

    __doc__ += _fields_doc("request")

    def _check(self) -> None:
        _check_request(self)

    def replace(self, **changes: Any) -> "Request":
        """A copy with ``changes`` applied (validated). Raises InputError for an unknown name.
        Setting one output constraint (grammar, json_schema, json_object) clears the others, so
        a request's constraint replaces a default one."""
        if any(changes.get(n) not in (None, False) for n in CONSTRAINTS):
            changes = {**{n: BY_NAME[n].default for n in CONSTRAINTS}, **changes}
        return super().replace(**changes)

    @property
    def speculates(self) -> bool:
        """Whether a drafter proposes tokens for the verifier to accept: False for method "none"
        and for k = 0 (no speculation, as llama.cpp's ``--draft-max 0``: the verifier alone)."""
        return self.method != "none" and self.k != 0

    @property
    def draft_temperature(self) -> float | None:
        """The temperature the draft samples its proposals at (``draft_temp``, else
        ``temperature``); None when nothing samples a draft (the verifier alone, prompt lookup)."""
        if not self.speculates or self.drafter == "ngram":
            return None
        return self.temperature if self.draft_temp is None else self.draft_temp

    @property
    def draft_ceiling(self) -> int:
        """The longest draft a step may make: k, or k_max under ``k="auto"``."""
        return self.k_max if self.k == "auto" else self.k

    @property
    def draft_ceiling_option(self) -> str:
        """The option that sets draft_ceiling (for error messages)."""
        return "k_max" if self.k == "auto" else "k"


@dataclass(frozen=True, kw_only=True)
class LoadOptions(_OptionRecord):
    """What an engine is loaded with: context size, batch size, threads, GPU offload and flash
    attention of the verifier (and the draft). Each field is the option of the same name in
    ``OPTIONS``."""

    _SCOPE: ClassVar[str] = "load"

    n_ctx: int = opt("n_ctx")
    n_parallel: int = opt("n_parallel")
    kv_unified: bool = opt("kv_unified")
    context_shift: bool = opt("context_shift")
    n_batch: int = opt("n_batch")
    n_threads: int | None = opt("n_threads")
    n_gpu_layers: int = opt("n_gpu_layers")
    n_gpu_layers_draft: int = opt("n_gpu_layers_draft")
    flash_attn: str = opt("flash_attn")
    repack: bool | None = opt("repack")
    rpc: str | None = opt("rpc")  # normalized to "HOST:PORT,..."
    rpc_draft: str | None = opt("rpc_draft")
    device: str | None = opt("device")
    device_draft: str | None = opt("device_draft")
    tensor_split: str | None = opt("tensor_split")
    chat_template_file: str | None = opt("chat_template_file")  # the template's text
    chat_template: str | None = opt("chat_template")  # a built-in template's name, or Jinja text
    reasoning: str = opt("reasoning")

    __doc__ += _fields_doc("load")

    def _check(self) -> None:
        if self.chat_template is not None and self.chat_template_file is not None:
            raise InputError("give one chat template, not {chat_template} and "
                             "{chat_template_file}", param="chat_template",
                             options=("chat_template_file",))

    @property
    def template(self) -> str | None:
        """The chat template used instead of the GGUF's (either option's), or None."""
        return self.chat_template if self.chat_template is not None else self.chat_template_file


def _check_request(r: Request) -> None:
    if r.draft_min > r.draft_ceiling:
        name = r.draft_ceiling_option
        raise InputError(f"{{draft_min}} must be in [0, {{{name}}}={r.draft_ceiling}], got "
                         f"{r.draft_min}", param="draft_min", options=(name,))
    _check_synth(r)
    if r.ngram_min > r.ngram_max:
        raise InputError(f"n-gram sizes must satisfy {{ngram_min}} <= {{ngram_max}}, got "
                         f"{r.ngram_min} > {r.ngram_max}", param="ngram_min", options=("ngram_max",))
    if r.draft_window and r.draft_vocab not in ("auto", "same"):
        raise InputError(f"{{draft_window}} works only with a draft of the verifier's vocabulary, "
                         f"and {{draft_vocab}} {r.draft_vocab} drafts in another: set "
                         "{draft_window} 0", param="draft_window", options=("draft_vocab",))
    constraint_of(r)  # compiles (and caches) the grammar: a bad one is refused before any load


def _check_synth(r: Request) -> None:
    """llama-server's rules for synthetic acceptance: rates or a length, not both; one rate per
    draft position up to the draft ceiling; a length in [1, ceiling + 1]."""
    if r.spec_synth_rates is None and r.spec_synth_len is None:
        return
    name, n = r.draft_ceiling_option, r.draft_ceiling
    if r.spec_synth_rates is not None and r.spec_synth_len is not None:
        raise InputError("give {spec_synth_rates} or {spec_synth_len}, not both",
                         param="spec_synth_len", options=("spec_synth_rates",))
    if r.spec_synth_rates is not None:
        count = r.spec_synth_rates.count(",") + 1
        if count != n:
            raise InputError(f"{{spec_synth_rates}} needs one rate per draft position, "
                             f"{{{name}}}={n} of them, got {count}", param="spec_synth_rates",
                             options=(name,))
    elif r.spec_synth_len > n + 1:
        raise InputError(f"{{spec_synth_len}} must be in [1, {n + 1}] ({{{name}}}={n} drafts "
                         f"and the verifier's token), got {r.spec_synth_len:g}",
                         param="spec_synth_len", options=(name,))


CONSTRAINTS = ("grammar", "json_schema", "json_object")  # the Request fields that constrain output


def constraint_of(r):
    """The request's output constraint as a compiled, validated GrammarSpec (grammar.py), or
    None. Raises InputError for two constraints at once or an
    invalid grammar / schema (llguidance's reason)."""
    given = [name for name in CONSTRAINTS if getattr(r, name) not in (None, False)]
    if not given:
        return None
    if len(given) > 1:
        raise InputError(f"give one output constraint, not {{{given[0]}}} and {{{given[1]}}}",
                         param=given[1], options=(given[0],))
    return grammar_spec(given[0], getattr(r, given[0]) if given[0] != "json_object" else "")


def validate_pairing(load, request) -> None:
    """Checks that need both a load option and a request option.

    The k + 1 verified tokens go in one ``llama_decode``, so k (``k_max`` under ``k="auto"``)
    must be below n_batch whenever the request speculates (with method none or k = 0 nothing is
    drafted). Raises InputError (param "k" or "k_max").
    """
    name, k = request.draft_ceiling_option, request.draft_ceiling
    if request.speculates and k >= load.n_batch > 0:
        raise InputError(f"{{{name}}}={k} must be below {{n_batch}}={load.n_batch}: the k+1 "
                         f"verified tokens go in one llama_decode (lower {{{name}}} or raise "
                         "{n_batch})", param=name, options=(name, "n_batch"))
