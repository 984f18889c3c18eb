"""A stand-in for the default pair where the real one cannot go: same shapes, chosen agreement.

    python benchmarks/synthetic_pair.py DESCRIPTION.json.xz OUT_DIR [--quantize LLAMA_QUANTIZE]
        [--agree 0.9] [--size real|tiny] [--seed 0]

The real pair (Qwen2.5-Coder 1.5B verifier, 0.5B draft, Q4_K_M: 1.6 GB) cannot travel to the GPU
machine (64 MiB). ``benchmarks/gpu_tree.py`` carries its description instead (tokenizer, chat
template, architecture keys, tensor names, shapes and types: ``qwen2.5-coder-pair.json.xz``), and
this script rebuilds a pair from it there: every tensor of the real pair at its shape, written as
F16 (norms and biases F32), then quantized with the ``llama-quantize`` of the same build to
Q4_K_M with every tensor at the real file's type (``--tensor-type-file``: this llama.cpp's Q4_K_M
recipe gives Q6_K to other blocks than the real files' older one), so that what llama.cpp
computes per token, per batch of k + 1 rows
and per draft token costs what the real pair's does (the weights' values do not change the
kernels' work). The report says how many tensors got the real file's quantization type.

The weights are random but arranged, so that answers have a known agreement instead of none
(two random models would never agree, and every speculative configuration would only lose):

- ``token_embd``: e_x ~ N(0, I), a random vector per token x (V = 151,936 rows of n_embd).
- The blocks: attention and FFN input projections N(0, 0.02²); their output projections
  (``attn_output``, ``ffn_down``) N(0, (1e-4)²), so each block adds almost nothing to the residual
  stream and the last hidden state at a position is that position's token embedding, e_x.
  All norms 1, all biases 0.
- ``output``: row y = c · Σ_{x: s(x) = y} e_x / |e_x|, for a successor map s (below), so the
  logit of s(x) after token x is c·sqrt(n_embd) (RMS-normed e_x against its own direction) and
  every other logit is about c·N(0, 1): with c = LOGIT_MARGIN / sqrt(n_embd) the successor leads
  by about LOGIT_MARGIN nats less the largest of V Gaussians (≈ 5c), so the model continues token
  x with s(x), nearly always, at temperature 0.6 as at 0.
- s: one random cycle through the *plain* tokens P (a normal token that is letters only, with or
  without its leading space: no end-of-generation token, no backtick, no newline, so no answer
  stops early and every answer runs to ``-n``); every other token's successor is a random plain
  token. The verifier and the draft share s, except on a random share 1 − ``agree`` of the tokens,
  where the draft's successor is another plain token: a drafted token is then accepted (greedy or
  SpS) with probability ≈ ``agree``, independently per position, until the first rejection; at
  k = 4 that accepts (p + p² + p³ + p⁴) / 4 of the drafts. The real pair's SpS at k = 4, T 0.6
  (docs/benchmarks.md "Which rule is the default") writes 4.26 tokens per verifier call on
  HumanEval (p ≈ 0.92) and 3.85 on chat (p ≈ 0.87), hence the default 0.9. Checked on this CPU
  at p = 0.8: greedy SpS k = 4 accepted 33 of 58 drafts (the formula: 59%).

What the pair's numbers mean: forward costs, seconds per token of each configuration and llama.cpp's
speculation are what the real pair's would be at that acceptance; acceptance itself, answer
lengths and pass@1 (0: the answers are word salad) are not the real pair's. ``--size tiny`` keeps
the vocabulary and the architecture but 2 blocks of width 256 (narrower, the successor no longer
leads every other logit by a safe margin): a quick rehearsal, no cost figure.
"""
from __future__ import annotations

import argparse
import json
import lzma
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

LOGIT_MARGIN = 20.0  # nats between the successor's logit and the rest, before the largest Gaussian
INNER_STD, OUTER_STD = 0.02, 1e-4  # block input projections; block output projections
TILE = 1 << 22  # random values drawn per block tensor, repeated to its size (the values are noise)
PLAIN = re.compile(r"^(\u0120)?[A-Za-z]{2,}$")  # GPT-2 byte-level BPE: \u0120 (Ġ) is a space
TINY = {"n_embd": 256, "n_ff": 512, "n_head": 4, "n_head_kv": 2, "n_layer": 2}
NORMAL = 1  # tokenizer.ggml.token_type of a normal token


def load_description(path: Path) -> dict:
    """The real pair's description written by benchmarks/gpu_tree.py."""
    return json.loads(lzma.decompress(path.read_bytes()))


def successor_maps(tokens: list[str], types: list[int], agree: float, rng: np.random.Generator
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(s_verifier, s_draft, plain): int64 [V] successor of every token for each model, and the
    plain tokens' ids. s_draft equals s_verifier on a random share ``agree`` of the tokens."""
    plain = np.array([i for i, (t, k) in enumerate(zip(tokens, types))
                      if k == NORMAL and PLAIN.match(t)], dtype=np.int64)
    n_vocab = len(tokens)
    succ = plain[rng.integers(0, len(plain), n_vocab)]
    cycle = rng.permutation(plain)
    succ[cycle] = np.roll(cycle, -1)  # plain tokens: one cycle through all of them
    draft = succ.copy()
    differ = rng.random(n_vocab) >= agree
    other = plain[rng.integers(0, len(plain), n_vocab)]
    other = np.where(other == succ, np.roll(other, 1), other)  # a different successor
    draft[differ] = other[differ]
    return succ, draft, plain


def output_head(embd: np.ndarray, succ: np.ndarray) -> np.ndarray:
    """float32 [V, n_embd]: row y = c · Σ_{x: succ[x] = y} e_x / |e_x| (module text)."""
    n_vocab, n_embd = embd.shape
    unit = embd / np.linalg.norm(embd, axis=1, keepdims=True)
    order = np.argsort(succ, kind="stable")
    targets, starts = np.unique(succ[order], return_index=True)
    head = np.zeros((n_vocab, n_embd), dtype=np.float32)
    head[targets] = np.add.reduceat(unit[order], starts, axis=0)
    return head * np.float32(LOGIT_MARGIN / np.sqrt(n_embd))


def _hparams(kv: dict) -> dict:
    arch = kv["general.architecture"]["value"]
    get = lambda key: kv[f"{arch}.{key}"]["value"]
    return {"arch": arch, "n_embd": get("embedding_length"), "n_ff": get("feed_forward_length"),
            "n_head": get("attention.head_count"), "n_head_kv": get("attention.head_count_kv"),
            "n_layer": get("block_count")}


def scaled(model: dict, size: str) -> tuple[dict, list[tuple[str, list[int]]]]:
    """(the architecture keys, [(tensor name, GGUF shape)]) of ``model`` at ``size``: ``real`` as
    described, ``tiny`` with TINY's widths and blocks (same vocabulary, same tensor kinds)."""
    kv = dict(model["kv"])
    hp = _hparams(kv)
    tensors = [(name, shape) for name, shape, _ in model["tensors"]]
    if size == "real":
        return kv, tensors
    arch = hp["arch"]
    head_dim, tiny_head_dim = hp["n_embd"] // hp["n_head"], TINY["n_embd"] // TINY["n_head"]
    dims = {hp["n_embd"]: TINY["n_embd"], hp["n_ff"]: TINY["n_ff"],
            head_dim * hp["n_head_kv"]: tiny_head_dim * TINY["n_head_kv"]}
    for key, value in (("embedding_length", "n_embd"), ("feed_forward_length", "n_ff"),
                       ("attention.head_count", "n_head"), ("attention.head_count_kv", "n_head_kv"),
                       ("block_count", "n_layer")):
        kv[f"{arch}.{key}"] = {**kv[f"{arch}.{key}"], "value": TINY[value]}
    keep = [(name, [dims.get(n, n) for n in shape]) for name, shape in tensors
            if not name.startswith("blk.") or int(name.split(".")[1]) < TINY["n_layer"]]
    return kv, keep


# keys the writer sets itself, or that describe the weights rather than the model
SKIP_KEYS = {"general.architecture", "general.file_type", "general.quantization_version",
             "general.name", "general.finetune", "general.basename", "general.size_label"}


def write_f16(path: Path, model: dict, tokenizer: dict, succ: np.ndarray, size: str,
              rng: np.random.Generator) -> None:
    """One model as an F16 GGUF (norms and biases F32), tensors in the real file's order."""
    import gguf

    kv, tensors = scaled(model, size)
    arch = kv["general.architecture"]["value"]
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(f"synthetic {model['file']} ({size} size)")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for name, field in {**kv, **tokenizer}.items():
        if name in SKIP_KEYS:
            continue
        vtype = gguf.GGUFValueType[field["type"]]
        sub = gguf.GGUFValueType[field["item"]] if field["item"] else None
        writer.add_key_value(name, field["value"], vtype, sub)
    n_vocab = len(tokenizer["tokenizer.ggml.tokens"]["value"])
    embd_shape = dict(tensors)["token_embd.weight"]
    embd = rng.standard_normal((n_vocab, embd_shape[0]), dtype=np.float32)
    noise = rng.standard_normal(TILE, dtype=np.float32)

    def values(name: str, shape: list[int]) -> np.ndarray:
        rows = shape[::-1]  # GGUF lists ne0 (the row length) first; numpy wants it last
        if name == "token_embd.weight":
            return embd.astype(np.float16)
        if name == "output.weight":
            return output_head(embd, succ).astype(np.float16)
        if name.endswith("norm.weight"):
            return np.ones(rows, dtype=np.float32)
        if name.endswith(".bias"):
            return np.zeros(rows, dtype=np.float32)
        std = OUTER_STD if name.endswith(("attn_output.weight", "ffn_down.weight")) else INNER_STD
        start = int(rng.integers(0, TILE))
        flat = np.resize(np.roll(noise, start), int(np.prod(rows)))
        return (flat * np.float32(std)).astype(np.float16).reshape(rows)

    def dtype(name: str) -> np.dtype:
        return np.dtype(np.float32 if name.endswith(("norm.weight", ".bias")) else np.float16)

    for name, shape in tensors:  # the header first, then each tensor made as it is written
        rows = shape[::-1]
        writer.add_tensor_info(name, rows, dtype(name), int(np.prod(rows)) * dtype(name).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, shape in tensors:
        writer.write_tensor_data(values(name, shape))
    writer.close()


def tensor_types(path: Path) -> dict[str, str]:
    import gguf

    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}


def write_pair_f16(description: dict, out_dir: Path, *, agree: float = 0.9, size: str = "real",
                   seed: int = 0, log=print) -> dict:
    """OUT_DIR/verifier-f16.gguf and draft-f16.gguf, and OUT_DIR/f16.json: what was made (the
    plain-token count, the share of tokens where the draft agrees, seconds per model). Needs no
    llama.cpp build: gpu_sitting.sh runs it while llama.cpp compiles."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tok = description["tokenizer"]
    tokens = tok["tokenizer.ggml.tokens"]["value"]
    types = tok["tokenizer.ggml.token_type"]["value"]
    succ_v, succ_d, plain = successor_maps(tokens, types, agree, rng)
    report = {"size": size, "agree": agree, "seed": seed, "n_plain_tokens": int(len(plain)),
              "draft_agrees_on": float(np.mean(succ_v == succ_d)), "models": {}}
    for role, succ in (("verifier", succ_v), ("draft", succ_d)):
        t0 = time.monotonic()
        write_f16(out_dir / f"{role}-f16.gguf", description[role], tok, succ, size, rng)
        report["models"][role] = {"f16_seconds": round(time.monotonic() - t0, 1)}
        log(f"{role}: F16 written in {time.monotonic() - t0:.0f} s")
    (out_dir / "f16.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def quantize_pair(description: dict, out_dir: Path, quantize: Path, *,
                  threads: int | None = None, log=print) -> dict:
    """Quantize the F16 pair of :func:`write_pair_f16` to OUT_DIR/verifier.gguf and draft.gguf
    (Q4_K_M, the F16 files removed); returns f16.json's report with, per model, the path, size,
    seconds and how many tensors got the real file's quantization type."""
    report = json.loads((out_dir / "f16.json").read_text())
    for role in ("verifier", "draft"):
        model = description[role]
        f16, q = out_dir / f"{role}-f16.gguf", out_dir / f"{role}.gguf"
        # every quantized tensor at the real file's type: Q4_K_M's recipe picks which blocks get
        # Q6_K by a rule that has changed between llama.cpp releases (the real files are older)
        types = out_dir / f"{role}-types.txt"
        types.write_text("".join(f"^{re.escape(name)}$={kind}\n" for name, _, kind in model["tensors"]
                                 if kind not in ("F32", "F16")))
        t0 = time.monotonic()
        cmd = [str(quantize), "--tensor-type-file", str(types), str(f16), str(q), "Q4_K_M"] \
            + ([str(threads)] if threads else [])
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"synthetic_pair: llama-quantize failed: {(r.stdout + r.stderr)[-2000:]}")
        seconds = time.monotonic() - t0
        f16.unlink()
        got = tensor_types(q)
        real = {name: kind for name, _, kind in model["tensors"]}
        same = sum(got.get(name) == kind for name, kind in real.items() if name in got)
        report["models"][role].update({
            "path": str(q), "bytes": q.stat().st_size, "quantize_seconds": round(seconds, 1),
            "tensors": len(got), "same_type_as_real": same, "real_file": model["file"]})
        log(f"{role}: {q.name} {q.stat().st_size / 2**20:.0f} MiB, Q4_K_M in {seconds:.0f} s; "
            f"{same} of {len(got)} tensors of the real file's type")
    return report


def make_pair(description: dict, out_dir: Path, quantize: Path, *, agree: float = 0.9,
              size: str = "real", seed: int = 0, threads: int | None = None,
              log=print) -> dict:
    """Write OUT_DIR/verifier.gguf and OUT_DIR/draft.gguf (Q4_K_M): :func:`write_pair_f16`, then
    :func:`quantize_pair`."""
    write_pair_f16(description, out_dir, agree=agree, size=size, seed=seed, log=log)
    return quantize_pair(description, out_dir, quantize, threads=threads, log=log)


def compare_costs(pairs: dict[str, tuple[str, str]], *, rounds: int = 3, repeats: int = 5,
                  threads: int | None = None) -> dict:
    """Forward costs of each pair (name -> (verifier, draft) GGUF paths), interleaved round by
    round on this machine: {name: [measure_forward_costs(...) per round]} (verifier 1, 2, 5, 17
    tokens after a 32-token context; draft 1 token). The check that a synthetic pair costs what
    the real one does."""
    from cactus_gguf import Engine, LoadOptions
    from cactus_gguf.speculative.costs import measure_forward_costs

    load = LoadOptions(n_ctx=512, **({"n_threads": threads} if threads else {}))
    engines = {name: Engine(v, d, load) for name, (v, d) in pairs.items()}
    text = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
    out: dict[str, list] = {name: [] for name in pairs}
    try:
        for rnd in range(rounds):
            for name, engine in engines.items():
                r = measure_forward_costs(engine, engine.tokenize(text)[:32], ks=[1, 4, 16],
                                          repeats=repeats)
                out[name].append(r)
                print(name, rnd, json.dumps({"verifier_ms": r["verifier"],
                                             "draft_ms": r["draft"]}), flush=True)
    finally:
        for engine in engines.values():
            engine.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("description", type=Path, help="qwen2.5-coder-pair.json.xz (gpu_tree.py)")
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--quantize", type=Path, help="llama-quantize binary (without it: the F16 "
                    "pair only, quantized later by a call with it)")
    ap.add_argument("--agree", type=float, default=0.9)
    ap.add_argument("--size", choices=("real", "tiny"), default="real")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--costs", action="store_true",
                    help="instead: time OUT_DIR's pair against the default pair (from the cache), "
                         "interleaved (compare_costs)")
    ap.add_argument("-t", "--threads", type=int)
    args = ap.parse_args()
    if args.costs:
        from cactus_gguf.registry import load_registry, resolve_model

        pair = load_registry().default_pair
        real = (str(resolve_model(pair.verifier)), str(resolve_model(pair.draft)))
        synthetic = (str(args.out_dir / "verifier.gguf"), str(args.out_dir / "draft.gguf"))
        compare_costs({"real": real, "synthetic": synthetic}, threads=args.threads)
        return
    desc = load_description(args.description)
    if args.quantize is None:
        report = write_pair_f16(desc, args.out_dir, agree=args.agree, size=args.size,
                                seed=args.seed)
    elif (args.out_dir / "f16.json").exists() and (args.out_dir / "verifier-f16.gguf").exists():
        report = quantize_pair(desc, args.out_dir, args.quantize)
    else:
        report = make_pair(desc, args.out_dir, args.quantize, agree=args.agree, size=args.size,
                           seed=args.seed)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
