"""llama.cpp's log: kept off the terminal, its last error lines kept for one-line messages.

llama.cpp reports why a load failed only in its log. Every line goes to the Python logger
``cactus_gguf.llama_cpp`` (silent unless the application configures logging: ``-v`` does);
ERROR lines are also kept in a short ring so that :func:`last_error` can name the reason.
"""
from __future__ import annotations

import collections
import contextlib
import ctypes
import logging
import threading
import types

import llama_cpp

__all__ = ["init_backend", "last_error", "clear_errors", "in_log_callback", "critical",
           "in_critical_section", "capture"]

# ggml.h enum ggml_log_level: NONE=0, DEBUG=1, INFO=2, WARN=3, ERROR=4, CONT=5 (continues a line).
_LOG_LEVELS = {0: logging.INFO, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING,
               4: logging.ERROR}
_recent_errors: collections.deque[str] = collections.deque(maxlen=8)
_llama_log = logging.getLogger("cactus_gguf.llama_cpp")
_llama_log.addHandler(logging.NullHandler())
_captures: list[list[str]] = []  # capture(): the lists every message is also appended to


def _log_message(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    message = text.decode("utf-8", errors="replace").rstrip()
    if not message:
        return
    py_level = _LOG_LEVELS.get(level, logging.DEBUG)
    if py_level >= logging.ERROR:
        _recent_errors.append(message)
    for lines in _captures:
        lines.append(message)
    _llama_log.log(py_level, "%s", message)


_log_callback = llama_cpp.llama_log_callback(_log_message)
_backend_ready = False


def init_backend() -> None:
    """Route llama.cpp's log here and initialise its backend (once per process)."""
    global _backend_ready
    if not _backend_ready:
        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _backend_ready = True


def in_log_callback(frame: types.FrameType | None) -> bool:
    """True when ``frame`` or a caller of it is the log callback (llama.cpp's C frames are below:
    an exception raised there cannot propagate; see cli's SIGINT bridge)."""
    while frame is not None:
        if frame.f_code is _log_message.__code__:
            return True
        frame = frame.f_back
    return False


_critical = threading.local()


@contextlib.contextmanager
def critical():
    """Mark code that must not be cut by a KeyboardInterrupt: building llama-cpp-python's owning
    wrappers, which an exception between their C call and their own bookkeeping leaves half-built
    (their ``__del__`` then fails: "'LlamaContext' object has no attribute '_exit_stack'"). The
    library installs no signal handler; the CLI's SIGINT handler defers an interrupt that lands
    inside (see :func:`in_critical_section`) until the section ends."""
    _critical.depth = getattr(_critical, "depth", 0) + 1
    try:
        yield
    finally:
        _critical.depth -= 1


def in_critical_section() -> bool:
    """True inside :func:`critical` in this thread."""
    return getattr(_critical, "depth", 0) > 0


@contextlib.contextmanager
def capture():
    """Within the block, every llama.cpp log message (from any thread: an RPC model loads on
    another) is also appended to the list this yields, e.g. a model load's layer placement."""
    lines: list[str] = []
    _captures.append(lines)
    try:
        yield lines
    finally:  # by identity: an enclosing capture may hold equal lines (remove() compares them)
        del _captures[next(i for i, c in enumerate(_captures) if c is lines)]


def clear_errors() -> None:
    _recent_errors.clear()


def last_error() -> str:
    """The most specific error llama.cpp logged since :func:`clear_errors` (one line)."""
    for message in _recent_errors:
        if "error loading model:" in message:
            reason = message.split("error loading model:", 1)[1].strip().splitlines()[0]
            # the loader's generic line; gguf's own line says what was wrong (header, key-value
            # pairs, tensor infos: a truncated or corrupt file)
            gguf_reason = next((m for m in _recent_errors if m.startswith("gguf_")), None)
            if "failed to load model from" in reason and gguf_reason:
                reason = (f"{gguf_reason.split(': ', 1)[-1].splitlines()[0]} "
                          "(truncated or corrupt GGUF file)")
            return reason
    if _recent_errors:
        return _recent_errors[0].splitlines()[0]
    return "llama.cpp gave no reason (its log is shown in verbose mode)"
