"""The documentation cites only what exists.

- every repository path README.md and docs/*.md name (``cactus_gguf/...``, ``tests/...``,
  ``benchmarks/...``, ``native/...``, ``docs/...``), and the paths the package's own docstrings and
  comments name;
- every section they cite. One convention everywhere, in the docs and in the code: a file, then the
  section's heading in double quotes, ``docs/run.md "Draft length"`` (a comma between them is
  allowed; the quoted text may be the start of a longer heading, and may break across lines);
- every Markdown link to a file of the repository, and its ``#anchor`` when it has one (GitHub's
  anchors: the heading in lower case, punctuation dropped, spaces as hyphens);
- the generated blocks of docs/ (the layout table from the modules' docstrings) are what
  ``python docs/generate.py`` writes (the option tables: tests/test_options.py).
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
# a repository path: a known top folder, then path characters; a trailing "/" names a folder
PATH = re.compile(r"(?<![\w./-])((?:cactus_gguf|tests|benchmarks|native|docs)/[\w./*-]*\w/?)")
# a section citation: a Markdown file, an optional comma, then the heading in double quotes (in
# Python source the quotes may be escaped; a comment's "#" may continue it on the next line)
SECTION = re.compile(r"(?<![\w./-])(README(?:\.md)?|docs/[\w-]+\.md"
                     r"|benchmarks/results/[\w/-]*README\.md)"
                     r",?[ \t]*(?:\n[ \t]*#?[ \t]*)?\\?\"([^\"\\\s][^\"\\]{0,159}?)\\?\"")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def cited(text: str) -> set[str]:
    return {m.group(1) for m in PATH.finditer(text) if "*" not in m.group(1)}


def missing(paths: set[str]) -> list[str]:
    return sorted(p for p in paths if not (ROOT / p).exists())


def _plain(heading: str) -> str:
    return " ".join(heading.replace("`", "").split())


def headings(doc: Path) -> list[str]:
    """The headings of a Markdown file (outside code blocks), without their backticks."""
    out, fenced = [], False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            out.append(_plain(line.lstrip("#")))
    return out


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def sections(text: str) -> list[tuple[str, str]]:
    """The (file, section) pairs ``text`` cites; ``README`` is README.md."""
    out = []
    for m in SECTION.finditer(text):
        doc = "README.md" if m.group(1) == "README" else m.group(1)
        section = _plain(re.sub(r"\n[ \t]*#?", " ", m.group(2)))
        out.append((doc, section))
    return out


def unknown_sections(cites: list[tuple[str, str]]) -> list[str]:
    bad = []
    for doc, section in cites:
        path = ROOT / doc
        if not path.exists():
            bad.append(f'{doc} (no such file) "{section}"')
        elif not any(h.startswith(section) for h in headings(path)):
            bad.append(f'{doc} "{section}"')
    return sorted(set(bad))


def code_files() -> list[Path]:
    files = [*ROOT.glob("cactus_gguf/**/*.py"), *ROOT.glob("native/*.[ch]"),
             *ROOT.glob("tests/**/*.py"), *ROOT.glob("benchmarks/*.py"), *ROOT.glob("docs/*.py"),
             ROOT / "models.yaml", ROOT / "pyproject.toml", ROOT / ".ci" / "run"]
    # test_docs.py: its controls name paths and sections that are gone on purpose
    return [p for p in files if p.name != "test_docs.py" and p.exists()]


@pytest.mark.parametrize("doc", DOCS)
def test_the_docs_cite_only_files_that_exist(doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert len(cited(text)) > 0
    assert missing(cited(text)) == []


RESULTS = sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("benchmarks/results/**/README.md"))


@pytest.mark.parametrize("doc", [*DOCS, *RESULTS])
def test_the_docs_cite_only_sections_that_exist(doc):
    assert unknown_sections(sections((ROOT / doc).read_text(encoding="utf-8"))) == []


@pytest.mark.parametrize("doc", [*DOCS, *RESULTS])
def test_the_docs_links_and_their_anchors_exist(doc):
    path = ROOT / doc
    bad = []
    for m in LINK.finditer(path.read_text(encoding="utf-8")):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, frag = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(target)
        elif frag and dest.suffix == ".md" and frag not in {anchor(h) for h in headings(dest)}:
            bad.append(target)
    assert bad == []


def test_the_code_cites_only_files_that_exist():
    found: set[str] = set()
    for path in code_files():
        found |= cited(path.read_text(encoding="utf-8"))
    # results a benchmark writes (not in the tree until it runs)
    allowed = {p for p in found if p.startswith("benchmarks/results/")}
    assert missing(found - allowed) == []


def test_the_code_cites_only_sections_that_exist():
    cites = [c for path in code_files() for c in sections(path.read_text(encoding="utf-8"))]
    assert len(cites) > 10
    assert unknown_sections(cites) == []


def test_the_readme_is_a_front_door():
    """Under 12 KB, with the install-and-run and the test commands in its first screen."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.encode("utf-8")) < 12 * 1024
    first_screen = "\n".join(text.splitlines()[:40])
    assert 'pip install . && cactus-gguf run -p "def add(a, b):" -n 32' in first_screen
    assert "pip install -e '.[test]' && ruff check . && python -m pytest" in first_screen


def test_the_generated_layout_is_current():
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    text = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    assert generate.block(text, "layout") == generate.layout_table(), (
        "docs/layout.md is stale (a module added, moved or re-described): "
        "regenerate it with python docs/generate.py")


def test_a_stale_citation_is_caught():
    gone = "tests/rpc_" + "support.py", "cactus_gguf/options" + ".py"  # (not a citation here)
    assert missing(cited(f"see {gone[0]} and {gone[1]}, not tests/support/rpc.py")) == sorted(gone)
    text = ('README "Run the tests"; docs/run.md "Draft length"; docs/maths.md, "The emitted\n'
            '# law"; README \\"Foreign drafts\\"; docs/run.md "Gone"; docs/none.md "X"')
    assert sections(text)[2] == ("docs/maths.md", "The emitted law")
    assert unknown_sections(sections(text)) == [
        'README.md "Foreign drafts"', 'docs/none.md (no such file) "X"', 'docs/run.md "Gone"']
    assert anchor("Quality: pass@1 under each rule (`quality/`, all 164 HumanEval problems)") == \
        "quality-pass1-under-each-rule-quality-all-164-humaneval-problems"
