"""The benchmark layer: does speculative decoding pay off on *this* machine, with *these* models?

One run loads the verifier and the draft once and decodes the same prompts, with the same seeds,
under every configuration: the verifier alone (``none``), speculative sampling (``sps``), Cactus at a
grid of KL budgets δ, typical acceptance, and the n-gram drafter, at each draft length k of a grid.
Runs are interleaved, prompt by prompt, with the configuration order rotated from one prompt to the
next, so that a machine whose speed drifts (thermal throttling, a neighbour's job) slows every
configuration alike; speed is then compared through per-prompt ratios, which that drift cancels.

Glossary (as in ``speculative/engine.py``): drafted / accepted tokens, acceptance length (AL: accepted
drafts per verification step), tokens per verifier call (AL + 1 whenever a draft was made), time
split: draft (draft model forwards and sampling), verify (verifier forwards), accept (the native
acceptance step), other (everything else in the decode loop: Python overhead, detokenization).

Modules: ``grid`` (configurations) · ``prompts`` · ``scoring`` (HumanEval pass@1) · ``summary``
(statistics, pure functions) · ``run`` (plan and run; forward costs from speculative/costs.py) · ``report``
(table, JSON) · ``plot`` · ``kernels`` (native-kernel micro-benchmark). The CLI
(``cactus-gguf bench``) only parses options and prints.
"""
from .grid import FAMILIES, METHODS, config_grid, default_methods, request_for, schedule
from .kernels import format_kernel_table, kernel_benchmark
from .prompts import BenchPrompt, load_humaneval, load_prompts_jsonl, render_prompt
from .report import format_markdown, format_table, write_report
from .run import JOURNAL, SCHEMA, BenchPlan, model_sha256, plan_bench, run_bench
from .scoring import check_completion, extract_completion
from .summary import median_ratio, quantiles, summarize

__all__ = ["FAMILIES", "METHODS", "SCHEMA", "JOURNAL", "BenchPlan", "BenchPrompt", "plan_bench", "run_bench",
           "write_report", "format_table", "format_markdown", "config_grid", "default_methods",
           "request_for", "schedule", "quantiles", "median_ratio", "summarize",
           "extract_completion", "check_completion", "load_humaneval", "load_prompts_jsonl",
           "render_prompt", "kernel_benchmark", "format_kernel_table", "model_sha256"]
