"""The documentation cites only files that exist: every repository path README.md and docs/*.md
name (``cactus_gguf/...``, ``tests/...``, ``benchmarks/...``, ``native/...``, ``docs/...``), and
the paths the package's own docstrings and comments name."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# a repository path: a known top folder, then path characters; a trailing "/" names a folder
PATH = re.compile(r"(?<![\w./-])((?:cactus_gguf|tests|benchmarks|native|docs)/[\w./*-]*\w/?)")


def cited(text: str) -> set[str]:
    return {m.group(1) for m in PATH.finditer(text) if "*" not in m.group(1)}


def missing(paths: set[str]) -> list[str]:
    return sorted(p for p in paths if not (ROOT / p).exists())


@pytest.mark.parametrize("doc", ["README.md", *(f"docs/{p.name}" for p in
                                                 (ROOT / "docs").glob("*.md"))])
def test_the_docs_cite_only_files_that_exist(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert len(cited(text)) > (20 if doc == "README.md" else 0)
    assert missing(cited(text)) == []


def test_the_code_cites_only_files_that_exist():
    found: set[str] = set()
    for path in [*ROOT.glob("cactus_gguf/**/*.py"), *ROOT.glob("native/*.[ch]"),
                 *ROOT.glob("tests/**/*.py"), *ROOT.glob("benchmarks/*.py")]:
        if path.name != "test_docs.py":  # its control names paths that are gone on purpose
            found |= cited(path.read_text(encoding="utf-8"))
    # results a benchmark writes (not in the tree until it runs)
    allowed = {p for p in found if p.startswith("benchmarks/results/")}
    assert missing(found - allowed) == []


def test_a_stale_citation_is_caught():
    gone = "tests/rpc_" + "support.py", "cactus_gguf/options" + ".py"  # (not a citation here)
    assert missing(cited(f"see {gone[0]} and {gone[1]}, not tests/support/rpc.py")) == sorted(gone)
