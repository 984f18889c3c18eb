"""How exact is a rollback of a recurrent state? llama.cpp's own ``llama_memory_seq_rm`` against
cactus-gguf's ``Context.truncate`` (snapshot window, else a checkpoint, else decoding again), on
the tiny hybrid GGUFs of tests/support/tiny_gguf.py (lfm2, qwen35, nemotron_h).

Each case decodes a 22-token prompt, then the batches named, then drops the tokens named; the
error is max |logits of one more token - those of a fresh context that decoded the same tokens|
(the logits spread over about +-15). Writes results/recurrent-rollback/rollback.{json,md}.

    python benchmarks/recurrent_rollback.py
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import llama_cpp  # noqa: E402

from cactus_gguf.llama import Context, ContextOptions  # noqa: E402
from support.tiny_gguf import text_tokens, write_lfm2, write_nemotron_h, write_qwen35  # noqa: E402

PROMPT = text_tokens("the cat sat on the mat")
EXTRA = text_tokens(" and the dog sat")
CASES = [  # (name, n_rs_seq, batches after the prompt, drops)
    ("drop 1 of a 5-token batch", 4, [5], [1]),
    ("drop 4 of a 5-token batch", 4, [5], [4]),
    ("drop all 5 of the batch", 4, [5], [5]),
    ("drop all 5 of the batch", 8, [5], [5]),
    ("batches of 3 then 1, drop 3", 4, [3, 1], [3]),
    ("three 1-token decodes, drop 2", 4, [1, 1, 1], [2]),
    ("drop 1, then 1 more before a decode", 4, [5], [1, 1]),
    ("drop 8 (into the prompt)", 4, [5], [8]),
]


def opts(n_rs_seq: int = 4) -> ContextOptions:
    return ContextOptions(n_ctx=256, n_batch=32, n_threads=1, n_rs_seq=n_rs_seq)


def probe(ctx: Context, held: list[int], path: Path) -> float:
    row = np.array(ctx.decode([60], n_logits=1)[0])
    with Context.load(path, context_options=opts()) as fresh:
        fresh.decode(held, n_logits=0)
        ref = np.array(fresh.decode([60], n_logits=1)[0])
    return float(np.abs(row - ref).max())


def run_case(path: Path, n_rs_seq: int, batches: list[int], drops: list[int], raw: bool) -> dict:
    with Context.load(path, context_options=opts(n_rs_seq)) as c:
        c.decode(PROMPT, n_logits=0)
        extra = list(EXTRA)
        for n in batches:
            c.decode(extra[:n], n_logits=1)
            extra = extra[n:]
        ok = True
        for d in drops:
            if raw:  # llama.cpp alone, as a caller that trusts its answer would
                keep = c.n_past - d
                ok = ok and bool(llama_cpp.llama_memory_seq_rm(c.memory, 0, keep, -1))
                del c.tokens[keep:]
            else:
                c.truncate(c.n_past - d)
        held = list(c.tokens)
        return {"seq_rm": ok, "error": probe(c, held, path) if ok else None}


def main() -> None:
    out_dir = HERE / "results" / "recurrent-rollback"
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp())
    rows = []
    for arch, write in (("lfm2", write_lfm2), ("qwen35", write_qwen35),
                        ("nemotron_h", write_nemotron_h)):
        path = write(tmp / f"{arch}.gguf", seed=11)
        for name, n_rs_seq, batches, drops in CASES:
            rows.append({"arch": arch, "case": name, "R": n_rs_seq,
                         "llama.cpp": run_case(path, n_rs_seq, batches, drops, raw=True),
                         "cactus-gguf": run_case(path, n_rs_seq, batches, drops, raw=False)})
    (out_dir / "rollback.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["| case | R (n_rs_seq) | arch | llama_memory_seq_rm | its max abs logit error "
             "| Context.truncate max abs logit error |", "|---|---|---|---|---|---|"]
    for r in rows:
        raw, ours = r["llama.cpp"], r["cactus-gguf"]
        err = "–" if raw["error"] is None else f"{raw['error']:.2g}"
        lines.append(f"| {r['case']} | {r['R']} | {r['arch']} | {str(raw['seq_rm']).lower()} | {err} "
                     f"| {ours['error']:.2g} |")
    (out_dir / "rollback.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
