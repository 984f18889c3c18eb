"""Writes fim.jsonl: fill-in-the-middle cases cut from this repository's own Python code (code no
model was trained on), as an editor sends them to /infill: the file before the cursor, after it,
and the middle the author wrote.

    python benchmarks/prompts/make_fim.py [--commit 2644713]

Each case takes one code line at a fixed place of a file (a quarter, half and three quarters of
the way down, the first line there that is indented code, not a comment, a decorator or inside a
docstring): the cursor sits after its indentation; the middle is that line alone (a line
completion) or the line and up to two more of its block (a block completion: no blank line, no
dedent), alternately; the prefix keeps the 40 lines before, the suffix the 12 after. Read from
the given commit, so the set does not drift with the code.
"""
from __future__ import annotations

import argparse
import io
import json
import subprocess
import tokenize
from pathlib import Path

FILES = ["cactus_gguf/prompting/text.py", "cactus_gguf/stats/generation.py", "cactus_gguf/registry/cache.py",
         "cactus_gguf/speculative/policy.py", "cactus_gguf/options/values.py",
         "cactus_gguf/llama/context.py"]
PLACES = (0.25, 0.5, 0.75)
N_PREFIX, N_SUFFIX = 40, 12


def in_strings(text: str) -> set[int]:
    """0-based numbers of the lines a multi-line string (a docstring) covers."""
    out: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
            out.update(range(tok.start[0] - 1, tok.end[0]))
    return out


def code_line(line: str) -> bool:
    s = line.strip()
    return line.startswith("    ") and len(s) > 8 and not s.startswith(("#", ")", "]", "@"))


def block(lines: list[str], i: int, n: int) -> int:
    """How many lines from ``i`` (at most ``n``) stay in its block: no blank line, no dedent."""
    indent = len(lines[i]) - len(lines[i].lstrip())
    k = 1
    while k < n and lines[i + k].strip() and \
            len(lines[i + k]) - len(lines[i + k].lstrip()) >= indent:
        k += 1
    return k


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commit", default="2644713")
    args = ap.parse_args()
    cases = []
    for path in FILES:
        text = subprocess.run(["git", "show", f"{args.commit}:{path}"], capture_output=True,
                              text=True, check=True).stdout
        lines, strings = text.split("\n"), in_strings(text)
        for place in PLACES:
            i = int(len(lines) * place)
            while not code_line(lines[i]) or i in strings:
                i += 1
            n_mid = block(lines, i, 1 if len(cases) % 2 == 0 else 3)
            indent = len(lines[i]) - len(lines[i].lstrip())
            prefix = "\n".join(lines[max(0, i - N_PREFIX):i] + [lines[i][:indent]])
            middle = "\n".join([lines[i][indent:]] + lines[i + 1:i + n_mid])
            suffix = "\n" + "\n".join(lines[i + n_mid:i + n_mid + N_SUFFIX])
            cases.append({"id": f"{path}:{i + 1}", "filename": path, "input_prefix": prefix,
                          "input_suffix": suffix, "middle": middle})
    out = Path(__file__).with_name("fim.jsonl")
    out.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
    print(f"wrote {len(cases)} cases to {out}")


if __name__ == "__main__":
    main()
