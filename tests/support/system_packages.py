"""Debian packages a test needs (a compiler, a browser): installed with apt-get when missing, as
CI runs as root on a fresh machine; elsewhere the test fails naming the install command."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def apt_install(purpose: str, packages: list[str]) -> None:
    """Install ``packages`` with apt-get (``apt-get update`` first only when the install fails).
    Fails the calling test with the command when this is not a root Debian machine."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.fail(f"{purpose} needs Debian's {' and '.join(packages)}: "
                    f"apt-get install {' '.join(packages)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-q", *packages]
    if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=True)
        subprocess.run(cmd, env=env, capture_output=True, check=True)
