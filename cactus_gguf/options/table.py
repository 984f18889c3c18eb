"""The options table: every user-visible option, declared once (``OPTIONS``), and what reads it.

The package (``cactus_gguf/options/__init__.py``) re-exports these names beside the records built
from them (records.py); records.py imports this module, never the package, so the two do not import
each other. Imports only errors.py, values.py and option.py (the Option and Range records, re-exported
here).
"""
from __future__ import annotations

import math
from typing import Any, Iterable

from ..errors import InputError
from .option import Option, Range, number_text
from .values import _hosts, _names
from .values import (_endpoints, _nonempty, _synth_rates, _tensor_split, check_chat_template,
                     check_template, normalize_json_schema, normalize_logit_bias,
                     parse_endpoints, parse_tensor_split)

__all__ = ["Range", "Option", "OPTIONS", "BY_NAME", "options_in", "default", "check_value",
           "markdown_table", "normalize_json_schema", "parse_endpoints", "parse_tensor_split",
           "METHODS", "SOLVERS", "BUDGETS", "DRAFTERS", "DRAFT_VOCABS", "MODEL_DRAFTERS",
           "SELF_DRAFTERS", "DRAFT_MODEL_OPTIONS"]

# The acceptance rules ("none" = no speculation, the verifier alone), Cactus solvers and budgets.
# Names only: their C values come from the library (sampling/_clib.py asks it for each name).
METHODS = ("sps", "cactus", "typical", "topk", "greedy", "ears")
SOLVERS = ("taylor", "exact")
BUDGETS = ("target", "output")
DRAFTERS = ("model", "ngram", "hybrid", "mtp")
SELF_DRAFTERS = ("ngram", "mtp")  # the drafters that need no DRAFT model
# How a draft whose vocabulary is not the verifier's speculates (speculative/foreign.py)
DRAFT_VOCABS = ("auto", "same", "map", "intersect", "text")
MODEL_DRAFTERS = ("model", "hybrid")  # the drafters that run the DRAFT model
# Request options only a DRAFT model uses (refused with a self-drafter: nothing would read them)
DRAFT_MODEL_OPTIONS = ("draft_window", "draft_vocab")


# ------------------------------------------------------------------------------------------------
# The table
# ------------------------------------------------------------------------------------------------

_METHOD_HELP = (
    "acceptance rule: `cactus`; `sps` (exact speculative sampling); `typical` (Medusa / vLLM typical "
    "acceptance: accept if `q[n] > min(ε, α·exp(−H(q)))`, else emit the verifier's argmax); `topk` "
    "(accept drafts among the verifier's top `--accept-top-k`, residual from `max(0, 1[top] − p)`); "
    "`greedy` (llama-server style: sample from the verifier, accept while it equals the draft); "
    "`ears` (EARS: accept with probability `min(1, q[n]/p[n] + α·(1 − max q))`, residual as SpS; "
    "`--ears-alpha`); `none` (the verifier alone: the baseline, same sampler)")

_RUN = frozenset({"run"})
_BENCH = frozenset({"bench"})
_SERVE = frozenset({"serve"})
_GEN = frozenset({"run", "serve"})  # a generation's own settings (bench sweeps them: --configs)
_ALL = frozenset({"run", "bench", "serve"})

# Where a speculation setting applies (Option.applies): whenever the request speculates, under
# one acceptance rule, or with the drafters that read it
_SPECULATING = ()
_CACTUS = (("method", ("cactus",)),)
_SAMPLED_DRAFT = (("drafter", ("model", "hybrid", "mtp")),)  # a draft sampled from a row p

OPTIONS: tuple[Option, ...] = (
    # -- run: models and prompt ------------------------------------------------------------------
    Option("model", str, None, "verifier GGUF path or registry name", ("VERIFIER", "-m", "--model"),
           scope="run", optional=True, shown_default="default pair", metavar="VERIFIER",
           commands=_ALL),
    Option("model_draft", str, None, "draft GGUF path or registry name",
           ("DRAFT", "-md", "--model-draft"), scope="run", optional=True,
           shown_default="default pair", metavar="DRAFT", commands=_ALL),
    Option("pair", str, None, "a pair from `models.yaml`; its recommended k, δ and sampling apply "
           "unless you set them", ("--pair",), scope="run", optional=True, metavar="NAME",
           shown_default="", commands=_ALL),
    Option("prompt", str, None, "prompt text", ("-p", "--prompt"), scope="run", optional=True,
           metavar="TEXT", shown_default="", commands=_RUN),
    Option("file", str, None, "read the prompt from a UTF-8 file (`-` = standard input)",
           ("-f", "--file"), scope="run", optional=True, metavar="FILE", shown_default="",
           commands=_RUN),
    Option("chat", bool, False, "wrap the prompt as a user message in the GGUF's chat template "
           "(bench: default on for HumanEval-style problems, `--no-chat` to turn it off)",
           ("--chat",), scope="run", optional=True, commands=_RUN | _BENCH,
           command_defaults={"bench": None}),
    # -- request: what one generation does -------------------------------------------------------
    Option("n_predict", int, 128, "tokens to generate; -1 = until the end of generation or a full "
           "context (as llama.cpp)", ("-n", "--n-predict"),
           range=Range(lo=1, also=(-1,), note="-1 = no limit"), metavar="N"),
    Option("k", int, "auto", "draft length: tokens proposed per verification step (below `-b`); "
           "`auto`: each step drafts as many (0 … `--k-max`) as pay for themselves on this "
           "machine (its forward costs, probed once and cached, and the acceptance seen so far; "
           "docs/run.md \"Draft length\"); 0 = no speculation (the verifier alone, as llama.cpp's "
           "`--draft-max 0`)", ("-k", "--draft-max"), applies=_SPECULATING,
           range=Range(lo=0, note="0 = no speculation"),
           recommend=True, grid=True, metavar="K", words=("auto",)),
    Option("k_max", int, 16, "`-k auto`'s ceiling: the longest draft it may choose",
           ("--k-max",), applies=(("k", ("auto",)),),
           range=Range(lo=1), recommend=True, metavar="N"),
    Option("method", str, "cactus", _METHOD_HELP, ("--method",), applies=_SPECULATING,
           choices=METHODS + ("none",),
           commands=_GEN),
    Option("delta", float, 1.0, "Cactus KL budget δ in nats; 0 = exactly SpS", ("--delta",),
           applies=_CACTUS, range=Range(lo=0.0), recommend=True, grid=True, metavar="D",
           command_defaults={"bench": (0.5, 1.0, 2.0)}),
    Option("solver", str, "taylor", "Cactus γ: `taylor` (paper's closed form; can exceed δ slightly "
           "when γ > 0.5) or `exact` (binary-KL root: KL ≤ δ up to float rounding, ~1e-15)",
           ("--solver",), applies=_CACTUS, choices=SOLVERS),
    Option("budget", str, "target", "what Cactus δ bounds: `target` (the paper's: KL(h‖q) ≤ δ for "
           "each drafted token's target; the tokens emitted can diverge more) or `output` "
           "(KL(P‖q) ≤ δ for the law P of every token a draft position emits; costs ~20 law "
           "evaluations per position; bench: the `cactus-output` configurations)", ("--budget",),
           applies=_CACTUS, choices=BUDGETS, commands=_GEN),
    Option("output_kl", bool, True, "measure KL(P‖q), the divergence of what each draft position "
           "emits (`output_kl_*` in the stats; exact: ~0.05 ms per position with top-k 40, ~8 ms "
           "at an untruncated 152k vocabulary, where `--no-output-kl` saves it)",
           ("--output-kl", "--no-output-kl"), applies=_SPECULATING),
    Option("typical_epsilon", float, 0.09, "typical acceptance ε (vLLM default)",
           ("--typical-epsilon",), applies=(("method", ("typical",)),),
           range=Range(lo=0.0), metavar="E"),
    Option("typical_alpha", float, 0.3, "typical acceptance α (vLLM default)", ("--typical-alpha",),
           applies=(("method", ("typical",)),), range=Range(lo=0.0), metavar="A"),
    Option("accept_top_k", int, 5, "`topk` acceptance: size of the accepted set (within the "
           "verifier's support)", ("--accept-top-k",), applies=(("method", ("topk",)),),
           range=Range(lo=1, hi=2**31, hi_open=True),
           metavar="N"),
    Option("ears_alpha", float, 0.5, "`ears` acceptance: weight α of the tolerance α·(1 − max q) "
           "added to SpS's ratio q[n]/p[n] (0 = SpS)", ("--ears-alpha",),
           applies=(("method", ("ears",)),), range=Range(lo=0.0), metavar="A"),
    Option("top_gap", float, 0.5, "Cactus: relax only drafts within G nats of the verifier's "
           "top token (q[n] ≥ max q · e^−G), where `--top-gap-scope` says; the others are "
           "accepted as SpS would; `inf` = every draft (the paper's rule). The default rule "
           "(top gap 0.5 in code, protected ends 0.1): docs/benchmarks.md \"Which rule is the "
           "default\"",
           ("--top-gap",), applies=_CACTUS, range=Range(lo=0.0), recommend=True, metavar="G"),
    Option("protect_ends", float, 0.1, "Cactus: at positions where the verifier puts at least "
           "TAU on ending (end-of-generation tokens and tokens that start a stop string), keep "
           "that chance in what is emitted (the position falls back to SpS where Cactus would "
           "lower it), so answers end where the verifier's would; `off` = the paper's rule",
           ("--protect-ends",), applies=_CACTUS,
           range=Range(lo=0.0, hi=1.0), recommend=True, metavar="TAU",
           words=("off",)),
    Option("top_gap_scope", str, "code", "where `--top-gap` applies: `code` = a completion of "
           "a raw prompt or of a prefilled answer, and the fenced code blocks of a chat answer "
           "(from a run of three backticks to the next), whose prose Cactus relaxes as the "
           "paper's rule does; `all` = everywhere",
           ("--top-gap-scope",), applies=_CACTUS, choices=("code", "all"), recommend=True),
    Option("drafter", str, "model", "`model` (the DRAFT GGUF), `ngram` (prompt lookup from the "
           "token history: no draft model, `cactus-gguf run VERIFIER --drafter ngram`) or "
           "`hybrid` (prompt lookup when the last `--ngram-max` tokens occurred before, else the "
           "draft model) or `mtp` (the verifier's own next-n layers, Qwen3.5: no draft model; "
           "llama.cpp's `--spec-type draft-mtp`, sampled and checked by any rule)",
           ("--drafter",), applies=_SPECULATING, choices=DRAFTERS, commands=_GEN),
    Option("ngram_max", int, 3, "`ngram` drafter: longest n-gram looked up (`hybrid`: the "
           "match length it needs)", ("--ngram-max",), applies=(("drafter", ("ngram", "hybrid")),),
           range=Range(lo=1), metavar="N"),
    Option("ngram_min", int, 1, "`ngram` drafter: shortest n-gram looked up", ("--ngram-min",),
           applies=(("drafter", ("ngram",)),), range=Range(lo=1), metavar="N"),
    Option("draft_window", int, 0, "the draft model prefills only the last N tokens of the "
           "prompt (less prompt processing for a long prompt, at some acceptance); 0 = all",
           ("--draft-window",), applies=(("drafter", MODEL_DRAFTERS),),
           range=Range(lo=0, note="0 = the whole prompt"), metavar="N"),
    Option("draft_vocab", str, "auto", "how the draft's tokens reach the verifier: `same` (one "
           "vocabulary, ids as they are), `map` (the same text tokens under other ids or special "
           "tokens: ids translated), `intersect` (different tokenizers: the draft samples only "
           "tokens both vocabularies have, renormalised; exact), `text` (different tokenizers: "
           "the draft's text is re-tokenised by the verifier, proposals treated as one-hot); "
           "`auto` = what `cactus-gguf vocab VERIFIER DRAFT` says the pair needs (docs/models.md "
           "\"Foreign drafts\")", ("--draft-vocab",), applies=(("drafter", MODEL_DRAFTERS),),
           choices=DRAFT_VOCABS),
    Option("draft_min", int, 0, "drop a draft shorter than N (that step is verifier-only), as "
           "llama.cpp", ("--draft-min",), applies=_SPECULATING, range=Range(lo=0), metavar="N"),
    Option("draft_p_min", float, 0.0, "stop drafting when the draft's most likely token has "
           "probability below P, as llama.cpp", ("--draft-p-min",), applies=_SAMPLED_DRAFT,
           range=Range(lo=0.0, hi=1.0),
           metavar="P"),
    Option("spec_synth_rates", str, None, "benchmarking only, as llama-server: accept draft "
           "position i with unconditional probability P_i by a seeded coin, whatever the verifier "
           "says (so the output is not the verifier's); after the first position refused, the "
           "verifier's own sample. One rate per position up to the draft ceiling (`-k`, or "
           "`--k-max` under `-k auto`), each in [0, 1], none above the one before",
           ("--spec-synth-rates",), applies=_SPECULATING, optional=True, shown_default="off",
           normalize=_synth_rates, metavar="P0,P1,..."),
    Option("spec_synth_len", float, None, "benchmarking only, as llama-server: synthetic "
           "acceptance (`--spec-synth-rates`) at rates p, p², p³, ... with p chosen so the mean "
           "acceptance length, the verifier's token included, is L (in [1, draft ceiling + 1])",
           ("--spec-synth-len",), applies=_SPECULATING, optional=True, shown_default="off",
           range=Range(lo=1.0), metavar="L"),
    Option("temperature", float, 0.8, "temperature; 0 = greedy (acceptance is then exact match)",
           ("--temp",), range=Range(note="<= 0 = greedy, inf = uniform over the kept tokens"),
           recommend=True, metavar="T"),
    Option("draft_temp", float, None, "the draft's own temperature: it samples its proposals at T "
           "with the request's top-k / top-p / min-p (0 = greedy: a one-hot proposal at its top "
           "token), and every acceptance rule checks exactly that proposal, so SpS stays exact "
           "(docs/run.md \"Draft temperature\")", ("--draft-temp",), applies=_SAMPLED_DRAFT,
           range=Range(lo=0.0, hi=math.inf, hi_open=True, note="0 = greedy"), optional=True,
           shown_default="--temp", metavar="T"),
    Option("top_k", int, 40, "top-k (0 = off)", ("--top-k",),
           range=Range(lo=0, hi=2**31, hi_open=True, note="0 = off"), recommend=True, metavar="N"),
    Option("top_p", float, 0.95, "top-p (1 = off)", ("--top-p",),
           range=Range(lo=0.0, hi=1.0, lo_open=True, note="1 = off"), recommend=True, metavar="P"),
    Option("min_p", float, 0.05, "min-p (0 = off)", ("--min-p",),
           range=Range(lo=0.0, hi=1.0, note="0 = off"), recommend=True, metavar="P"),
    Option("backend_sampling", str, "off", "top-k on the device: when top-k > 0, llama.cpp's "
           "backend sampler keeps each output row's top-k + 1 logits inside the decode graph and "
           "the host reads only those (same tokens for the same seed as the full rows; a tie at "
           "the k-th logit decodes the batch again in full); `auto` = where available (no "
           "grammar, log-probabilities, foreign / MTP draft, recurrent model or Vulkan build), `on` = "
           "the same, "
           "warning once when it cannot, `off` = full rows (docs/run.md \"Warps on the device\")",
           ("--backend-sampling",), choices=("auto", "on", "off")),
    Option("seed", int, -1, "RNG seed; -1 = random (the seed used is reported)", ("-s", "--seed"),
           range=Range(hi=2**64, hi_open=True, note="negative = random"), metavar="N",
           command_defaults={"bench": 0}),
    Option("stop", str, (), "stop string (repeatable, not empty); never printed", ("--stop",),
           multiple=True, metavar="TEXT", shown_default="", commands=_GEN),
    Option("grammar", str, None, "constrain the output to a GBNF grammar (llama.cpp's format): "
           "the grammar text or a `.gbnf` file; the draft, the acceptance test, the residual and "
           "the bonus token all see only the tokens it allows (docs/server.md "
           "\"Structured output\")",
           ("--grammar", "--grammar-file"), optional=True, metavar="GBNF", shown_default="none",
           file_or_text=True),
    Option("json_schema", str, None, "constrain the output to JSON valid under a JSON Schema: "
           "its JSON text or a `.json` file (API: also a dict)",
           ("-j", "--json-schema", "--json-schema-file"), optional=True, metavar="SCHEMA",
           shown_default="none", file_or_text=True, normalize=normalize_json_schema),
    Option("json_object", bool, False, "constrain the output to a JSON object (any keys)",
           ("--json-object",)),
    Option("logit_bias", str, None, "added to the verifier's logits (and the draft's) before the "
           "warps, so q is the biased law every acceptance rule targets (llama-server's "
           "`logit_bias`): `{token: bias}` or `[[token, bias], ...]`, a token an id or text "
           "(tokenized, each of its tokens biased), a bias a number or false (banned); kept as "
           "JSON text (docs/maths.md \"Logit bias\")", (), optional=True,
           shown_default="none", normalize=normalize_logit_bias, commands=frozenset()),
    Option("ignore_eos", bool, False, "ban every end-of-generation token (llama-server's "
           "`ignore_eos`: -inf logit biases): the answer ends at `n_predict`, a stop string or a "
           "full context", (), commands=frozenset()),
    Option("timings_per_token", bool, False, "each streamed chunk carries llama-server's "
           "`timings` as of that chunk (llama-server's `timings_per_token`; the last one "
           "always does)", (), commands=frozenset()),
    Option("return_progress", bool, False, "a stream reports prompt processing: a "
           "`prompt_progress` chunk (`total`, `cache`, `processed`, `time_ms`) before each "
           "`-b` chunk of the prompt and once it is processed (llama-server's "
           "`return_progress`)", (), commands=frozenset()),
    Option("cache_prompt", bool, True, "reuse the longest common prefix of the KV caches from the "
           "previous request (llama-server's `cache_prompt`)", (), commands=frozenset()),
    Option("id_slot", int, -1, "the slot the generation runs on (llama-server's `id_slot`; -1 = "
           "any: a free slot, the one whose cache shares the longest prefix with the prompt)",
           (), range=Range(lo=-1, note="-1 = any"), commands=frozenset()),
    Option("n_probs", int, None, "log-probabilities of each emitted token and of its N most likely "
           "alternatives (llama-server's `n_probs`; 0 = the token's own only; none = not "
           "computed, no cost); read from the verifier's row of each emitted token, accepted "
           "drafts included (docs/maths.md \"Log-probabilities of what was emitted\")", (),
           range=Range(lo=0, hi=256), optional=True, shown_default="none",
           commands=frozenset()),
    Option("post_sampling_probs", bool, True, "`n_probs` are of the verifier's law q, after the "
           "request's warps and grammar (what it samples from; a token outside them has none) "
           "or, false, of its raw log-softmax (no warp, no grammar: llama-server's default)", (),
           commands=frozenset()),
    # -- load: the engine's models and contexts --------------------------------------------------
    Option("n_ctx", int, 4096, "context size (KV cache, tokens) of both models; llama.cpp rounds it "
           "up to a multiple of 256; 0 = the model's own", ("-c", "--ctx-size"), scope="load",
           range=Range(lo=16, also=(0,), note="0 = the model's own"), metavar="N"),
    Option("n_parallel", int, 1, "slots: generations served side by side, each with its own "
           "sequence of both contexts (prompt cache, recurrent state) of n_ctx / N positions, "
           "as llama-server's `--parallel` (its per-slot context); one step of each a round, "
           "their verifications in one batch (docs/server.md \"Slots\")",
           ("-np", "--parallel"), scope="load", range=Range(lo=1, hi=64),
           commands=frozenset({"serve"}), metavar="N"),
    Option("kv_unified", bool, False, "the slots share one KV cache of n_ctx cells, each up to "
           "all of it (llama-server's `--kv-unified`): a slot's context is n_ctx, and a request "
           "stops when the cells run out; slots' steps of any draft lengths verify in one graph",
           ("-kvu", "--kv-unified"), scope="load", commands=frozenset({"serve"})),
    Option("context_shift", bool, False, "when a generation fills the context, discard the older "
           "half of it after the prompt's first token (BOS) and go on, as llama-server's "
           "`--context-shift` (both KV caches shift; answers report `truncated`); refused for a "
           "model with a recurrent state, whose cache cannot shift. Off: the generation stops "
           "at a full context", ("--context-shift", "--no-context-shift"), scope="load"),
    Option("n_batch", int, 512, "most tokens per `llama_decode` (prompt processing is chunked)",
           ("-b", "--batch-size"), scope="load", range=Range(lo=1), metavar="N"),
    Option("n_threads", int, None, "CPU threads (1–512). On a machine busy with other work, fewer "
           "threads than cores is often much faster: llama.cpp's threads spin-wait for each other",
           ("-t", "--threads"), scope="load", range=Range(lo=1, hi=512), optional=True,
           shown_default="all cores", metavar="N"),
    Option("n_gpu_layers", int, -1, "verifier layers offloaded to the GPU (-1 = all; ignored by CPU "
           "builds)", ("-ngl", "--n-gpu-layers"), scope="load", range=Range(lo=-1, note="-1 = all"),
           metavar="N"),
    Option("n_gpu_layers_draft", int, -1, "draft layers offloaded to the GPU (-1 = all)",
           ("-ngld", "--n-gpu-layers-draft"), scope="load", range=Range(lo=-1, note="-1 = all"),
           metavar="N"),
    Option("flash_attn", str, "auto", "flash attention: auto, on, off", ("-fa", "--flash-attn"),
           scope="load", choices=("auto", "on", "off")),
    Option("repack", bool, None, "llama.cpp's weight repacking for faster CPU kernels (extra "
           "buffer types); default: on, except on an AMX CPU with an AMX build (llama.cpp #20824)",
           ("--repack",), scope="load", optional=True, shown_default="auto"),
    Option("rpc", str, None, "RPC servers (llama.cpp's `rpc-server`) the verifier's offloaded "
           "layers go to, `HOST:PORT[,HOST:PORT...]`, each checked before loading; needs a build "
           "with `-DGGML_RPC=on`. Unauthenticated: loopback or a trusted network only",
           ("--rpc",), scope="load", optional=True, metavar="SERVERS", shown_default="none",
           normalize=lambda v: _endpoints(v, "rpc")),
    Option("rpc_draft", str, None, "RPC servers for the draft's offloaded layers (format of "
           "`--rpc`; default: the draft stays on this machine)", ("--rpc-draft",), scope="load",
           optional=True, metavar="SERVERS", shown_default="none",
           normalize=lambda v: _endpoints(v, "rpc_draft")),
    Option("device", str, None, "devices for the verifier's offloaded layers, comma-separated "
           "llama.cpp names (CUDA0, Metal, RPC0, ...; `none` = CPU only); default: this machine's "
           "GPUs, then the `--rpc` servers", ("-dev", "--device"), scope="load", optional=True,
           metavar="DEVS", shown_default="GPUs + --rpc"),
    Option("device_draft", str, None, "devices for the draft's offloaded layers (as `--device`); "
           "default: this machine's GPUs, then the `--rpc-draft` servers",
           ("-devd", "--device-draft"), scope="load", optional=True, metavar="DEVS",
           shown_default="GPUs + --rpc-draft"),
    Option("tensor_split", str, None, "proportion of the verifier's offloaded layers per device, "
           "in device order, e.g. `3,1` (llama.cpp's `--tensor-split`)", ("-ts", "--tensor-split"),
           scope="load", optional=True, metavar="N0,N1,...", shown_default="by free memory",
           normalize=lambda v: _tensor_split(v)),
    Option("chat_template_file", str, None, "a Jinja chat template (its text or a file) used "
           "instead of the GGUF's, for chat prompts and tool calls (llama-server's "
           "`--chat-template-file`)", ("--chat-template-file",), scope="load", optional=True,
           metavar="FILE", shown_default="the GGUF's", file_or_text=True,
           normalize=check_template),
    Option("chat_template", str, None, "a chat template used instead of the GGUF's: the name "
           "of one of llama.cpp's built-in templates (`chatml`, `llama3`, `command-r`, ...: its "
           "own formatter, no tools) or a Jinja template's text (llama-server's "
           "`--chat-template`)", ("--chat-template",), scope="load", optional=True,
           metavar="TEMPLATE", shown_default="the GGUF's", normalize=check_chat_template),
    Option("reasoning", str, "auto", "thinking in chat prompts, given to the template as "
           "`enable_thinking`: `on`, `off`, or `auto` = on where the template has that switch "
           "(llama-server's `-rea`; docs/server.md \"Chat templates and reasoning\")",
           ("-rea", "--reasoning"), scope="load", choices=("on", "off", "auto")),
    # -- run: output -----------------------------------------------------------------------------
    Option("json", bool, False, "print one JSON object (text, settings, all statistics) instead of "
           "streaming", ("--json",), scope="run", commands=frozenset({"run", "models", "vocab"})),
    Option("verbose", int, 0, "`-v`: cactus-gguf's decisions on stderr (the draft length and "
           "why, drafting stopped, the rule and where its top gap applies, prefix reuse, the "
           "draft's vocabulary method, where each model's layers went); `-vv`: llama.cpp's log "
           "too; `serve -v`: every OpenAI answer that is not streamed also carries llama-server's "
           "`__verbose` object, as `llama-server --verbose` (a request's `verbose` field decides "
           "for itself)", ("-v", "--verbose"), scope="run", commands=_GEN, count=True,
           range=Range(lo=0)),
    Option("list_devices", bool, False, "print this llama.cpp build's backends and devices (with "
           "their memory) and the devices the verifier's and the draft's offloaded layers would "
           "use under the other options (`-ngl`, `--device`, `--rpc`...), then exit (as llama.cpp's "
           "`--list-devices`); a run's summary and `--json` say where each model's layers went",
           ("--list-devices",), scope="run", commands=_ALL),
    # -- serve: the OpenAI-compatible server -------------------------------------------------------
    Option("host", str, "127.0.0.1", "address to listen on, or several, comma-separated (as "
           "llama-server's; a non-loopback address without `--api-key` gets a warning)",
           ("--host",), scope="serve", metavar="ADDR[,ADDR]", commands=_SERVE, normalize=_hosts),
    Option("port", int, 8080, "port to listen on (0 = any free port)", ("--port",), scope="serve",
           range=Range(lo=0, hi=65535), metavar="N", commands=_SERVE),
    Option("api_key", str, None, "require the key: `Authorization: Bearer KEY` (as llama-server's; "
           "the scheme in any case) or `x-api-key: KEY`", ("--api-key",), scope="serve",
           optional=True, metavar="KEY", shown_default="none", commands=_SERVE),
    Option("alias", str, None, "the model id clients see (`GET /v1/models`, each response's "
           "`model`), as llama-server's `--alias`; several names, comma-separated, are all listed "
           "as the model's `aliases` and the first in sorted order is its id (as llama-server)",
           ("-a", "--alias"), scope="serve", optional=True, metavar="NAME[,NAME]",
           shown_default="pair or verifier name", commands=_SERVE,
           normalize=lambda v: _names(_nonempty(v, "alias"), "alias")),
    Option("tags", str, None, "tags listed with the model on `GET /v1/models` (`tags`), "
           "comma-separated; informational, as llama-server's `--tags`", ("--tags",),
           scope="serve", optional=True, metavar="TAG[,TAG]", shown_default="none",
           commands=_SERVE, normalize=lambda v: _names(v, "tags")),
    Option("strict_model", bool, False, "answer 404 to a request naming another model than the "
           "served id (default: any name is served, as llama-server does with one model)",
           ("--strict-model",), scope="serve", commands=_SERVE),
    Option("max_queue", int, 16, "most requests waiting for the engine; more get 503 with "
           "Retry-After", ("--max-queue",), scope="serve", range=Range(lo=0), metavar="N",
           commands=_SERVE),
    Option("request_timeout", float, 600.0, "seconds a request may take (waiting included); then it "
           "ends with what it has (finish_reason length)", ("--timeout",), scope="serve",
           range=Range(lo=0.0, lo_open=True), metavar="S", commands=_SERVE),
    Option("ui", bool, True, "serve the chat page at `/` (`--no-ui`: 404, as llama-server's)",
           ("--ui", "--no-ui"), scope="serve", commands=_SERVE),
    Option("metrics", bool, False, "serve Prometheus `GET /metrics` (without it: 501, as "
           "llama-server without `--metrics`)", ("--metrics",), scope="serve", commands=_SERVE),
    Option("sleep_idle_seconds", int, -1, "after this many seconds without a request that needs "
           "the models, free them (both models and their caches) and load them again at the next "
           "such request; `/health`, `/props`, `/models` and `/metrics` neither need nor wake "
           "them (llama-server's `--sleep-idle-seconds`)", ("--sleep-idle-seconds",),
           scope="serve", range=Range(lo=1, also=(-1,), note="-1 = never"), metavar="S",
           commands=_SERVE),
    Option("slots", bool, True, "serve `GET /slots`, the slot's state (`--no-slots`: 501, as "
           "llama-server's)", ("--slots", "--no-slots"), scope="serve", commands=_SERVE),
    Option("slot_save_path", str, None, "folder where `POST /slots/0?action=save` writes a slot's "
           "prompt cache (its KV cache and recurrent state) and `action=restore` reads it, as "
           "llama-server's `--slot-save-path`", ("--slot-save-path",), scope="serve",
           optional=True, metavar="DIR", shown_default="off", commands=_SERVE),
    Option("cors_origin", str, (), "allow browser pages from this origin (repeatable; `*` = any)",
           ("--cors-origin",), scope="serve", multiple=True, metavar="ORIGIN", shown_default="off",
           commands=_SERVE),
    # -- bench: the benchmark's own ----------------------------------------------------------------
    Option("prompts", str, None, 'JSONL prompt file, one {"prompt": ..., "id": ...} per line',
           ("--prompts",), scope="bench", optional=True, metavar="FILE", shown_default="HumanEval",
           commands=_BENCH),
    Option("limit", int, None, "use only the first N prompts", ("--limit",), scope="bench",
           range=Range(lo=1), optional=True, metavar="N", shown_default="all", commands=_BENCH),
    Option("configs", str, None, "configurations: none, draft (the draft model alone), sps, "
           "cactus (the paper's rule: no protected ends, no top gap), cactus-output (δ bounds the "
           "emitted tokens: `--budget output`), cactus-exact (the exact solver), cactus-ends "
           "(protected ends: `--protect-ends`, 0.1 when off), cactus-ends-gap (protected ends and "
           "`--top-gap`, 0.5 when inf: the default rule), typical, ears, topk, ngram, "
           "ngram-cactus, hybrid (cactus with `--drafter hybrid`), mtp-sps and mtp (sps / cactus "
           "with `--drafter mtp`: the verifier's next-n layers); `FAMILY@D` runs a Cactus "
           "family at δ = D only (`cactus-exact@1`)",
           ("--configs",), scope="bench", grid=True, optional=True,
           shown_default="none,sps,cactus,cactus-ends-gap,typical,ngram", commands=_BENCH),
    Option("schema", str, "both", "prompts that carry a `json_schema` (structured-output sets): "
           "run each configuration unconstrained (`off`), constrained by the schema (`on`: the "
           "`+schema` rows) or `both`", ("--schema",), scope="bench", choices=("both", "on", "off"),
           commands=_BENCH),
    Option("test_timeout", float, 5.0, "seconds allowed per pass@1 test run (one answer's tests)",
           ("--test-timeout",), scope="bench", range=Range(lo=0.0, lo_open=True), metavar="S",
           commands=_BENCH),
    Option("forward_repeats", int, 10, "repeats of each forward-cost probe", ("--forward-repeats",),
           scope="bench", range=Range(lo=1), metavar="N", commands=_BENCH),
    Option("output", str, "bench-out", "directory for bench.json, bench.md, bench.png and "
           "runs.jsonl (one line per finished prompt × configuration, written as they finish)",
           ("-o", "--output"), scope="bench", metavar="DIR", commands=_BENCH),
    Option("resume", str, None, "continue an interrupted run in DIR: the runs its runs.jsonl "
           "holds are kept, only the missing ones decoded (same options required); the report "
           "is written there", ("--resume",), scope="bench", optional=True, metavar="DIR",
           shown_default="", commands=_BENCH),
    Option("no_plot", bool, False, "do not write bench.png", ("--no-plot",), scope="bench",
           commands=_BENCH),
    Option("no_progress", bool, False, "hide the progress bars", ("--no-progress",), scope="bench",
           commands=frozenset({"bench", "pull"})),
    Option("peers", bool, False, "also run llama.cpp's own speculative decoding on the same "
           "prompts, models, seeds and sampling, per answer beside every configuration: "
           "llama-server `-md DRAFT --spec-type draft-simple --spec-draft-n-max K` at "
           "`--spec-draft-p-min` 0.75 and 0, for each fixed k (`llama-server` on PATH, else built "
           "once from llama-cpp-python's vendored llama.cpp into the cache: ~10 min on 2 cores)",
           ("--peers",), scope="bench", commands=_BENCH),
    Option("kernels", bool, False, "instead: micro-benchmark the native verify step against the "
           "NumPy reference", ("--kernels",), scope="bench", commands=_BENCH),
    Option("repeats", int, 30, "`--kernels`: timed repeats per cell", ("--repeats",), scope="bench",
           range=Range(lo=1), metavar="N", commands=_BENCH),
)

BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
assert len(BY_NAME) == len(OPTIONS), "option names must be unique"


def options_in(scope: str | Iterable[str] | None = None, command: str | None = None) -> list[Option]:
    """The options of a scope (or scopes) and/or a command, in table order."""
    scopes = {scope} if isinstance(scope, str) else (set(scope) if scope is not None else None)
    return [o for o in OPTIONS if (scopes is None or o.scope in scopes)
            and (command is None or command in o.commands)]


def default(name: str, command: str | None = None) -> Any:
    """The default of option ``name`` (for ``command``, when it has its own)."""
    return BY_NAME[name].default_for(command)


def check_value(name: str, value: Any) -> Any:
    """``value`` if option ``name`` allows it, else InputError(param=name) saying why."""
    problem = BY_NAME[name].problem(value)
    if problem is not None:
        raise InputError(f"{{{name}}} {problem}", param=name)
    return value


# ------------------------------------------------------------------------------------------------
# The flag tables of docs/options.md
# ------------------------------------------------------------------------------------------------

def _shown_default(o: Option, command: str) -> str:
    if o.shown_default is not None:
        return o.shown_default
    d = o.default_for(command)
    if o.type is bool:
        return "on" if d else "off"
    if isinstance(d, tuple):
        return ",".join(number_text(x) for x in d)
    return number_text(d)


def _flag_cell(o: Option) -> str:
    names = [f for f in o.flags if f.startswith("-")]
    positional = [f for f in o.flags if not f.startswith("-")]
    short = [f for f in names if not f.startswith("--")]
    long = [f for f in names if f.startswith("--")]
    text = "/".join(short + long)
    if o.type is not bool and o.metavar and text:
        text += f" {o.metavar}"
    cells = [f"`{p}`" for p in positional] + ([f"`{text}`"] if text else [])
    return ", ".join(cells)


def markdown_table(command: str = "run") -> str:
    """The Markdown flag table of ``command`` (docs/options.md; ``python docs/generate.py``)."""
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    for o in OPTIONS:
        if command in o.commands and o.flags:
            rows.append(f"| {_flag_cell(o)} | {_shown_default(o, command)} | {o.help} |")
    return "\n".join(rows) + "\n"

