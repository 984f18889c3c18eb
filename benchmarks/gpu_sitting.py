"""The GPU sitting's models and bench steps (benchmarks/gpu_sitting.sh runs this after the build).

    python benchmarks/gpu_sitting.py -o OUT --quantize LLAMA_QUANTIZE

1. **models**: the synthetic pair (benchmarks/synthetic_pair.py: the default pair's shapes,
   tokenizer and Q4_K_M quantization, random weights arranged so the draft predicts the verifier's
   next token on a share ``AGREE`` of the tokens) into WORK/models, once.
2. **bench**: ``cactus-gguf bench`` with every layer offloaded (``-ngl 99 -ngld 99``), one
   interleaved run per set (:data:`RUNS`): 6 HumanEval problems greedy and 6 chat questions
   (benchmarks/prompts/chat-questions.jsonl) at the pair's T 0.6 / top-k 20 / top-p 0.95 / min-p 0,
   each with the verifier alone (``none``), the default rule (Cactus δ = 1, protected ends, top
   gap: ``cactus-ends-gap``) and SpS at ``-k 4`` and ``-k auto``, and llama-server's
   ``--spec-type draft-simple`` at k = 4 (``--peers``: p-min 0.75 and 0; the llama-server of the
   same build is first on PATH); then the same sets with ``--backend-sampling on`` for the
   verifier alone and the default rule (a second run: not interleaved with the first).
   Each bench run is stopped when the sitting's time budget (``BUDGET``, 560 s from the shell
   script's start) would be exceeded; the same command again resumes it (``--resume``).
3. **report**: OUT/bench.md (what the numbers mean, the sitting's facts, each run's bench.md) and
   OUT/bench.json (the steps' seconds, the pair, each run's bench.json).

Environment (gpu_sitting.sh passes it on): WORK, BACKEND, STEPS, T_START, BUDGET (560), N_PREDICT
(128), PROMPTS (6), AGREE (0.9), SIZE (real | tiny), THREADS, CTX (2048), RUNS (the names of
:data:`RUNS` to run, comma-separated; all by default).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import synthetic_pair  # noqa: E402
from gpu_tree import PAIR_FILE  # noqa: E402

CHAT = REPO / "benchmarks" / "prompts" / "chat-questions.jsonl"
# the default pair's sampling (models.yaml) for the chat set; HumanEval greedy, so every
# configuration emits the verifier's own tokens there
PAIR_WARPS = ["--top-k", "20", "--top-p", "0.95", "--min-p", "0"]
SETS = {"humaneval": ["--temp", "0"],
        "chat": ["--prompts", str(CHAT), "--chat", "--temp", "0.6"]}
FULL = ["--configs", "none,sps,cactus-ends-gap@1", "-k", "4,auto", "--peers"]
DEVICE_SAMPLING = ["--configs", "none,cactus-ends-gap@1", "-k", "4,auto",
                   "--backend-sampling", "on"]
# name -> (set, arguments): the bench runs, in the order they run
RUNS = {"humaneval": ("humaneval", FULL + ["--backend-sampling", "off"]),
        "chat": ("chat", FULL + ["--backend-sampling", "off"]),
        "humaneval-backend-sampling": ("humaneval", DEVICE_SAMPLING),
        "chat-backend-sampling": ("chat", DEVICE_SAMPLING)}

MEANING = """\
**What these numbers are.** The pair is synthetic (benchmarks/synthetic_pair.py): the default
pair's architecture, every tensor at its shape, its tokenizer and chat template, quantized to
Q4_K_M by this build's llama-quantize, with random weights arranged so that each model continues a
token with a fixed successor and the draft agrees with the verifier on a share AGREE of the tokens
(the real pair, 1.6 GB, cannot travel to the GPU machine: 64 MiB). So:

- **real**: the forward costs (verifier 1 … k + 1 rows, draft 1 row: what `-k auto` plans with),
  seconds per token and per answer of every configuration *at this acceptance*, the host's share
  of a step, and llama.cpp's own speculation (llama-server draft-simple) on the same models;
- **set by construction, not measured**: the acceptance (each drafted token is accepted with
  probability ≈ AGREE, independently, until the first rejection: at k = 4 that is
  (p + p² + p³ + p⁴) / 4 of the drafts, 0.77 for p = 0.9, greedy or sampled; the real pair's
  SpS at k = 4 gives 0.82 on HumanEval, p ≈ 0.92, and 0.71 on chat, p ≈ 0.87), answer lengths
  (every answer runs to `-n`: no token of the chain ends it) and pass@1 (0: the answers are word
  salad);
- **not what the real pair gives**: which tokens are written. Where a configuration's verifier
  calls per answer differ from the real pair's CPU runs (benchmarks/results/), the acceptance is
  why.

HumanEval is greedy (every configuration must emit the verifier alone's tokens; since the blocks
add almost nothing to the residual stream, this shows the pipeline runs on the device, not that a
KV-cache rollback is exact there), chat sampled at the pair's T 0.6, top-k 20, top-p 0.95, min-p 0. The
`--backend-sampling on` runs come after the others (not interleaved with them): compare their
`none` with the first run's `none` before reading their ratios."""


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def log(msg: str) -> None:
    print(msg, flush=True)


def models_step(work: Path, quantize: Path) -> dict:
    """The synthetic pair in WORK/models (made once per size, agreement and seed)."""
    size, agree = os.environ.get("SIZE", "real"), float(os.environ.get("AGREE", "0.9"))
    models = work / "models"
    done = models / "pair.json"
    if done.exists():
        report = json.loads(done.read_text())
        if report["size"] == size and report["agree"] == agree:
            log(f"== models: already made ({size}, agree {agree})")
            return report
    t0 = time.monotonic()
    desc = synthetic_pair.load_description(REPO / ".gpu" / PAIR_FILE)
    f16 = models / "f16.json"
    made = json.loads(f16.read_text()) if f16.exists() else {}
    if (made.get("size"), made.get("agree")) == (size, agree) \
            and (models / "verifier-f16.gguf").exists():  # written while llama.cpp compiled
        report = synthetic_pair.quantize_pair(desc, models, quantize, threads=os.cpu_count(),
                                              log=log)
    else:
        report = synthetic_pair.make_pair(desc, models, quantize, agree=agree, size=size,
                                          threads=os.cpu_count(), log=log)
    report["seconds"] = round(time.monotonic() - t0, 1)
    done.write_text(json.dumps(report, indent=1) + "\n")
    log(f"== models: made in {report['seconds']:.0f} s")
    return report


def bench_step(work: Path, pair: dict, deadline: float) -> dict:
    """Each run of RUNS (or of $RUNS) into WORK/bench/NAME; returns name -> status and seconds."""
    wanted = os.environ.get("RUNS", ",".join(RUNS)).split(",")
    common = ["-m", pair["models"]["verifier"]["path"], "-md", pair["models"]["draft"]["path"],
              "--limit", str(env_int("PROMPTS", 6)), "-n", str(env_int("N_PREDICT", 128)),
              "-c", str(env_int("CTX", 2048)), "--delta", "1", *PAIR_WARPS,
              "-ngl", "99", "-ngld", "99", "--forward-repeats", "3", "--no-progress",
              "--no-plot"]
    if os.environ.get("THREADS"):
        common += ["-t", os.environ["THREADS"]]
    status = {}
    for name in wanted:
        set_name, extra = RUNS[name]
        out = work / "bench" / name
        if (out / "bench.md").exists():
            status[name] = {"status": "done before", "seconds": 0}
            continue
        left = deadline - time.monotonic()
        if left < 30:
            status[name] = {"status": "not run: no time left (run the same command again)",
                            "seconds": 0}
            log(f"== bench {name}: not run, {left:.0f} s left")
            continue
        where = ["--resume", str(out)] if (out / "runs.jsonl").exists() else ["-o", str(out)]
        cmd = [sys.executable, "-m", "cactus_gguf", "bench", *common, *SETS[set_name], *extra,
               *where]
        log(f"== bench {name}: {' '.join(cmd[3:])}")
        t0 = time.monotonic()
        # its own process group, so that a run stopped at the budget takes its llama-servers along
        proc = subprocess.Popen(cmd, start_new_session=True)
        try:
            code = proc.wait(timeout=left - 10)
            state = "done" if code == 0 else f"failed (exit {code})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            state = "stopped at the time budget: the same command again resumes it"
        status[name] = {"status": state, "seconds": round(time.monotonic() - t0, 1),
                        "command": cmd[3:]}
        log(f"== bench {name}: {state} in {status[name]['seconds']:.0f} s")
    return status


def greedy_agreement(benches: dict) -> dict:
    """(run, config) -> (answers whose text is the verifier alone's, answers) for the greedy runs:
    at temperature 0 a speculative configuration must write the verifier alone's tokens."""
    same = {}
    for run, bench in benches.items():
        if bench.get("settings", {}).get("temperature") != 0:
            continue
        alone = {r["prompt"]: r["text"] for r in bench["runs"] if r["config"] == "none"}
        for r in bench["runs"]:
            if r["config"] != "none" and r["prompt"] in alone:
                n, total = same.get((run, r["config"]), (0, 0))
                same[(run, r["config"])] = (n + (r["text"] == alone[r["prompt"]]), total + 1)
    return same


def report(out: Path, work: Path, pair: dict | None, status: dict) -> None:
    """OUT/bench.md and OUT/bench.json from the steps' records and each run's bench files."""
    steps = []
    if (out / "steps.jsonl").exists():
        steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    benches, sections = {}, []
    for name in RUNS:
        d = work / "bench" / name
        if (d / "bench.json").exists():
            benches[name] = json.loads((d / "bench.json").read_text())
            command = " ".join(status.get(name, {}).get("command", []))
            sections += [f"## {name}", "", f"`cactus-gguf {command}`" if command else "", "",
                         (d / "bench.md").read_text(), ""]
        elif name in status:
            sections += [f"## {name}", "", f"{status[name]['status']}.", ""]
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                          "--format=csv,noheader"], capture_output=True, text=True) \
        if os.environ.get("BACKEND", "cuda") == "cuda" else None
    device = smi.stdout.strip() if smi is not None and smi.returncode == 0 else "no GPU (CPU build)"
    doc = {"schema": "cactus-gguf-gpu-sitting/1", "backend": os.environ.get("BACKEND", "cuda"),
           "device": device, "steps": steps, "pair": pair, "bench_status": status,
           "benches": benches}
    (out / "bench.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    build = next((s for s in steps if s["step"] == "build"), None)
    cpu = next((s for s in steps if s["step"] == "build-cpu-seconds"), None)
    head = [f"# GPU sitting: {doc['backend']}, {device}", "",
            MEANING.replace("AGREE", str(pair["agree"]) if pair else "AGREE"), "",
            "Steps: " + "; ".join(
                [f"{s['step']} {s['seconds']} s ({s.get('status', '')})"
                 for s in steps if s["step"] != "build-cpu-seconds"]
                + ([f"models {pair['seconds']} s"] if pair and "seconds" in pair else [])
                + [f"bench {name} {st['seconds']:.0f} s ({st['status']})"
                   for name, st in status.items()])
            + (f"; the build's compile took {cpu['seconds']} CPU seconds on {cpu['jobs']} jobs"
               if cpu else "") + ".", ""]
    if pair:
        head += ["Models: " + "; ".join(
            f"{role} {m['bytes'] / 2**20:.0f} MiB ({m['same_type_as_real']} of {m['tensors']} "
            f"tensors of {m['real_file']}'s quantization type)"
            for role, m in pair["models"].items())
            + f"; size {pair['size']}, the draft agrees on {pair['draft_agrees_on']:.3f} of the "
              "tokens.", ""]
    if build is None:
        head += ["(No build step recorded in this call.)", ""]
    same = greedy_agreement(benches)
    if same:
        head += ["Greedy (HumanEval, temperature 0): answers with the verifier alone's text, per "
                 "configuration: " + "; ".join(f"{run} {cfg} {n}/{total}"
                                              for (run, cfg), (n, total) in same.items()) + ".", ""]
    doc["greedy_same_as_verifier_alone"] = {f"{run} {cfg}": v for (run, cfg), v in same.items()}
    (out / "bench.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (out / "bench.md").write_text("\n".join(head + sections) + "\n")
    log(f"== report: {out / 'bench.md'}, {out / 'bench.json'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--quantize", type=Path, required=True, help="llama-quantize of the build")
    args = ap.parse_args()
    work = Path(os.environ.get("WORK", "/tmp/gpu-sitting"))
    steps = os.environ.get("STEPS", ",models,bench,")
    start = float(os.environ.get("T_START", time.time()))
    deadline = time.monotonic() + env_int("BUDGET", 560) - (time.time() - start)
    os.environ.setdefault("CACTUS_GGUF_CACHE", str(work / "cache"))  # this machine's costs
    pair = models_step(work, args.quantize) if ",models," in steps else None
    if pair is None and (work / "models" / "pair.json").exists():
        pair = json.loads((work / "models" / "pair.json").read_text())
    status = {}
    if ",bench," in steps:
        if pair is None:
            sys.exit("gpu_sitting: no models (run the models step)")
        status = bench_step(work, pair, deadline)
    report(args.output, work, pair, status)
    failed = [n for n, s in status.items() if s["status"].startswith("failed")]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
