"""Hugging Face sources, through huggingface_hub.

Files stay in huggingface_hub's own cache (``hub_cache_dir()``); our sha256 markers for them
live in ``<cache>/hub/<owner>--<repo>/<revision>/<file>.sha256``. Hub downloads are atomic in
huggingface_hub itself (``.incomplete`` then rename); a hub file that fails its sha256 is
deleted from the hub cache. A split GGUF is every shard, first shard first.
"""
from __future__ import annotations

import contextlib
import inspect
import os
from pathlib import Path
from typing import Any, Iterator

from .cache import (check_disk_space, hub_cache_dir, hub_marker, marker_sha, offline_variables,
                    sha256_file, verify_cached, write_marker)
from .errors import ChecksumError, DownloadError
from .schema import ModelEntry, PullResult, Source


def cached_path(src: Source, filename: str) -> Path | None:
    """Path of ``filename`` in the hub cache at ``src.revision``, looked up on disk only."""
    from huggingface_hub import try_to_load_from_cache

    assert src.repo is not None
    try:
        found = try_to_load_from_cache(src.repo, filename, cache_dir=str(hub_cache_dir()),
                                       revision=src.revision)
    except Exception:  # a malformed cache entry is simply not a hit
        return None
    return Path(found) if isinstance(found, str) and os.path.isfile(found) else None


def remove_file(pointer: Path) -> None:
    """Delete a hub snapshot entry and the blob it points to."""
    blob = Path(os.path.realpath(pointer))
    pointer.unlink(missing_ok=True)
    if blob != pointer:
        blob.unlink(missing_ok=True)


def cached(model: ModelEntry, src: Source, *, progress: bool) -> PullResult | None:
    """The verified cached copy of every file of ``src`` (no network), else None.

    A file that fails its pinned sha256 is deleted from the hub cache (it will be fetched again).
    """
    paths = [cached_path(src, f) for f in src.hub_filenames]
    if any(p is None for p in paths):
        return None
    shas = []
    for p, f, expected in zip(paths, src.hub_filenames, src.expected_sha256):
        assert p is not None
        sha = verify_cached(p, hub_marker(src, f), expected, progress=progress,
                            remove=lambda p=p: remove_file(p))
        if sha is None:
            return None
        shas.append(sha)
    return PullResult(model.name, paths[0], shas[0], src, src.expected_sha256[0] is not None,
                      cached=True)


def cached_marker_sha(model: ModelEntry, src: Source) -> str | None:
    """sha256 from the current marker of the source's first file in the hub cache, else None."""
    first = src.hub_filenames[0]
    p = cached_path(src, first)
    return marker_sha(p, hub_marker(src, first)) if p is not None else None


def _silent_tqdm() -> type:
    """A tqdm class with its bar disabled (huggingface_hub accepts one for its progress bar)."""
    from tqdm import tqdm

    class _Silent(tqdm):
        def __init__(self, *args: Any, **kw: Any) -> None:
            kw["disable"] = True
            super().__init__(*args, **kw)

    return _Silent


def fetch(model: ModelEntry, src: Source, *, progress: bool) -> PullResult:
    """hf_hub_download each file (its cache, its progress bar), then hash and check.

    Raises DownloadError (network, HTTP, auth, filesystem: one line, the cause chained) or
    ChecksumError (the file is then deleted from the hub cache).
    """
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    what = f"{model.name} from {src.describe()}"
    offline = bool(offline_variables())  # the caller checks first; never reach the network
    # huggingface_hub reads HF_ENDPOINT / HF_HOME at import; pass the current values.
    endpoint = (os.environ.get("HF_ENDPOINT") or "").rstrip("/") or None
    kwargs: dict[str, Any] = {}
    if not progress and "tqdm_class" in inspect.signature(hf_hub_download).parameters:
        kwargs["tqdm_class"] = _silent_tqdm()
    hub_cache = hub_cache_dir()
    hub_cache.mkdir(parents=True, exist_ok=True)
    check_disk_space(hub_cache, src.size, what)

    paths: list[Path] = []
    shas: list[str] = []
    for filename, expected in zip(src.hub_filenames, src.expected_sha256):
        try:
            p = Path(hf_hub_download(src.repo, filename, revision=src.revision,
                                     cache_dir=str(hub_cache), endpoint=endpoint,
                                     local_files_only=offline, **kwargs))
        except LocalEntryNotFoundError as e:
            if offline:
                raise DownloadError(f"{what}: not in the Hugging Face cache and offline mode "
                                    "is on") from e
            raise DownloadError(f"{what}: {_first_line(e)}") from e
        except Exception as e:  # network, HTTP, auth, filesystem: one line, cause chained
            raise DownloadError(f"{what}: {type(e).__name__}: {_first_line(e)}") from e
        sha = sha256_file(p, progress=progress, desc=f"verifying {filename}")
        if expected is not None and sha != expected:
            remove_file(p)
            raise ChecksumError(f"{what}: sha256 mismatch for {filename}: expected {expected}, "
                                f"got {sha}; the file was deleted")
        write_marker(hub_marker(src, filename), p, sha)
        paths.append(p)
        shas.append(sha)
    return PullResult(model.name, paths[0], shas[0], src, src.expected_sha256[0] is not None,
                      cached=False)


@contextlib.contextmanager
def open_remote(src: Source, filename: str, what: str) -> Iterator[Any]:
    """``filename`` of ``src`` on the Hub, read from its start over one HTTP range request
    without downloading the rest: what registry/metadata.py reads a file's first bytes with.
    huggingface_hub resolves the file (its endpoint, token and redirects, as for a download);
    the bytes come from where it points, with the token only on the Hub's own host. The object
    yielded has ``read(n)``. Raises DownloadError (one line, the cause chained)."""
    import urllib.parse
    import urllib.request

    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    endpoint = (os.environ.get("HF_ENDPOINT") or "").rstrip("/") or None
    url = hf_hub_url(src.repo, filename, revision=src.revision, endpoint=endpoint)
    try:
        location = get_hf_file_metadata(url, endpoint=endpoint).location or url
        headers = {"Range": "bytes=0-"}
        if urllib.parse.urlsplit(location).netloc == urllib.parse.urlsplit(url).netloc:
            headers.update(build_hf_headers())  # the Hub itself: the token; a CDN: signed URL
        response = urllib.request.urlopen(urllib.request.Request(location, headers=headers),
                                          timeout=30)
    except Exception as e:  # network, HTTP, auth: one line, cause chained
        raise DownloadError(f"{what}: {type(e).__name__}: {_first_line(e)}") from e
    try:
        yield _Reading(response, what)
    finally:
        response.close()  # the rest of the file is never read


class _Reading:
    """A response's ``read(n)`` (up to n bytes; fewer only at the file's end), its failures as
    DownloadError."""

    def __init__(self, f: Any, what: str) -> None:
        self._f, self._what = f, what

    def read(self, n: int) -> bytes:
        data = b""
        try:
            while len(data) < n:
                block = self._f.read(n - len(data))
                if not block:
                    break
                data += block
        except Exception as e:  # network, HTTP: one line, cause chained
            raise DownloadError(f"{self._what}: {type(e).__name__}: {_first_line(e)}") from e
        return data


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
