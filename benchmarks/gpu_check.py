"""The GPU check: build llama.cpp with a GPU backend, then check and time the pair on the device.

    BACKEND=cuda benchmarks/gpu_check.sh OUT [SDIST [WHEELS]]     # the one command (see there)
    python benchmarks/gpu_check.py --backend vulkan --sdist SDIST -o OUT [-m VERIFIER -md DRAFT]

1. **Build**: llama.cpp from the llama-cpp-python sdist's vendored source with the backend's CMake
   flag (tests/support/llama_build.py; cached per backend, version and flags in
   ~/.cache/cactus-gguf/gpu-build), then this script runs again on it (``LLAMA_CPP_LIB_PATH``;
   for Vulkan also ``CACTUS_GGUF_LAVAPIPE_WARMUP=1``, which gpu_check.sh sets too: contexts on
   Mesa's lavapipe make the warm-up that keeps the driver alive, cactus_gguf/llama/lavapipe.py).
2. **Devices**: ``cactus-gguf run --list-devices -ngl 99 -ngld 99``, and where each model's layers
   went once loaded with every layer offloaded (``-ngl 99 -ngld 99``).
3. **Greedy equivalence**: on each prompt, SpS and Cactus (temperature 0) give the tokens of the
   verifier alone on the same device, token for token (a speculative engine must not change a
   greedy answer; the device's kernels round differently from the CPU's, so the reference is the
   same device's verifier).
4. **Cost probe**: median ms of one ``llama_decode`` of the verifier with 1 … 17 tokens (all rows'
   logits, as in verification) and of the draft with 1 token (speculative/costs.py): the curve
   ``-k auto`` plans with.
4b. **Split placements**: the verifier on the device and the draft on the CPU, the reverse, and
   10 of the verifier's layers offloaded: greedy SpS equals the verifier alone placed the same,
   on the first prompt (``run -ngl N -ngld M``; the tests check these placements on tiny models,
   tests/test_vulkan.py).
5. **Small bench**: ``cactus-gguf bench`` of none, sps and the default rule (cactus-ends-gap:
   δ = 1, protected ends, the top gap) on the first prompts, sampled with the pair's settings, on
   the device: per answer (seconds, verifier calls, tokens) and per token, its bench.json /
   bench.md under OUT/bench. With ``--peers`` (gpu_check.sh: ``PEERS=1``) llama.cpp's own
   speculation runs beside them (``bench --peers``: llama-server at p-min 0.75 and 0, every
   layer offloaded), from a llama-server built once with the same backend flag
   (cactus_gguf/bench/build.py; cached apart from the CPU build) and put first on the bench's
   PATH.

Writes OUT/gpu-check.json (everything) and OUT/gpu-check.md (the tables). Exit code 1 when a
greedy answer differs, 0 otherwise. Needs no network when the models are local files (or in the
cache) and an sdist is given.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support.llama_build import BACKEND_FLAGS, gpu_build  # noqa: E402

# the verifier alone first, then SpS and Cactus on the same engine (one-row decodes, then multi-row
# verifications: the order that crashed lavapipe before Context's warm-up, llama/context.py)
METHODS = ("none", "sps", "cactus")
ALL_LAYERS = ("-ngl", "99", "-ngld", "99")


def cli(*args: str, path: Path | None = None) -> subprocess.CompletedProcess:
    """``cactus-gguf ARGS`` in this environment (the GPU build), output captured; ``path``: a
    directory put first on its PATH."""
    env = None
    if path is not None:
        env = {**os.environ, "PATH": os.pathsep.join([str(path), os.environ.get("PATH", "")])}
    return subprocess.run([sys.executable, "-m", "cactus_gguf", *args], capture_output=True,
                          text=True, env=env)


def models(args) -> tuple[str, str, dict]:
    """The verifier and draft paths (given, else the registry's default pair from the cache) and
    the pair's recommended settings."""
    from cactus_gguf.registry import load_registry, resolve_model

    pair = load_registry().default_pair
    ver = args.model or str(resolve_model(pair.verifier))
    dft = args.model_draft or str(resolve_model(pair.draft))
    return ver, dft, dict(pair.settings)


def prompts(n: int) -> list[str]:
    from cactus_gguf.bench.prompts import load_humaneval

    return [p.problem["prompt"] for p in load_humaneval(n)]


def greedy(engine, texts: list[str], n_predict: int) -> list[dict]:
    """Per prompt and method: the tokens' agreement with the verifier alone, and the counts."""
    rows = []
    for i, text in enumerate(texts):
        got = {}
        for method in METHODS:
            t0 = time.perf_counter()
            r = engine.generate(text, n_predict=n_predict, method=method, k=4, delta=1.0,
                                temperature=0.0, seed=0, cache_prompt=False)
            seconds = time.perf_counter() - t0
            got[method] = r
            st = r.stats
            rows.append({"prompt": i, "method": method, "n_tokens": len(r.tokens),
                         "seconds": seconds,
                         "verifier_calls": st.n_steps, "n_drafted": st.n_drafted,
                         "n_accepted": st.n_accepted})
        for row in rows[-len(METHODS):]:
            row["same_as_verifier_alone"] = got[row["method"]].tokens == got["none"].tokens
            print(json.dumps(row), flush=True)
    return rows


SPLITS = (("99", "0"), ("0", "99"), ("10", "99"))  # (-ngl, -ngld): draft-cpu, verifier-cpu, partial


def split_placements(ver: str, dft: str, text: str, args) -> list[dict]:
    """Per (-ngl, -ngld) of SPLITS: where each model went and whether greedy SpS (k 4) gave the
    tokens of the verifier alone placed the same (12 tokens of ``text``)."""
    rows = []
    for ngl, ngld in SPLITS:
        got = {}
        for method in ("none", "sps"):
            r = cli("run", ver, dft, "-p", text, "-n", "12", "-c", str(args.ctx_size), "-ngl", ngl,
                    "-ngld", ngld, "--method", method, "-k", "4", "--temp", "0", "-t",
                    str(args.threads), "--json")
            if r.returncode != 0:
                sys.exit(f"gpu_check: run -ngl {ngl} -ngld {ngld} failed: {r.stderr[-2000:]}")
            got[method] = json.loads(r.stdout)
        row = {"ngl": ngl, "ngld": ngld,
               "verifier": got["sps"]["placement"]["verifier"]["summary"],
               "draft": got["sps"]["placement"]["draft"]["summary"],
               "n_drafted": got["sps"]["n_drafted"], "n_accepted": got["sps"]["n_accepted"],
               "same_as_verifier_alone": got["sps"]["tokens"] == got["none"]["tokens"]}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def measure(args) -> int:
    from cactus_gguf import Engine, LoadOptions
    from cactus_gguf.llama.hw import build_facts, machine_facts
    from cactus_gguf.speculative.costs import measure_forward_costs

    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    ver, dft, settings = models(args)
    texts = prompts(args.prompts)
    t_start = time.monotonic()
    listed = cli("run", "--list-devices", *ALL_LAYERS)
    if listed.returncode != 0:
        sys.exit(f"gpu_check: --list-devices failed: {listed.stderr.strip()}")
    report = {"backend": args.backend, "cmake_flags": BACKEND_FLAGS[args.backend],
              "build_seconds": float(os.environ.get("CACTUS_GPU_BUILD_SECONDS", "nan")),
              "verifier": ver, "draft": dft, "n_predict": args.n_predict, "prompts": len(texts),
              "n_ctx": args.ctx_size, "threads": args.threads, "machine": machine_facts(),
              "build": build_facts(),
              "devices": listed.stdout.splitlines()}
    print("\n".join(report["devices"]), flush=True)
    load = LoadOptions(n_ctx=args.ctx_size, n_threads=args.threads, n_gpu_layers=99,
                       n_gpu_layers_draft=99)
    with Engine(ver, dft, load) as engine:
        report["placement"] = {"verifier": engine.verifier.model.placement.summary(),
                               "draft": engine.draft.model.placement.summary()}
        print(f"verifier: {report['placement']['verifier']}; "
              f"draft: {report['placement']['draft']}", flush=True)
        t0 = time.monotonic()
        report["greedy"] = greedy(engine, texts, args.n_predict)
        report["greedy_seconds"] = time.monotonic() - t0
        t0 = time.monotonic()
        context = engine.tokenize(texts[0])[:64]
        report["forward_ms"] = measure_forward_costs(engine, context, ks=range(1, 17),
                                                     repeats=args.repeats)
        report["probe_seconds"] = time.monotonic() - t0
    t0 = time.monotonic()
    report["splits"] = split_placements(ver, dft, texts[0], args)
    report["splits_seconds"] = time.monotonic() - t0
    server_dir = None
    if args.peers:  # llama-server with this backend, before the bench's clock starts
        from cactus_gguf.bench.build import llama_server

        server = llama_server(sdist=args.sdist, backend_flags=BACKEND_FLAGS[args.backend],
                              log=print)
        server_dir, report["peer_server"] = server.parent, str(server)
    t0 = time.monotonic()
    bench_dir = out / "bench"
    sampling = [f"--{name.replace('_', '-')}={settings[name]}"
                for name in ("temperature", "top_k", "top_p", "min_p") if name in settings]
    sampling = [s.replace("--temperature", "--temp") for s in sampling]
    r = cli("bench", "-m", ver, "-md", dft, "--limit", str(args.prompts), "-n",
            str(args.n_predict), "-c", str(args.ctx_size), "-k", "4",
            "--configs", "none,sps,cactus-ends-gap@1", *sampling,
            *ALL_LAYERS, "-t", str(args.threads), "--forward-repeats", "1", "--no-progress",
            "--no-plot", "--output", str(bench_dir), *(["--peers"] if args.peers else []),
            path=server_dir)
    if r.returncode != 0:
        sys.exit(f"gpu_check: bench failed: {r.stderr.strip()[-2000:]}")
    report["bench_seconds"] = time.monotonic() - t0
    report["bench"] = str(bench_dir.relative_to(out))
    report["bench_per_answer"] = per_answer(bench_dir)
    report["total_seconds"] = time.monotonic() - t_start
    report["greedy_all_equal"] = all(row["same_as_verifier_alone"]
                                     for row in report["greedy"] + report["splits"])
    write_report(out, report)
    return 0 if report["greedy_all_equal"] else 1


def per_answer(bench_dir: Path) -> list[str]:
    """The per-answer table of the bench's bench.md (its first table)."""
    lines = (bench_dir / "bench.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def write_report(out: Path, report: dict) -> None:
    """gpu-check.json and gpu-check.md in ``out``."""
    (out / "gpu-check.json").write_text(json.dumps(report, indent=1, default=str) + "\n",
                                        encoding="utf-8")
    cpu = report["machine"].get("cpu", "?")
    md = [f"# GPU check: {report['backend']}", "",
          f"Machine: {cpu}; {report['threads']} threads. Verifier {Path(report['verifier']).name}, "
          f"draft {Path(report['draft']).name}. Build {report['build_seconds']:.0f} s, checks "
          f"{report['total_seconds']:.0f} s (greedy {report['greedy_seconds']:.0f} s, cost probe "
          f"{report['probe_seconds']:.0f} s, bench {report['bench_seconds']:.0f} s).", "",
          "Devices (`--list-devices -ngl 99 -ngld 99`):", "", "```", *report["devices"], "```", "",
          f"Loaded: verifier {report['placement']['verifier']}; draft "
          f"{report['placement']['draft']}.", "",
          f"## Greedy: speculation equals the verifier alone ({report['prompts']} prompts, "
          f"-n {report['n_predict']}, -c {report.get('n_ctx', 2048)}, k = 4)", "",
          "| prompt | method | tokens | same tokens as none | verifier calls | drafted | accepted |",
          "|---|---|---|---|---|---|---|"]
    md += [f"| {g['prompt']} | {g['method']} | {g['n_tokens']} | "
           f"{'yes' if g['same_as_verifier_alone'] else '**NO**'} | {g['verifier_calls']} | "
           f"{g['n_drafted']} | {g['n_accepted']} |" for g in report["greedy"]]
    md += ["", "## Split placements: greedy SpS equals the verifier alone placed the same "
           "(prompt 0, -n 12)", "", "| -ngl | -ngld | verifier | draft | same tokens | drafted | "
           "accepted |", "|---|---|---|---|---|---|---|"]
    md += [f"| {r['ngl']} | {r['ngld']} | {r['verifier']} | {r['draft']} | "
           f"{'yes' if r['same_as_verifier_alone'] else '**NO**'} | {r['n_drafted']} | "
           f"{r['n_accepted']} |" for r in report.get("splits", [])]
    fwd = report["forward_ms"]
    sizes = sorted(fwd["verifier"], key=int)
    md += ["", f"## Forward cost: median ms of one llama_decode ({fwd['repeats']} repeats, "
           f"{fwd['n_context']} tokens of context)", "",
           "| tokens | " + " | ".join(sizes) + " | draft, 1 |",
           "|---" * (len(sizes) + 2) + "|",
           "| verifier ms | " + " | ".join(f"{fwd['verifier'][s]:.1f}" for s in sizes)
           + f" | {fwd['draft']['1']:.1f} |",
           "| × 1 token | " + " | ".join(f"{fwd['verifier'][s] / fwd['verifier']['1']:.2f}"
                                       for s in sizes) + f" | {fwd['draft_over_verifier']:.2f} |",
           "", f"## Small bench (`{report['bench']}/`: sampled, per answer)", "",
           *report["bench_per_answer"]]
    (out / "gpu-check.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    print("\n".join(md))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=sorted(BACKEND_FLAGS), default="cuda")
    ap.add_argument("--sdist", type=Path, help="llama-cpp-python sdist (default: pip download)")
    ap.add_argument("-m", "--model", help="verifier GGUF (default: the default pair's)")
    ap.add_argument("-md", "--model-draft", help="draft GGUF (default: the default pair's)")
    ap.add_argument("-o", "--output", required=True, help="directory for gpu-check.json / .md")
    ap.add_argument("--prompts", type=int, default=4, help="HumanEval prompts (greedy and bench)")
    ap.add_argument("-n", "--n-predict", type=int, default=64)
    ap.add_argument("-c", "--ctx-size", type=int, default=2048,
                    help="n_ctx of both models (lavapipe: up to 768 needs no long warm-up)")
    ap.add_argument("--repeats", type=int, default=5, help="timed decodes per probed batch size")
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--peers", action="store_true",
                    help="also run llama.cpp's own speculation in the bench (llama-server built "
                         "with the backend: once, about 10-20 minutes)")
    args = ap.parse_args()
    build = gpu_build(args.backend, args.sdist)
    if os.environ.get("LLAMA_CPP_LIB_PATH") != str(build.lib):  # run again on the GPU build
        env = build.env(CACTUS_GPU_BUILD_SECONDS=f"{build.build_seconds:.0f}")
        sys.exit(subprocess.call([sys.executable, *sys.argv], env=env))
    sys.exit(measure(args))


if __name__ == "__main__":
    main()
