"""Shared helpers of the reliability tests (tests/test_reliability_*.py).

- ``write_llama``: tiny llama-family GGUFs with the knobs the fault tests need (architecture name,
  add-BOS flag, EOS id, padding, rows of the output layer zeroed, or a scripted *bigram* model whose
  next token is fixed by the current one, so a test can make llama.cpp emit chosen tokens).
- ``KvShadow``: records the token ids each context's KV cache holds, from the decode / truncate /
  clear calls, so tests can check "each context holds exactly the committed prefix" after every step
  independently of the context's own bookkeeping (``Context.tokens``).
- ``run_cli`` / ``assert_one_line_error``: the real ``python -m cactus_gguf`` in a subprocess.

Vocabulary (from tests/tiny_gguf.py): V = 281 = <unk>, <s>, </s>, 256 byte tokens <0x00>..<0xFF>
(byte b is token id 3 + b), then 22 words; n_pad unused ids may follow.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

import gguf
from tiny_gguf import N_CTX_TRAIN, N_EMBD, N_FF, N_HEAD, N_LAYER, WORDS, vocab

BOS, EOS = 1, 2
# A minimal chat template for tiny models (tokenizer.chat_template): role-prefixed lines.
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def byte_token(b: int) -> int:
    """The token id of byte ``b`` in the tiny vocabulary."""
    return 3 + b


def text_tokens(text: str) -> list[int]:
    """Byte-token ids spelling ``text`` in UTF-8 (one token per byte)."""
    return [byte_token(b) for b in text.encode("utf-8")]


def write_llama(path: str | Path, *, seed: int = 11, arch: str = "llama", add_bos: bool = True,
                bos_id: int = BOS, eos_id: int = EOS, eot_id: int | None = None, logit_scale: float = 2.0, n_pad: int = 0, noise: float = 0.0,
                noise_seed: int = 0, zero_output_rows: Sequence[int] = (),
                bigram: dict[int, int] | None = None, words: list[str] = WORDS,
                chat_template: str | None = None) -> Path:
    """Write a 2-layer llama GGUF with float32 weights; return its path.

    ``zero_output_rows``: token ids whose output-layer row is 0 (logit exactly 0 while the other
    logits spread over about +-14: such a token is practically never sampled, e.g. EOS for a long run).
    ``chat_template``: a Jinja chat template (``tokenizer.chat_template``), e.g. CHAT_TEMPLATE.
    ``bigram``: {current token: next token}. The attention and FFN outputs are zeroed, so the final
    hidden state is the normalised embedding of the current token, and the output layer maps it to a
    logit about 32 above every other one for the scripted next token (a deterministic chain at any
    temperature <= 1); tokens without an entry get random next-token logits.
    """
    path = Path(path)
    rng = np.random.default_rng(seed)
    noise_rng = np.random.default_rng(noise_seed)
    tokens, scores, types = vocab(n_pad, words)
    V = len(tokens)
    w = gguf.GGUFWriter(str(path), arch)
    pre = arch  # metadata keys are prefixed with the architecture name
    w.add_uint32(f"{pre}.context_length", N_CTX_TRAIN)
    w.add_uint32(f"{pre}.embedding_length", N_EMBD)
    w.add_uint32(f"{pre}.block_count", N_LAYER)
    w.add_uint32(f"{pre}.feed_forward_length", N_FF)
    w.add_uint32(f"{pre}.attention.head_count", N_HEAD)
    w.add_uint32(f"{pre}.attention.head_count_kv", N_HEAD)
    w.add_uint32(f"{pre}.rope.dimension_count", N_EMBD // N_HEAD)
    w.add_float32(f"{pre}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(bos_id)
    w.add_eos_token_id(eos_id)
    if eot_id is not None:
        w.add_eot_token_id(eot_id)
    w.add_unk_token_id(0)
    w.add_add_bos_token(add_bos)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    def rand(*shape: int, scale: float = 0.2) -> np.ndarray:
        base = rng.standard_normal(shape)
        if noise > 0:
            base = base + noise * noise_rng.standard_normal(shape)
        return (base * scale).astype(np.float32)

    emb = rand(V, N_EMBD, scale=1.0)
    w.add_tensor("token_embd.weight", emb)
    zero_out = bigram is not None  # a bigram model: layers add nothing to the residual stream
    for i in range(N_LAYER):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", rand(N_EMBD, N_EMBD))
        w.add_tensor(f"blk.{i}.attn_k.weight", rand(N_EMBD, N_EMBD))
        w.add_tensor(f"blk.{i}.attn_v.weight", rand(N_EMBD, N_EMBD))
        out = rand(N_EMBD, N_EMBD)
        w.add_tensor(f"blk.{i}.attn_output.weight", out * 0 if zero_out else out)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", rand(N_FF, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_up.weight", rand(N_FF, N_EMBD))
        down = rand(N_EMBD, N_FF)
        w.add_tensor(f"blk.{i}.ffn_down.weight", down * 0 if zero_out else down)
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, np.float32))
    output = rand(V, N_EMBD, scale=0.3 * logit_scale)
    if bigram is not None:
        # logit of b after a = 0.5 * |e_a / rms(e_a)|^2 = 0.5 * N_EMBD = 32 for the scripted b,
        # against cross terms of standard deviation 0.5 * sqrt(N_EMBD) = 4 for the others
        unit = emb / np.sqrt((emb.astype(np.float64) ** 2).mean(axis=1, keepdims=True))
        output = output * 0.05
        for a, b in bigram.items():
            output[b] += 0.5 * unit[a].astype(np.float32)
    for t in zero_output_rows:
        output[t] = 0.0
    w.add_tensor("output.weight", output)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def chain(tokens: Sequence[int]) -> dict[int, int]:
    """The bigram map that makes each token of ``tokens`` follow the previous one (every token but
    the last must be distinct: a bigram model's next token depends on the current one only)."""
    assert len(set(tokens[:-1])) == len(tokens) - 1, "a bigram chain cannot repeat a token"
    return {a: b for a, b in zip(tokens, tokens[1:])}


# ------------------------------------------------------------------------------------------------
# KV-cache shadow
# ------------------------------------------------------------------------------------------------

class KvShadow:
    """Mirror of what each llama Context's KV cache holds, kept from its decode / truncate /
    clear calls (install with ``KvShadow.install(monkeypatch)``). ``held(ctx)`` is the list of token
    ids at positions 0 .. n_past-1; ``decodes`` logs (ctx, tokens, n_logits) of every decode call."""

    def __init__(self) -> None:
        self.cache: dict[int, list[int]] = {}
        self.decodes: list[tuple[object, list[int], int]] = []

    @classmethod
    def install(cls, monkeypatch) -> "KvShadow":
        from cactus_gguf.llama import Context

        shadow = cls()
        decode, truncate, clear = Context.decode, Context.truncate, Context.clear

        def traced_decode(self, tokens, n_logits=1):
            shadow.before_decode(self, [int(t) for t in tokens], n_logits)
            out = decode(self, tokens, n_logits)
            shadow.cache.setdefault(id(self), []).extend(int(t) for t in tokens)
            shadow.decodes.append((self, [int(t) for t in tokens], n_logits))
            shadow.check_kv(self)
            return out

        def traced_truncate(self, n_keep):
            truncate(self, n_keep)
            del shadow.cache.setdefault(id(self), [])[n_keep:]
            shadow.check_kv(self)

        def traced_clear(self):
            clear(self)
            shadow.cache[id(self)] = []
            shadow.check_kv(self)

        monkeypatch.setattr(Context, "decode", traced_decode)
        monkeypatch.setattr(Context, "truncate", traced_truncate)
        monkeypatch.setattr(Context, "clear", traced_clear)
        return shadow

    def held(self, ctx) -> list[int]:
        return self.cache.get(id(ctx), [])

    def before_decode(self, ctx, tokens: list[int], n_logits: int) -> None:
        """Hook for tests (called before each decode)."""

    @staticmethod
    def check_kv(ctx) -> None:
        """llama.cpp's KV cache holds exactly positions 0 .. n_past-1 of sequence 0."""
        import llama_cpp

        name = ctx.model.path.name
        assert ctx.kv_pos_max() == ctx.n_past - 1, (name, ctx.kv_pos_max(), ctx.n_past)
        pos_min = llama_cpp.llama_memory_seq_pos_min(ctx.memory, 0)
        assert pos_min == (0 if ctx.n_past else -1), (name, pos_min)


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


# ------------------------------------------------------------------------------------------------
# The CLI in a subprocess
# ------------------------------------------------------------------------------------------------

def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent.parent),
                                                      env.get("PYTHONPATH")]))
    return env


def run_cli(*args: str, timeout: float = 120, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cactus_gguf", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=cli_env(),
                          input=stdin)


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
