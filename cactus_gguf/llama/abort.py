"""Stopping a ``llama_decode`` inside: llama.cpp's abort callback.

A prompt chunk of ``n_batch`` tokens is one ``llama_decode``, seconds long on a CPU; a cancel
checked only between chunks waits for the chunk in progress. llama.cpp's CPU backend asks a
context's abort callback after each node of the graph it computes (ggml-cpu.c,
``ggml_graph_compute_thread``, on the thread that called ``llama_decode``); when the callback
answers true the computation stops there, ``llama_decode`` returns 2 and the batch's cells are
removed from the memory (llama-context.cpp, ``decode``), so the context's record of the tokens it
holds stays exact (Context.decode rolls back on a failed call). Backends other than the CPU's do
not ask it: there a cancel waits for the chunk, which a GPU computes quickly.

:func:`abortable` installs the callback on some contexts for the duration of a block (the engine:
around prompt processing only; each call runs Python, about a microsecond, and a prompt chunk's
graph nodes take far longer). Its check is the caller's cancel function.

Signals. The callback runs Python below llama.cpp's C frames, where an exception cannot
propagate (ctypes prints it and drops it). A Ctrl-C that arrives during ``llama_decode`` on the
main thread is handled the next time the callback runs, in its frame: a SIGINT handler that
knows (:func:`in_abort_check`, as the CLI's does) records the interrupt where the cancel
function reads it, and does not raise; the decode then stops within one graph node.
"""
from __future__ import annotations

import contextlib
import types
from typing import Callable, Iterable, Iterator

import llama_cpp

__all__ = ["abortable", "in_abort_check", "Abort"]


class Abort:
    """The callback of one :func:`abortable` block: ``should_stop()`` asked after each graph
    node; ``aborted`` records that it answered true (a decode that then fails with status 2 was
    stopped on purpose, not broken)."""

    def __init__(self, should_stop: Callable[[], bool]) -> None:
        self._should_stop = should_stop
        self.aborted = False
        self.c_callback = llama_cpp.ggml_abort_callback(self._check)  # kept alive with self

    def _check(self, _data) -> bool:
        if not self.aborted and self._should_stop():
            self.aborted = True
        return self.aborted


def in_abort_check(frame: types.FrameType | None) -> bool:
    """True when ``frame`` or a caller of it is an abort callback (llama.cpp's C frames are below:
    an exception raised there cannot propagate; see the module docstring)."""
    while frame is not None:
        if frame.f_code is Abort._check.__code__:
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def abortable(contexts: Iterable, should_stop: Callable[[], bool]) -> Iterator[Abort]:
    """Within the block, every ``llama_decode`` of ``contexts`` (llama/context.py Contexts; None
    entries are skipped) stops after the graph node at which ``should_stop()`` first returns true
    (``llama_decode`` returns 2: Context.decode raises DecodeError, the cache rolled back).
    Yields the :class:`Abort`, whose ``aborted`` tells whether that happened."""
    abort = Abort(should_stop)
    ptrs = [c.ptr for c in contexts if c is not None]
    for ptr in ptrs:
        llama_cpp.llama_set_abort_callback(ptr, abort.c_callback, None)
    try:
        yield abort
    finally:
        for ptr in ptrs:  # no callback: llama.cpp's default (never abort)
            llama_cpp.llama_set_abort_callback(ptr, llama_cpp.ggml_abort_callback(), None)
