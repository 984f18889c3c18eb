"""Command-line interface: parses options, calls the Python API, prints. No logic of its own."""
from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cactus-gguf")
def main() -> None:
    """Cactus constrained-acceptance speculative decoding for GGUF models."""


# `run` is added below by the decoding work; `models` / `pull` by the registry work.
