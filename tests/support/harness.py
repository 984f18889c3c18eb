"""Shared helpers of the tests that run tiny models (GGUFs from tests/support/tiny_gguf.py).

- ``KvShadow``: records the token ids each context's KV cache holds, from the decode / truncate /
  clear calls, so tests can check "each context holds exactly the committed prefix" after every step
  independently of the context's own bookkeeping (``Context.tokens``).
- ``track_loads``, ``rss_mib``, ``mappings_of``, ``memory_slope``, ``load_free_cycles``,
  ``report_resources``: resources and their trends.
- ``run_cli`` / ``assert_one_line_error``: the real ``python -m cactus_gguf`` in a subprocess.
- ``ctx`` / ``make_engine`` / ``StepLog``: engines over tiny models and a log of their steps.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import numpy as np


# ------------------------------------------------------------------------------------------------
# KV-cache shadow
# ------------------------------------------------------------------------------------------------

class KvShadow:
    """Mirror of what each llama Context's KV cache holds, kept from its decode / forget /
    truncate / clear calls (install with ``KvShadow.install(monkeypatch)``). ``held(ctx)`` is the
    list of token ids at positions 0 .. n_past-1; ``decodes`` logs (ctx, tokens, n_logits) of every
    decode call."""

    def __init__(self) -> None:
        self.cache: dict[int, list[int]] = {}
        self.decodes: list[tuple[object, list[int], int]] = []

    @classmethod
    def install(cls, monkeypatch) -> "KvShadow":
        from cactus_gguf.llama import Context

        shadow = cls()
        decode, truncate, forget, clear = (Context.decode, Context.truncate, Context.forget,
                                           Context.clear)

        def traced_decode(self, tokens, n_logits=1, **kw):
            shadow.before_decode(self, [int(t) for t in tokens], n_logits)
            out = decode(self, tokens, n_logits, **kw)
            shadow.cache.setdefault(id(self), []).extend(int(t) for t in tokens)
            shadow.decodes.append((self, [int(t) for t in tokens], n_logits))
            shadow.check_kv(self)
            return out

        def traced_truncate(self, n_keep):  # forget, then decode what it could not keep
            truncate(self, n_keep)
            assert shadow.cache.setdefault(id(self), [])[n_keep:] == []
            shadow.check_kv(self)

        def traced_forget(self, n_keep, upto=None):
            n = forget(self, n_keep, upto)
            assert n <= max(n_keep, upto or 0)
            del shadow.cache.setdefault(id(self), [])[n:]
            shadow.check_kv(self)
            return n

        def traced_clear(self):
            clear(self)
            shadow.cache[id(self)] = []
            shadow.check_kv(self)

        monkeypatch.setattr(Context, "decode", traced_decode)
        monkeypatch.setattr(Context, "truncate", traced_truncate)
        monkeypatch.setattr(Context, "forget", traced_forget)
        monkeypatch.setattr(Context, "clear", traced_clear)
        return shadow

    def held(self, ctx) -> list[int]:
        return self.cache.get(id(ctx), [])

    def before_decode(self, ctx, tokens: list[int], n_logits: int) -> None:
        """Hook for tests (called before each decode)."""

    @staticmethod
    def check_kv(ctx) -> None:
        """llama.cpp's KV cache holds exactly positions 0 .. n_past-1 of sequence 0 (a recurrent
        state: the state after position n_past - 1)."""
        import llama_cpp

        name = ctx.model.path.name
        assert ctx.kv_pos_max() == ctx.n_past - 1, (name, ctx.kv_pos_max(), ctx.n_past)
        pos_min = llama_cpp.llama_memory_seq_pos_min(ctx.memory, 0)
        # a recurrent state is one cell at the last position (a hybrid reports the larger minimum)
        first = ctx.n_past - 1 if ctx.recurrent else 0
        assert pos_min == (first if ctx.n_past else -1), (name, pos_min, ctx.n_past)


def track_loads(monkeypatch) -> list:
    """Every llama Model and Context created from now on (to check that error paths free them)."""
    from cactus_gguf.llama import Context, Model

    out: list = []
    for cls in (Model, Context):
        init = cls.__init__

        def tracked(self, *a, _init=init, **kw):
            out.append(self)
            _init(self, *a, **kw)

        monkeypatch.setattr(cls, "__init__", tracked)
    return out


# ------------------------------------------------------------------------------------------------
# Memory trends
# ------------------------------------------------------------------------------------------------

def rss_mib() -> float:
    """Anonymous resident memory of this process, MiB: ``RssAnon`` of /proc/self/status, read after
    a garbage collection and glibc's ``malloc_trim(0)``. What a leak holds (a live allocation: a
    buffer, a context, a Python object) counts; what varies with no leak does not: file-backed pages
    (the models' mmap and shared libraries, paged in and evicted as the shared machine's page cache
    moves; a model that stays mapped is caught by ``mappings_of``) and heap that was freed but not
    yet handed back (the trim hands it back). Whole-process RSS swung by 36 MiB over 20 cycles with
    no trend on a CI machine; this figure is what the trend tests bound."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the figure keeps the allocator's slack
        pass
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("/proc/self/status has no RssAnon line")


def mappings_of(paths: Sequence[os.PathLike | str]) -> int:
    """How many memory mappings of this process map one of ``paths`` (/proc/self/maps): a model
    that was freed leaves none."""
    names = {str(Path(p).resolve()) for p in paths}
    with open("/proc/self/maps") as f:
        fields = [line.split(maxsplit=5) for line in f]  # address perms offset dev inode [path]
    return sum(len(x) == 6 and x[5].strip() in names for x in fields)


def memory_slope(samples: Sequence[float]) -> float:
    """Growth of resident-memory samples taken at equal steps, MiB per step, measured so that the
    allocator's jumps do not read as a leak: the smaller of the Theil-Sen slopes (median of the
    pairwise slopes) of the first and the second half. A transient spike moves neither (a median
    ignores it); a lasting jump (+4 MiB after some cycle, seen with no leak at all: glibc hands freed
    arenas back late, repacked buffers land elsewhere) lies within one half and leaves the other
    flat; a leak of L MiB per step raises both to ~L."""
    from scipy.stats import theilslopes

    a = np.asarray(samples, dtype=np.float64)
    half = len(a) // 2
    return float(min(theilslopes(a[:half]).slope, theilslopes(a[half:]).slope))


def load_free_cycles(ver, dft, n: int, context, generate: bool = True,
                     repack: bool | None = None, leak_mib: float = 0.0):
    """n cycles of: load both models (contexts, KV caches, vocabulary check), optionally generate
    a few tokens, free everything. Returns, after each cycle, the anonymous resident memory (MiB,
    ``rss_mib``), the seconds it took and how many mappings of the model files remain.
    ``leak_mib`` > 0 keeps that much touched memory per cycle (a deliberate leak, to show that
    the trend test sees one). ``context``: the ContextOptions whose n_ctx / n_batch / n_threads
    both models load with."""
    import time

    from cactus_gguf.options import LoadOptions, Request
    from cactus_gguf.speculative import Engine

    load = LoadOptions(n_ctx=context.n_ctx, n_batch=context.n_batch, n_threads=context.n_threads)
    rss, secs, maps, kept = [], [], [], []
    for _ in range(n):
        t0 = time.perf_counter()
        with Engine(ver, dft, load, defaults=Request(k=4, temperature=0.0), repack=repack) as dec:
            if generate:
                dec.generate("def add(a, b):", n_predict=2, seed=0)
        if leak_mib:
            kept.append(bytearray(b"x" * int(leak_mib * 2**20)))
        secs.append(time.perf_counter() - t0)
        rss.append(rss_mib())
        maps.append(mappings_of([ver, dft]))
    return rss, secs, maps


WARMUP = 4  # load/free cycles that keep one-time allocations (backend, thread pool, arenas)
MAX_SLOPE = 0.5  # MiB per cycle: half the smallest leak the load/free cycle tests must catch


def report_resources(record_property, name: str, text: str) -> None:
    """A memory figure: printed (run with -s) and attached to the test report as a user property."""
    print(f"\nRESOURCES {name}: {text}")
    record_property(name, text)


# ------------------------------------------------------------------------------------------------
# The CLI in a subprocess
# ------------------------------------------------------------------------------------------------

def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
                                                      env.get("PYTHONPATH")]))
    return env


def run_cli(*args: str, timeout: float = 120, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cactus_gguf", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=cli_env(),
                          input=stdin)


def bench_cli(out_dir: Path, *args, prompts: Sequence[str] = ("the cat sat on", "hello")) -> dict:
    """``cactus-gguf bench *args`` on free ``prompts`` (a JSONL file written in ``out_dir``), one
    thread, -c 256; its bench.json. Fails the test on a non-zero exit."""
    import json

    path = Path(out_dir) / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    r = run_cli("bench", *args, "--prompts", path, "-c", "256", "-t", "1", "-o",
                Path(out_dir) / "out", timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads((Path(out_dir) / "out" / "bench.json").read_text(encoding="utf-8"))


def assert_one_line_error(r: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit code != 0, stderr exactly one line 'cactus-gguf: error: ...', no traceback; returns it."""
    assert r.returncode not in (0, None), (r.returncode, r.stdout, r.stderr)
    assert r.returncode > 0, f"killed by signal {-r.returncode}: {r.stderr}"
    assert "Traceback" not in r.stderr and "Traceback" not in (r.stdout or ""), r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("cactus-gguf: error: "), r.stderr
    for f in fragments:
        assert f.lower() in lines[0].lower(), (f, lines[0])
    return lines[0]


# ------------------------------------------------------------------------------------------------
# Decoders on tiny models
# ------------------------------------------------------------------------------------------------

def ctx(n_ctx: int = 512, n_batch: int = 64):
    """ContextOptions for tiny models: one thread (the machine is shared; two OpenMP threads spin)."""
    from cactus_gguf.llama import ContextOptions

    return ContextOptions(n_ctx=n_ctx, n_batch=n_batch, n_threads=1)


def make_engine(ver, dft=None, *, temp: float = 0.8, top_k: int = 0, top_p: float = 1.0,
                min_p: float = 0.0, context=None, draft_context=None, **request):
    """An Engine over tiny models whose default Request has these warps and ``request`` fields
    (k, method, delta, solver, drafter, ...); the draft is loaded only when the model drafter is
    in play (method "none" = the verifier alone). ``context``: ContextOptions (default ctx())."""
    from cactus_gguf.options import LoadOptions, Request
    from cactus_gguf.speculative import Engine

    req = Request(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p,
                  **{"k": 4, "method": "cactus", **request})
    c = context or ctx()
    load = LoadOptions(n_ctx=c.n_ctx, n_batch=c.n_batch, n_threads=c.n_threads)
    use_draft = req.method != "none" and req.drafter in ("model", "hybrid")
    return Engine(ver, dft if use_draft else None, load, defaults=req, draft_context=draft_context)


class StepLog:
    """Records every NativeSampler.verify call of the engine's steps (install with ``StepLog.install``):
    ``steps`` is a list of (n_drafted, n_accepted, draft_probs copy or None, draft tokens)."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, int, object, list[int]]] = []

    @classmethod
    def install(cls, monkeypatch, *, keep_probs: bool = False) -> "StepLog":
        from cactus_gguf.sampling import NativeSampler

        log = cls()
        verify = NativeSampler.verify

        def traced(self, draft_probs, draft_tokens, verifier_logits, **kw):
            res = verify(self, draft_probs, draft_tokens, verifier_logits, **kw)
            probs = None if draft_probs is None or not keep_probs else np.array(draft_probs)
            log.steps.append((len(draft_tokens), res.n_accepted, probs,
                              [int(t) for t in draft_tokens]))
            return res

        monkeypatch.setattr(NativeSampler, "verify", traced)
        return log

    def acceptance(self, steps=None) -> float:
        steps = self.steps if steps is None else steps
        drafted = sum(s[0] for s in steps)
        return sum(s[1] for s in steps) / drafted if drafted else float("nan")


# ------------------------------------------------------------------------------------------------
# Greedy equivalence
# ------------------------------------------------------------------------------------------------

def top_two_gap(model_path, ids: list[int], context=None) -> float:
    """The verifier's gap between its two largest logits after ``ids`` (fresh prefill)."""
    from cactus_gguf.llama import Context

    with Context.load(model_path, context_options=context or ctx(n_batch=512)) as m:
        row = np.sort(np.array(m.decode(ids, 1)[0], dtype=np.float64))
    return float(row[-1] - row[-2])


def assert_greedy_equal(got: list[int], want: list[int], model_path, prompt_ids: list[int],
                        max_gap: float, context=None, what: str = "") -> None:
    """got == want, or they first differ at a near-tie of the verifier (top-two gap <= max_gap)."""
    if got == want:
        return
    i = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    gap = top_two_gap(model_path, prompt_ids + want[:i], context)
    assert gap <= max_gap, (f"{what}: speculative output left the verifier's greedy path at token "
                            f"{i} where its top-two logit gap is {gap:.4g} (> {max_gap}): "
                            f"got {got[i:i + 5]}, want {want[i:i + 5]}")
