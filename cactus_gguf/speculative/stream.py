"""Stream: the text of one generation as it becomes final, handed out step by step
(``Engine.stream``), and its calls through ``Engine.step_streams`` (together.py).

The stream drives the engine's generator of chunks (engine.py ``_chunks``): each item is one engine
call under the engine's lock, the prompt first, then each step. Closing it (or dropping it) frees
the generation's slot (slots.py).
"""
from __future__ import annotations

from typing import Iterator

from ..stats import GenerationResult
from .session import Chunk, Session
from .together import DONE

__all__ = ["Stream"]


class Stream(Iterator[str]):
    """The text of one generation as it becomes final, step by step (whole UTF-8 characters, never
    part of a stop string); ``chunks()`` gives the same as :class:`Chunk` objects, which also say
    which text came from accepted drafts and which from the verifier. ``result`` holds the
    GenerationResult once the stream is exhausted. ``close()`` (or dropping it) abandons the
    generation; the engine stays ready."""

    def __init__(self, chunks: Iterator[Chunk], session: Session) -> None:
        self._chunks = chunks
        self._session = session
        self.result: GenerationResult | None = None

    def _next_step(self) -> Chunk | None:
        try:
            return next(self._chunks)
        except StopIteration as done:
            self.result = done.value
            raise StopIteration from None

    def _next_chunk(self) -> Chunk:
        while True:
            chunk = self._next_step()
            if chunk is not None:
                return chunk

    def __next__(self) -> str:
        return self._next_chunk().text

    def chunks(self) -> Iterator[Chunk]:
        """The remaining text as Chunks."""
        while True:
            try:
                yield self._next_chunk()
            except StopIteration:
                return

    def steps(self) -> Iterator[Chunk | None]:
        """One item per engine call (the prompt, then each step): its Chunk, or None when it
        released no text. For a caller that must be able to stop between any two steps."""
        while True:
            try:
                yield self._next_step()
            except StopIteration:
                return

    def close(self) -> None:
        self._chunks.close()
        self._session.slot.release(self._session)

    def _call(self, advance):
        """``advance(session)`` for :meth:`Engine.step_streams`: its Chunk or None, DONE when
        the generation had ended, or the exception it raised."""
        if self._session.finished:
            return self._ended()
        try:
            return advance(self._session)
        except Exception as e:  # noqa: BLE001 - handed to the stream's caller
            return e

    def _ended(self):
        """DONE, with ``result`` set (the stream's end, reached through step_streams)."""
        self.result = self._session.result
        self._session.slot.release(self._session)
        return DONE

    @property
    def slot(self) -> int:
        """The id of the slot the generation runs on (slots.py)."""
        return self._session.slot.id

    def stats_so_far(self):
        """The generation's statistics as they stand now (Session.stats_so_far)."""
        return self._session.stats_so_far()

    def partial(self, reason: str = "interrupted") -> GenerationResult:
        """The result so far of a generation that was cut short (an exception, a Ctrl-C, an
        abandoned stream): the text released until then, ``stop_reason`` = ``reason``. The
        result itself when it finished."""
        s = self._session
        if s.result is None:
            s.stop(reason, "")
            s.finish()
        return s.result
