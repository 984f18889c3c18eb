"""Slots (llama-server's ``--parallel N``): the engine's N sequences, each a verifier sequence, a
draft sequence and an MTP head sequence of the same index (llama/context.py "Sequences"), so N
generations keep N prompt caches and run side by side without restoring each other's caches.

A generation is given a slot when it begins (:meth:`Slots.choose`): the one a request names
(``id_slot``), else a free slot, the one whose verifier cache shares the longest prefix with the
prompt (llama-server's choice), the least recently used among equals. When every slot is held by
an unfinished generation (more interleaved streams than slots, through the Python API) the least
recently used one is shared: its generations restore their caches before each step, as one slot
always did (prefill.py ``resync``).
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Sequence

from ..errors import InputError
from ..llama import Context

__all__ = ["Slot", "Slots"]


@dataclass(eq=False)
class Slot:
    """Slot ``id``: its verifier sequence, the draft's (None without a draft model) and the MTP
    head following the verifier's (None without ``--drafter mtp`` loaded). ``owner``: the
    generation whose committed tokens the caches hold (None: unknown, restore before use).
    The generation running on it (:meth:`take`) holds it until it finishes, is released, or is
    dropped (a stream never read: held by a weak reference)."""

    id: int
    verifier: Context
    draft: Context | None
    mtp: object | None = None
    owner: object | None = None
    last_used: float = field(default_factory=time.monotonic)
    _active: weakref.ref | None = None

    def take(self, generation) -> None:
        """``generation`` (anything with a ``finished`` flag) runs on the slot from now on."""
        self._active = weakref.ref(generation)

    def release(self, generation) -> None:
        """``generation`` no longer runs on the slot (abandoned); no-op when another took it."""
        if self._active is not None and self._active() is generation:
            self._active = None

    @property
    def busy(self) -> bool:
        """An unfinished generation runs on it."""
        active = self._active() if self._active is not None else None
        return active is not None and not active.finished

    def contexts(self) -> tuple[Context, ...]:
        """Its sequences: the verifier's, then the draft's and the MTP head's when it has them."""
        head = getattr(self.mtp, "head", None)
        return tuple(c for c in (self.verifier, self.draft, head) if c is not None)


class Slots(Sequence[Slot]):
    """The engine's slots, slot 0 first (the contexts as loaded; the others their sequences)."""

    def __init__(self, slots: list[Slot]) -> None:
        self._slots = slots

    def __getitem__(self, i):  # type: ignore[override]
        return self._slots[i]

    def __len__(self) -> int:
        return len(self._slots)

    def get(self, id_slot: int) -> Slot:
        """Slot ``id_slot``; InputError (param ``id_slot``) naming the range when there is none."""
        if not isinstance(id_slot, int) or not 0 <= id_slot < len(self._slots):
            n = len(self._slots)
            raise InputError(f"id_slot {id_slot} is not a slot: this server has {n} "
                             f"(0 .. {n - 1}; --parallel sets how many)", param="id_slot")
        return self._slots[id_slot]

    def choose(self, tokens: Sequence[int], id_slot: int = -1) -> Slot:
        """The slot a generation of prompt ``tokens`` runs on (module docstring); ``id_slot`` >= 0
        names it (InputError when out of range)."""
        if id_slot is not None and id_slot >= 0:
            slot = self.get(id_slot)
        elif free := [s for s in self._slots if not s.busy]:
            slot = max(free, key=lambda s: (s.verifier.shared_prefix(tokens), -s.last_used))
        else:
            slot = min(self._slots, key=lambda s: s.last_used)
        slot.last_used = time.monotonic()
        return slot
