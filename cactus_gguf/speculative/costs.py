"""What a forward pass costs on this machine: the probe, and its cache for ``-k auto``.

``measure_forward_costs`` times single ``llama_decode`` calls (the benchmark reports them too);
``forward_costs`` gives the auto policy a ForwardCosts for an engine (without a draft model:
the verifier's only, for prompt lookup): from the cache file
``<cache_dir>/forward-costs.json`` when this machine has probed these models with this build,
thread count and context size before, else from a short probe that is then cached (each model
prefills a 16-token context once, then every batch size is decoded once on top of it: online
correction refines it). Several processes may probe at once (six ``run``s with different
``-t``): each adds its entry under a lock on ``forward-costs.json.lock`` (re-reading the table
there), writes a temporary file of its own and renames it over the table, so no entry is lost and
no reader sees half a file.

``SlowStepWatch`` compares each step with those costs and logs one warning when steps run far
slower than probed (another busy process on the cores: llama.cpp's threads spin-wait).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import filelock
import numpy as np

from ..llama.hw import system_info
from ..llama.placement import devices_key
from .policy import ForwardCosts

__all__ = ["measure_forward_costs", "forward_costs", "probe_sizes", "store_costs",
           "SlowStepWatch", "COSTS_FILE"]

log = logging.getLogger(__name__)

COSTS_FILE = "forward-costs.json"


def measure_forward_costs(engine, context_tokens: Sequence[int],
                          ks: Sequence[int], repeats: int = 10, warm: bool = True) -> dict:
    """Median milliseconds of one ``llama_decode`` after ``context_tokens``: the verifier with 1 and
    with k+1 tokens (all rows' logits, as in verification), the draft with 1 token.

    The speculative step costs about ``drafted x draft(1) + verifier(k+1)`` and yields AL + 1
    tokens; the verifier alone yields 1 token per ``verifier(1)``. Both KV caches are cleared after.
    ``warm``: decode each batch shape once more first, untimed (llama.cpp sizes its buffers on the
    first decode of a shape; the prefill has already done so for the largest).
    Returns {"verifier": {"1": ms, "k+1": ms, ...}, "draft": {"1": ms} (empty without a draft
    model), "draft_over_verifier": draft(1) / verifier(1) or None, "repeats", "n_context"}.
    """
    ctx_tokens = list(context_tokens)

    def probe(model, sizes: list[int]) -> dict[str, float]:
        """Prefill the context once, then time each batch size on top of it."""
        model.clear()
        model.decode(ctx_tokens, n_logits=1)
        base = model.n_past
        out = {}
        for n in sizes:
            batch = (ctx_tokens * (n // len(ctx_tokens) + 1))[-n:]
            times = []
            for _ in range(repeats + warm):  # a warm-up call is discarded
                t0 = time.perf_counter()
                model.decode(batch, n_logits=n, may_drop=n)
                times.append((time.perf_counter() - t0) * 1e3)
                model.truncate(base)
            out[str(n)] = float(statistics.median(times[1:] if warm else times))
        model.clear()
        return out

    sizes = sorted({1} | {k + 1 for k in ks})
    out: dict[str, Any] = {"repeats": repeats, "n_context": len(ctx_tokens),
                           "verifier": probe(engine.verifier, sizes),
                           "draft": {}, "draft_over_verifier": None}
    if engine.draft is not None:  # on its own tokens (a foreign draft: the same text's)
        ctx_tokens = _in_draft_tokens(engine, ctx_tokens)
        out["draft"] = probe(engine.draft, [1])
    elif getattr(engine, "mtp", None) is not None:  # the verifier's own MTP head drafts
        out["draft"] = _probe_head(engine.mtp.head, ctx_tokens, repeats + warm, warm)
    if out["draft"]:
        out["draft_over_verifier"] = out["draft"]["1"] / out["verifier"]["1"]
    return out


def _in_draft_tokens(engine, tokens: list[int]) -> list[int]:
    """The verifier's ``tokens`` as the draft's ids: the same for a pair of one vocabulary,
    else their text tokenized by the draft (never a verifier id the draft may lack)."""
    pair = getattr(engine, "pair_vocab", None)
    if pair is None or pair.kind == "same":
        return tokens
    text = engine.verifier.model.detokenize(tokens)
    return engine.draft.model.tokenize(text, add_special=True, parse_special=False) or \
        [max(0, engine.draft.model.bos)]


def _probe_head(head, ctx_tokens: Sequence[int], n: int, warm: bool) -> dict[str, float]:
    """Median milliseconds of an MTP head's one-token decode (a drafted token) after
    ``ctx_tokens`` (paired with zero state rows: the cost does not depend on them); the head is
    emptied after (its engine re-synchronises it)."""
    E = head.model.n_embd_out
    head.clear()
    head.decode_states(ctx_tokens, np.zeros((len(ctx_tokens), E), np.float32))
    base, times = head.n_past, []
    for _ in range(n):
        t0 = time.perf_counter()
        head.decode_states(ctx_tokens[-1:], np.zeros((1, E), np.float32))
        times.append((time.perf_counter() - t0) * 1e3)
        head.forget(base)
    head.clear()
    return {"1": float(statistics.median(times[1:] if warm else times))}


def probe_sizes(k_max: int) -> list[int]:
    """Draft lengths whose verification batch (k + 1 tokens) the probe times: 1, k_max / 2 and
    k_max (the rest are interpolated, and every size the policy uses is corrected online), so the
    probe costs the prefill of its context plus verifier(1) + verifier(2) + verifier(k/2 + 1) +
    verifier(k + 1) + draft(1), each decoded once."""
    return sorted({k for k in (1, k_max // 2, k_max) if 1 <= k <= k_max})


def _file_key(path: str | os.PathLike[str]) -> str:
    st = os.stat(path)
    return f"{Path(path).name}:{st.st_size}:{int(st.st_mtime)}"


def _key(engine, k_max: int) -> str:
    lo = engine.load_options
    draft = (_file_key(engine.draft.model.path) if engine.draft is not None
             else "mtp head" if getattr(engine, "mtp", None) is not None else "no draft")
    parts = [_file_key(engine.verifier.model.path), draft,
             system_info(), str(engine.verifier.n_threads), str(engine.verifier.n_ctx),
             str(lo.n_gpu_layers), str(lo.n_gpu_layers_draft), str(k_max),
             # where the layers run: an RPC server's costs are its machine's and its network's
             str(lo.device), str(lo.rpc), str(lo.device_draft), str(lo.rpc_draft),
             str(lo.tensor_split),
             # which devices hold the layers (a CPU and a GPU build have the same system info)
             devices_key(*(getattr(c.model, "placement", None) if c is not None else None
                           for c in (engine.verifier, engine.draft)))]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def forward_costs(engine, k_max: int, cache_dir: Path | None) -> tuple[ForwardCosts, bool]:
    """This machine's ForwardCosts for ``engine``'s verifier and draft, and whether they came from
    the cache. A probe clears both KV caches (the next request prefills from scratch).
    ``cache_dir`` None: probe, cache nothing."""
    path = cache_dir / COSTS_FILE if cache_dir is not None else None
    key = _key(engine, k_max)
    table: dict = {}
    if path is not None and path.is_file():
        try:
            table = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            table = {}
        hit = table.get(key)
        if isinstance(hit, dict) and "verify" in hit and "draft" in hit:
            return ForwardCosts({int(b): s for b, s in hit["verify"].items()}, hit["draft"]), True
    room = min(c.n_ctx for c in (engine.verifier, engine.draft) if c is not None) - (k_max + 1)
    tokens = engine.tokenize("def probe(x):\n    return x * 2 + 1\n" * 4)[:max(1, min(16, room))]
    ms = measure_forward_costs(engine, tokens, probe_sizes(k_max), repeats=1, warm=False)
    costs = ForwardCosts({int(n): v / 1e3 for n, v in ms["verifier"].items()},
                         ms["draft"].get("1", 0.0) / 1e3)  # no draft model: lookup only
    if path is not None:
        try:
            store_costs(path, key, costs.as_dict())
        except OSError:
            pass  # a read-only cache only costs a probe next time
    return costs, False


def _read_table(path: Path) -> dict:
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return table if isinstance(table, dict) else {}


def _locked(lock_path: Path) -> filelock.FileLock:
    """An exclusive lock on ``lock_path`` between processes and threads (``filelock``: flock on
    POSIX, msvcrt on Windows; released when the file is closed, also by a crash)."""
    return filelock.FileLock(lock_path)


def store_costs(path: Path, key: str, entry: dict) -> None:
    """Add ``entry`` under ``key`` to the JSON table at ``path``, keeping every other process's
    entries: under the lock, the table is read again, the entry merged in, and the result written
    to a temporary file of this process's own in the same directory, then renamed over the table
    (atomic: a reader sees the old table or the new one). Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path.with_name(path.name + ".lock")):
        table = _read_table(path)
        table[key] = entry
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(json.dumps(table, indent=1) + "\n")
            # mkstemp's file is private (0600): keep the table's mode, else an ordinary file's
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode) if path.exists() else 0o644)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


class SlowStepWatch:
    """One warning (per engine, through ``logging``) when verification steps run far slower than
    this machine's probed forward costs say they should.

    The usual cause: another busy process on the same cores. llama.cpp's threads spin-wait for
    each other at every barrier, so with every core's thread competing, a decode that takes
    milliseconds alone can take seconds (a run looks hung inside ``llama_decode``); fewer threads
    than cores, or a free machine, restores the speed.

    A step is slow when its verifier decode takes at least ``factor`` times the probed cost of its
    batch (the costs as probed, not the policy's online-corrected ones, which follow the slowdown)
    and at least ``min_seconds`` (a tiny model's millisecond step far into a long context is not
    a stall); ``run`` slow steps in a row give the warning.
    """

    def __init__(self, n_threads: int, factor: float = 10.0, min_seconds: float = 0.2,
                 run: int = 3) -> None:
        self.n_threads, self.factor = n_threads, factor
        self.min_seconds, self.run = min_seconds, run
        self._probed: ForwardCosts | None = None
        self._slow = 0
        self.warned = False

    def expect(self, costs: ForwardCosts) -> None:
        """The probed (or cached) costs to compare with; a copy, so online corrections of
        ``costs`` do not move it."""
        d = costs.as_dict()
        self._probed = ForwardCosts({int(b): v for b, v in d["verify"].items()}, d["draft"])

    def observe(self, n_drafted: int, verify_seconds: float) -> None:
        """One step's verifier decode of ``n_drafted`` + 1 tokens took ``verify_seconds``."""
        if self._probed is None or self.warned:
            return
        probed = self._probed.verify(n_drafted + 1)
        if verify_seconds < max(self.factor * probed, self.min_seconds):
            self._slow = 0
            return
        self._slow += 1
        if self._slow >= self.run:
            self.warned = True
            log.warning(
                "cactus-gguf: warning: llama_decode steps take %.2f s, %.0fx the %.4f s this "
                "machine's probe measured for them: the cores are probably busy with another "
                "process, and llama.cpp's %d threads spin-wait for each other; use fewer threads "
                "(-t 1 / n_threads=1) or stop the other process", verify_seconds,
                verify_seconds / probed if probed > 0 else float("inf"), probed, self.n_threads)
