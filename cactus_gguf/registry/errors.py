"""The registry's errors, placed in the package-wide hierarchy of :mod:`cactus_gguf.errors`.

    InputError (a ValueError)
    └── RegistryError     a bad ``models.yaml``, an unknown name, a path that is not a file, or
                          a model that is not cached while offline mode forbids fetching it.
    EngineError (a RuntimeError)
    └── DownloadError     no source could deliver the file (network, pip, hub, disk).
        └── ChecksumError the bytes arrived but their sha256 is not the pinned one.

Every message is a single line.
"""
from __future__ import annotations

from ..errors import EngineError, InputError

__all__ = ["RegistryError", "DownloadError", "ChecksumError"]


class RegistryError(InputError):
    """A bad ``models.yaml`` entry, a model / pair name the registry does not know, or a model
    that is not cached while offline mode is on."""


class DownloadError(EngineError):
    """No source of a model could deliver its file (network, pip, hub, disk)."""


class ChecksumError(DownloadError):
    """A source delivered a file whose sha256 is not the one pinned in ``models.yaml``."""
