"""Regenerate the generated parts of docs/: ``python docs/generate.py`` (no argument: rewrite them
in place; ``--check``: exit 1 and name each stale block, changing nothing).

The blocks, each between ``<!-- NAME ... -->`` and ``<!-- /NAME -->`` markers:

- docs/options.md: ``options:run``, ``options:bench``, ``options:serve``, the flag tables that
  ``python -m cactus_gguf.options COMMAND`` prints from the one options table;
- docs/statistics.md: ``statistics``, the table of result fields (cactus_gguf/stats/table.py);
- docs/layout.md: ``layout``, one row per source file git tracks, the first sentence of its module
  docstring (Python) or of its opening comment (C: the text after ``name.c -``).

tests/test_options.py, tests/test_stats_table.py and tests/test_docs.py check that each block is
what this script writes.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPTIONS_DOC = ROOT / "docs" / "options.md"
LAYOUT_DOC = ROOT / "docs" / "layout.md"
STATISTICS_DOC = ROOT / "docs" / "statistics.md"
COMMANDS = ("run", "bench", "serve")

# the folders the layout lists, in this order, with a line saying what each is
LAYOUT_GROUPS = (
    ("cactus_gguf", "the package"),
    ("native", "the native helper: a plain C library behind one header, built by setup.py"),
    ("benchmarks", "benchmark scripts (their results: benchmarks/results/README.md)"),
    ("tests/support", "the tests' shared helpers (the tests themselves: one file per component)"),
    ("tests/golden", "token ids recorded before refactors: same seed, same tokens"),
)


def block(text: str, name: str) -> str | None:
    """The body of ``name``'s generated block in ``text`` (None: no such block)."""
    m = re.search(rf"<!-- {re.escape(name)}[ >][^\n]*-->\n(.*?)<!-- /{re.escape(name)} -->", text,
                  re.S)
    return m.group(1) if m else None


def replace_block(text: str, name: str, body: str) -> str:
    pattern = rf"(<!-- {re.escape(name)}[ >][^\n]*-->\n)(.*?)(<!-- /{re.escape(name)} -->)"
    if not re.search(pattern, text, re.S):
        raise SystemExit(f"no generated block {name!r}")
    return re.sub(pattern, lambda m: m.group(1) + body + m.group(3), text, count=1, flags=re.S)


def first_sentence(text: str) -> str:
    """The first sentence of a docstring's first paragraph, on one line."""
    para = " ".join(text.strip().split("\n\n")[0].split())
    m = re.search(r"[.!?](?=\s+[A-Z(`*])", para)
    sentence = para[:m.end()] if m else para
    return sentence.rstrip(":").replace("|", "\\|")


def python_summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    return first_sentence(doc) if doc else "(no docstring)"


def c_summary(path: Path) -> str:
    m = re.match(r"\s*/\*(.*?)\*/", path.read_text(encoding="utf-8"), re.S)
    if not m:
        return "(no opening comment)"
    lines = [re.sub(r"^\s*\*\s?", "", line) for line in m.group(1).splitlines()]
    text = "\n".join(lines).strip()
    text = re.sub(rf"^{re.escape(path.name)}\s*[-:]\s*", "", text)
    return first_sentence(text)


def _files(folder: str) -> list[Path]:
    """The source files of ``folder`` that git tracks (all of them outside a git checkout):
    Python files, recursively (benchmarks/: its own only), or C sources and headers (native/)."""
    base = ROOT / folder
    if folder == "native":
        found = [*base.glob("*.c"), *base.glob("*.h")]
    else:
        found = [p for p in (base.glob("*.py") if folder == "benchmarks" else base.rglob("*.py"))
                 if "__pycache__" not in p.parts]
    try:
        listed = subprocess.run(["git", "ls-files", "--", folder], cwd=ROOT, capture_output=True,
                                text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return sorted(found)
    tracked = {ROOT / p for p in listed}
    return sorted(p for p in found if p in tracked) if tracked else sorted(found)


def layout_table() -> str:
    rows = ["| path | what it is (from its docstring) |", "|---|---|"]
    for folder, what in LAYOUT_GROUPS:
        rows.append(f"| **`{folder}/`** | {what} |")
        for f in _files(folder):
            summary = c_summary(f) if f.suffix in (".c", ".h") else python_summary(f)
            rows.append(f"| `{f.relative_to(ROOT).as_posix()}` | {summary} |")
    return "\n".join(rows) + "\n"


def generated() -> dict[tuple[Path, str], str]:
    """Every generated block: (file, block name) -> its body."""
    sys.path.insert(0, str(ROOT))
    from cactus_gguf.options import markdown_table
    from cactus_gguf.stats.table import markdown_table as statistics_table

    out = {(OPTIONS_DOC, f"options:{c}"): markdown_table(c) for c in COMMANDS}
    out[(STATISTICS_DOC, "statistics")] = statistics_table()
    out[(LAYOUT_DOC, "layout")] = layout_table()
    return out


def stale() -> list[str]:
    """The generated blocks whose text is not what this script writes."""
    return [f"{path.relative_to(ROOT).as_posix()} {name}"
            for (path, name), body in generated().items()
            if block(path.read_text(encoding="utf-8"), name) != body]


def main(argv: list[str]) -> int:
    if argv[1:] == ["--check"]:
        bad = stale()
        for b in bad:
            print(f"stale: {b}")
        return 1 if bad else 0
    for (path, name), body in generated().items():
        path.write_text(replace_block(path.read_text(encoding="utf-8"), name, body),
                        encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
