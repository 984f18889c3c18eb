"""The one check of a request's speculation options that a Request cannot make alone, shared by the
CLI (app/plan.py, before anything loads), the server (server/schemas.py ``to_request``, before a request
is queued) and the engine (speculative/engine.py ``_begin``, for the Python API), so no combination is
accepted by one and refused by another.

A Request checks each value and the rules between its fields (records.py); what is left needs to
know what the caller *set* and what the engine *loaded*:

- ``given``: the options the caller set (the command line's flags, a request body's fields). An
  option only a draft model reads (``DRAFT_MODEL_OPTIONS``: ``draft_window``, ``draft_vocab``) set
  to another value than its default with a drafter that uses no draft model (``ngram``, ``mtp``) is
  refused: nothing would read it, and the answer (which reports each setting where it applies:
  rule.py) could not say it ran. Its default (``auto``, 0) says nothing and is allowed.
- ``drafters``: the drafters the loaded models run (:func:`runnable_drafters`; None: not known yet,
  as the CLI before loading). A speculating request naming another is refused, naming ``drafter``
  and listing what runs.
"""
from __future__ import annotations

from typing import Iterable

from ..errors import InputError
from .table import BY_NAME, DRAFT_MODEL_OPTIONS, DRAFTERS, MODEL_DRAFTERS, SELF_DRAFTERS

__all__ = ["check_speculation", "runnable_drafters"]


def runnable_drafters(*, draft_model: bool, mtp: bool) -> tuple[str, ...]:
    """The drafters an engine runs, in the table's order: ``ngram`` always, ``model`` and
    ``hybrid`` with a draft model, ``mtp`` with the verifier's next-n (MTP) head loaded."""
    return tuple(d for d in DRAFTERS if d == "ngram" or (d in MODEL_DRAFTERS and draft_model)
                 or (d == "mtp" and mtp))


def check_speculation(request, given: Iterable[str] = (), *,
                      drafters: Iterable[str] | None = None) -> None:
    """Refuse what ``request`` combines that nothing would run as asked (module docstring).
    Raises InputError naming the option at fault (``param``: ``draft_vocab``, ``draft_window`` or
    ``drafter``; the server names it as its client wrote it, ``speculative.draft_vocab``)."""
    given = set(given)
    if request.drafter in SELF_DRAFTERS:
        unused = next((n for n in DRAFT_MODEL_OPTIONS
                       if n in given and getattr(request, n) != BY_NAME[n].default), None)
        if unused is not None:  # nothing would read it: say so rather than ignore it
            raise InputError(f"{{{unused}}} applies to a draft model, and the {request.drafter} "
                             f"drafter uses none: drop {{{unused}}}, or use {{drafter}} model",
                             param=unused, options=("drafter",))
    if drafters is None or not request.speculates:
        return
    drafters = tuple(drafters)
    if request.drafter in drafters:
        return
    runs = (" or ".join(drafters) if len(drafters) < 3
            else ", ".join(drafters[:-1]) + " or " + drafters[-1])
    if request.drafter == "mtp":
        needs = ("the verifier's next-n (MTP) layers, loaded when the engine starts with "
                 "{drafter} mtp (the server: serve ... --drafter mtp)")
    else:
        needs = "a draft model, and none is loaded"
    raise InputError(f"{{drafter}} {request.drafter} needs {needs}: the models loaded here run "
                     f"{{drafter}} {runs}, or {{method}} none", param="drafter",
                     options=("method",))
