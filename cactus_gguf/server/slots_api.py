"""llama-server's slot endpoints (``--parallel N``): ``GET /slots``, each slot's state, and
``POST /slots/{id_slot}?action=save|restore|erase``, its prompt cache saved to and restored from
``--slot-save-path``, or erased.

``GET /slots`` is llama-server's 501 without ``--slots``; ``?fail_on_no_slot=1`` is a 503 while
every slot is busy. The actions run on the engine's thread between two steps (a worker task);
their errors are llama-server's JSON, as on the other native routes (native_api.py's route class).
"""
from __future__ import annotations

import asyncio
import os
import time

from fastapi import APIRouter, Request as HttpRequest
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

from ..errors import InputError
from .core import submit
from .http_errors import llama_error, llama_error_of
from .native_api import LlamaRoute, ready_engine
from .worker import Job

__all__ = ["router", "SlotFile"]

router = APIRouter(route_class=LlamaRoute)


# Slots (--parallel N): each one's state; its prompt cache saved to and restored from
# --slot-save-path, or erased
# -------------------------------------------------------------------------------------------------

@router.get("/slots")
async def slots(request: HttpRequest, fail_on_no_slot: str | None = None):
    """llama-server's slot list: each slot's state (``is_processing`` while a request runs on
    it; ``n_prompt_tokens`` and ``prompt``: what its cache holds, which the next request's
    prefix reuse reads). ``?fail_on_no_slot=1``: 503 while every slot is busy."""
    worker, config = request.app.state.worker, request.app.state.config
    if not config.slots:
        return llama_error(501, "this server does not serve /slots: start it with --slots")
    engine = await ready_engine(request)
    busy = [s.busy for s in engine.slots]
    if fail_on_no_slot and (all(busy) or worker.waiting > 0):
        return llama_error(503, "no slot available")
    out = []
    for slot, processing in zip(engine.slots, busy):
        held = list(slot.verifier.tokens)  # (a copy: the worker may be changing it)
        out.append({"id": slot.id, "n_ctx": slot.verifier.n_ctx,
                    "speculative": config.defaults.speculates, "is_processing": processing,
                    "n_prompt_tokens": len(held),
                    "prompt": slot.verifier.model.detokenize(held, special=True)})
    return out


class SlotFile(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    filename: str | None = None


def _slot_file(folder: str, name: str | None) -> str:
    """The path of a slot file: a plain file name inside ``folder`` (llama-server's rule: no
    folder part, no "." or "..", no control character, at most 255 bytes)."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or len(name.encode()) > 255 \
            or any(ord(c) < 32 for c in name):
        raise InputError(f"filename must be a plain file name (no folder), got {name!r}"[:160],
                         param="filename")
    return os.path.join(folder, name)


@router.post("/slots/{id_slot}")
async def slot_action(id_slot: str, request: HttpRequest, action: str | None = None,
                      body: SlotFile | None = None):
    """llama-server's ``?action=save`` / ``restore`` (``{"filename"}`` in --slot-save-path) and
    ``erase`` of the slot's prompt cache, run on the engine's thread between two steps."""
    state = request.app.state
    folder = state.config.slot_save_path
    if not folder:
        return llama_error(501, "this server does not save slots: start it with "
                                "--slot-save-path DIR")
    n_slots = state.config.n_parallel
    if not id_slot.isdigit() or int(id_slot) >= n_slots:
        return llama_error(400, f"invalid slot id {id_slot!r}: this server has {n_slots} "
                                f"(0 .. {n_slots - 1}; --parallel sets how many)",
                           param="id_slot")
    slot = int(id_slot)
    if action not in ("save", "restore", "erase"):
        return llama_error(400, f"invalid action {action!r}: save, restore or erase",
                           param="action")
    await ready_engine(request)  # ready, else llama-server's refusal
    path = None if action == "erase" else _slot_file(folder, body.filename if body else None)
    if action == "restore" and not os.path.isfile(path):
        return llama_error(404, f"no saved slot {body.filename!r} in --slot-save-path",
                           param="filename")

    def task(engine):
        t0 = time.perf_counter()
        if action == "save":
            os.makedirs(folder, exist_ok=True)
            n_tokens, n_bytes = engine.save_cache(path, slot)
        elif action == "restore":
            n_tokens, n_bytes = engine.restore_cache(path, slot)
        else:
            n_tokens, n_bytes = engine.erase_cache(slot), 0
        return n_tokens, n_bytes, (time.perf_counter() - t0) * 1e3

    redact = state.redact
    job = Job(prompt=None, request=None, chat=False, loop=asyncio.get_running_loop(),
              deadline=time.perf_counter() + state.config.request_timeout, task=task)
    watch = await submit(state.worker, job, request, lambda e: llama_error_of(e, redact))
    if isinstance(watch, Response):
        return watch
    return await watch.answer(lambda _, done: _slot_answer(action, body, slot, *done),
                              lambda e: llama_error_of(e, redact))


def _slot_answer(action: str, body, slot: int, n_tokens: int, n_bytes: int, ms: float) -> dict:
    if action == "erase":
        return {"id_slot": slot, "n_erased": n_tokens}
    key, size, timing = (("n_saved", "n_written", "save_ms") if action == "save"
                         else ("n_restored", "n_read", "restore_ms"))
    return {"id_slot": slot, "filename": body.filename, key: n_tokens, size: n_bytes,
            "timings": {timing: ms}}
