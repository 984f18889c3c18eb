"""The ``cactus-gguf`` command: parses options (made from the options table), calls the API, prints.

Errors: every error is one line on stderr, ``cactus-gguf: error: ...``, with the option named by
its flag, and the exit code of its kind (errors.py): 1 bad input (also a malformed or unknown
option), 2 does not fit (context, memory), 3 engine failure, 130 interrupted (Ctrl-C), 143
terminated (SIGTERM: as Ctrl-C, the partial result kept).
"""
from __future__ import annotations

from .group import (_sigint, _sigterm, exit_interrupted, fail, install_sigint_bridge,  # noqa: F401
                    interrupt_pending, main, model_command, report_error)

__all__ = ["main", "fail", "report_error", "exit_interrupted", "interrupt_pending"]

from . import bench, models, run, serve  # noqa: E402,F401  (the subcommands register themselves)
