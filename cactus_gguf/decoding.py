"""The speculative decoding loop: draft k tokens, verify them in one verifier decode, accept.

Dimension letters: k = draft length (tokens proposed per step), V = verifier vocabulary size.

Glossary (see ``native/cactus_native.h`` for the acceptance math):
  committed   the prompt plus every emitted token; both KV caches hold a prefix of it
  pending     committed tokens a context has not decoded yet (usually just the newest one)
  drafted     tokens the draft model proposed this step, d_1 .. d_k
  accepted    the drafted tokens the acceptance rule kept, d_1 .. d_AL  (AL = acceptance length)
  residual    the token emitted at the first rejection; bonus: the token emitted when all k pass

One step, for committed tokens t_0 .. t_{L-1} (t_{L-1} pending in both contexts):
  draft:   decode the draft's pending tokens, then sample d_1 .. d_k one at a time, keeping each
           warped draft distribution p_i (float32 [k, V]);
  verify:  one verifier decode of [t_{L-1}, d_1 .. d_k] with logits for all k+1 rows
           (float32 [k+1, V], read in place);
  accept:  the native helper returns AL and the residual / bonus token;
  commit:  append d_1 .. d_AL and that token; roll both KV caches back to the committed prefix.
"""
from __future__ import annotations

import codecs
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from .backend import ContextOptions, DecodeError, LlamaModelContext, ModelOptions
from .sampling import AcceptanceParams, NativeSampler, SamplingParams

__all__ = [
    "DecoderConfig",
    "GenerationStats",
    "GenerationResult",
    "SpeculativeDecoder",
    "VocabMismatchError",
    "ContextLengthError",
    "check_vocab_compatible",
]


class VocabMismatchError(ValueError):
    """Draft and verifier tokenize differently; speculation between them would be meaningless."""


class ContextLengthError(ValueError):
    """The prompt does not fit in the context (n_ctx)."""


# token attributes (llama.h enum llama_token_attr) that mark ids no text ever maps to
_ATTR_UNUSED = 1 << 1
_ATTR_UNDEFINED = 0


def check_vocab_compatible(verifier: LlamaModelContext, draft: LlamaModelContext) -> None:
    """Refuse a draft whose tokenizer differs from the verifier's.

    Checked: tokenizer type; BOS / EOS / EOT ids and the add-BOS flag; the text of every id the two
    vocabularies share. Vocabularies of different sizes are accepted only when the extra ids at the
    end of the longer one are unused padding (e.g. 151,936 vs 152,064 in the Qwen2 family); the draft
    then never proposes an id the verifier lacks.

    Raises VocabMismatchError naming the first difference.
    """
    def names(m: LlamaModelContext) -> str:
        return m.path.name

    if verifier.vocab_type != draft.vocab_type:
        raise VocabMismatchError(
            f"draft {names(draft)} and verifier {names(verifier)} use different tokenizer types "
            f"({draft.vocab_type} vs {verifier.vocab_type}): pick a draft from the verifier's model family")
    for what in ("bos", "eos", "eot", "add_bos"):
        a, b = getattr(verifier, what), getattr(draft, what)
        if a != b:
            raise VocabMismatchError(
                f"draft {names(draft)} and verifier {names(verifier)} disagree on {what} "
                f"(verifier {a}, draft {b}): pick a draft from the verifier's model family")
    n_common = min(verifier.n_vocab, draft.n_vocab)
    for i in range(n_common):
        tv, td = verifier.token_text(i), draft.token_text(i)
        if tv != td:
            raise VocabMismatchError(
                f"draft {names(draft)} and verifier {names(verifier)} have different vocabularies: "
                f"token id {i} is {tv.decode('utf-8', 'replace')!r} in the verifier and "
                f"{td.decode('utf-8', 'replace')!r} in the draft; pick a draft from the verifier's "
                "model family")
    longer = verifier if verifier.n_vocab > draft.n_vocab else draft
    for i in range(n_common, longer.n_vocab):
        text = longer.token_text(i)
        padding = (longer.token_attr(i) in (_ATTR_UNUSED, _ATTR_UNDEFINED)
                   or text.startswith((b"[PAD", b"<|PAD", b"<pad")))
        if not padding:
            raise VocabMismatchError(
                f"vocabulary sizes differ (verifier {verifier.n_vocab}, draft {draft.n_vocab}) and "
                f"id {i} of {names(longer)} ({text.decode('utf-8', 'replace')!r}) is a real token: "
                "pick a draft from the verifier's model family")


DRAFTERS = ("model", "ngram")


@dataclass(frozen=True)
class DecoderConfig:
    """Everything fixed for a decoder's lifetime.

    k: draft length, tokens proposed per verification step (llama.cpp ``--draft-max``), >= 1.
    acceptance: the acceptance rule; None = no speculation, the verifier decodes alone
        (the baseline, same sampler).
    drafter: "model" (a draft GGUF samples k tokens) or "ngram" (prompt lookup: the tokens that
        followed the latest earlier occurrence of the last n tokens; a deterministic proposal,
        p one-hot, no draft model).
    draft_min: a draft shorter than this is dropped and the step is verifier-only
        (llama.cpp ``--draft-min``); 0 = keep every draft.
    draft_p_min: stop drafting when the draft's most likely token has probability below this
        (llama.cpp ``--draft-p-min``); 0 = always draft k tokens. Model drafter only.
    ngram_max / ngram_min: longest / shortest n-gram the n-gram drafter looks up, tokens.
    sampling: warps shared by draft and verifier (the acceptance test compares the warped p and q).
    verifier_model / draft_model: load options (n_gpu_layers, mmap, repacking) per model.
    context: n_ctx / n_batch / threads of the verifier's context (and the draft's, by default).
    draft_context: the draft's context when it should differ (e.g. a smaller n_ctx); None = context.
    """

    k: int = 8
    acceptance: AcceptanceParams | None = field(default_factory=AcceptanceParams)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    drafter: str = "model"
    draft_min: int = 0
    draft_p_min: float = 0.0
    ngram_max: int = 3
    ngram_min: int = 1
    verifier_model: ModelOptions = field(default_factory=ModelOptions)
    draft_model: ModelOptions = field(default_factory=ModelOptions)
    context: ContextOptions = field(default_factory=ContextOptions)
    draft_context: ContextOptions | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"draft length k must be an integer >= 1, got {self.k!r}")
        for ctx in (self.context, self.draft_context or self.context):
            if self.k >= ctx.n_batch:
                raise ValueError(f"draft length k={self.k} must be below the batch size n_batch="
                                 f"{ctx.n_batch}: the k+1 verified tokens go in one llama_decode")
        if self.drafter not in DRAFTERS:
            raise ValueError(f"drafter must be one of {', '.join(DRAFTERS)}, got {self.drafter!r}")
        if not isinstance(self.draft_min, int) or not 0 <= self.draft_min <= self.k:
            raise ValueError(f"draft_min must be an integer in [0, k={self.k}], got {self.draft_min!r}")
        if not 0.0 <= self.draft_p_min <= 1.0:
            raise ValueError(f"draft_p_min must be in [0, 1], got {self.draft_p_min!r}")
        if not (isinstance(self.ngram_min, int) and isinstance(self.ngram_max, int)
                and 1 <= self.ngram_min <= self.ngram_max):
            raise ValueError(f"n-gram sizes must satisfy 1 <= ngram_min <= ngram_max, got "
                             f"{self.ngram_min}, {self.ngram_max}")

    @property
    def needs_draft_model(self) -> bool:
        return self.acceptance is not None and self.drafter == "model"

    @property
    def method(self) -> str:
        return "none" if self.acceptance is None else self.acceptance.method


@dataclass
class GenerationStats:
    """Counters and timings of one generation. Times are wall-clock seconds.

    n_steps: verification steps (for ``none``: verifier decodes); n_drafted / n_accepted: draft
    tokens proposed / accepted over all steps. ``decode_seconds`` excludes prompt processing.
    KL values are nats, averaged / maximised over evaluated draft positions.
    """

    n_prompt_tokens: int = 0
    n_tokens: int = 0
    n_steps: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    n_evaluated: int = 0
    kl_sum: float = 0.0
    kl_max: float = 0.0
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    accept_seconds: float = 0.0
    decode_seconds: float = 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Accepted drafts per verification step (AL), tokens."""
        return self.n_accepted / self.n_steps if self.n_steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens, in [0, 1]."""
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def mean_drafted_length(self) -> float:
        return self.n_drafted / self.n_steps if self.n_steps else 0.0

    @property
    def tokens_per_verifier_call(self) -> float:
        return self.n_tokens / self.n_steps if self.n_steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of decoding (prompt processing excluded)."""
        return self.n_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def kl_mean(self) -> float:
        return self.kl_sum / self.n_evaluated if self.n_evaluated else 0.0

    @property
    def other_seconds(self) -> float:
        """Decode time outside the model calls and the native acceptance step: loop overhead."""
        return max(0.0, self.decode_seconds - self.draft_seconds - self.verify_seconds
                   - self.accept_seconds)

    def as_dict(self) -> dict:
        d = asdict(self)
        for name in ("mean_accepted_length", "acceptance_rate", "mean_drafted_length",
                     "tokens_per_verifier_call", "tokens_per_second", "kl_mean", "other_seconds"):
            d[name] = getattr(self, name)
        return d


@dataclass
class GenerationResult:
    """What one call produced. ``stop_reason``: "eos", "length" (-n or context full) or "stop"."""

    text: str
    tokens: list[int]
    stop_reason: str
    stats: GenerationStats
    seed: int
    message: str = ""  # human-readable detail for the stop, e.g. "context full (n_ctx=4096)"


class _StopMatcher:
    """Stop strings across token boundaries, without ever releasing text a stop string may start."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.text = ""
        self.released = 0
        self.hit = False

    def feed(self, piece: str) -> str:
        """Add text; return what is now safe to stream (never part of a stop string)."""
        self.text += piece
        if not self.stops:
            out, self.released = self.text[self.released:], len(self.text)
            return out
        longest = max(len(s) for s in self.stops)
        search_from = max(0, self.released - longest + 1)
        cut = None
        for s in self.stops:
            j = self.text.find(s, search_from)
            if j != -1 and (cut is None or j < cut):
                cut = j
        if cut is not None:
            self.hit = True
            self.text = self.text[:cut]
            out, self.released = self.text[self.released:], len(self.text)
            return out
        hold = 0  # longest tail of the text that is a proper prefix of some stop string
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.text) - self.released), hold, -1):
                if self.text.endswith(s[:n]):
                    hold = n
                    break
        safe = len(self.text) - hold
        out, self.released = self.text[self.released:safe], safe
        return out

    def finish(self) -> str:
        out, self.released = self.text[self.released:], len(self.text)
        return out


class ModelDrafter:
    """Drafts by sampling the draft GGUF autoregressively from its warped distribution p.

    Its KV cache holds a prefix of the committed tokens; ``propose`` first decodes the pending ones
    (one, or two after an all-accepted step, where the last draft was never decoded).
    """

    deterministic = False

    def __init__(self, model: LlamaModelContext, n_vocab: int, p_min: float) -> None:
        self.model = model
        self.n_logits = min(n_vocab, model.n_vocab)  # never propose an id the verifier lacks
        self.p_min = p_min

    def reset(self, prompt: Sequence[int]) -> bool:
        """Decode the prompt but its last token. False (nothing decoded) when the draft cannot take
        the prompt (see ``room``): the verifier then decodes alone."""
        self.model.clear()
        if self.room(prompt) < 1:
            return False
        if len(prompt) > 1:
            self.model.decode(prompt[:-1], n_logits=0)
        return True

    def room(self, committed: Sequence[int]) -> int:
        """Most tokens it can draft now: it decodes the pending tokens plus d_1 .. d_{k-1}.
        0 when it cannot follow the committed tokens: a pending token is an id its vocabulary
        lacks (an unused padding id of a longer verifier vocabulary, sampled by the verifier)."""
        if max(committed[self.model.n_past:], default=0) >= self.model.n_vocab:
            return 0
        return self.model.n_ctx - len(committed) + 1

    def propose(self, committed: list[int], k: int, sampler: NativeSampler, probs: np.ndarray,
                tokens: np.ndarray) -> int:
        """Draft up to ``k`` tokens into ``tokens`` (int32 [>=k]) and their distributions into
        ``probs`` (float32 [>=k, V]); return how many."""
        row = self.model.decode(committed[self.model.n_past:], n_logits=1)[0]
        n = 0
        for i in range(k):
            d = sampler.draft(row[:self.n_logits], probs[i])
            if self.p_min > 0.0 and probs[i].max() < self.p_min:
                break  # the draft is unsure: verify what we have (llama.cpp --draft-p-min)
            tokens[i] = d
            n += 1
            if i == k - 1 or self.model.is_eog(d):
                break  # nothing to propose after the last draft or an end-of-generation token
            row = self.model.decode([d], n_logits=1)[0]
        return n

    def rollback(self, n_keep: int) -> None:
        self.model.truncate(min(self.model.n_past, n_keep))


class NgramDrafter:
    """Prompt-lookup drafting: find the latest earlier occurrence of the last n committed tokens
    (n from ``n_max`` down to ``n_min``) and propose the tokens that followed it.

    A deterministic proposal: p is one-hot at each drafted token, so Cactus accepts with
    probability h[n] and SpS with q[n].
    """

    deterministic = True

    def __init__(self, n_max: int, n_min: int) -> None:
        self.n_max, self.n_min = n_max, n_min

    def reset(self, prompt: Sequence[int]) -> bool:
        return True

    def room(self, committed: Sequence[int]) -> int:
        return 1 << 30  # no context of its own

    def propose(self, committed: list[int], k: int, sampler: NativeSampler, probs: np.ndarray,
                tokens: np.ndarray) -> int:
        L = len(committed)
        for n in range(min(self.n_max, L - 1), self.n_min - 1, -1):
            pattern = committed[L - n:]
            for start in range(L - n - 1, -1, -1):
                if committed[start:start + n] == pattern:
                    follow = committed[start + n:start + n + k]
                    tokens[:len(follow)] = follow
                    return len(follow)
        return 0

    def rollback(self, n_keep: int) -> None:
        pass


class SpeculativeDecoder:
    """Speculative decoding of a verifier GGUF with a draft GGUF (or the verifier alone).

    Example::

        with SpeculativeDecoder("verifier.gguf", "draft.gguf", DecoderConfig(k=4)) as dec:
            result = dec.generate("def add(a, b):", n_predict=64, seed=1)
            print(result.text, result.stats.mean_accepted_length)

    Raises ModelLoadError (backend) for a file llama.cpp cannot load, VocabMismatchError for an
    incompatible pair, ValueError for bad options.
    """

    def __init__(self, verifier_path: str | Path, draft_path: str | Path | None = None,
                 config: DecoderConfig = DecoderConfig()) -> None:
        if config.needs_draft_model and draft_path is None:
            raise ValueError(f"method {config.method!r} with the model drafter needs a draft model; "
                             "give one, or use the ngram drafter or method none")
        self.config = config
        self.verifier: LlamaModelContext | None = None
        self.draft: LlamaModelContext | None = None
        self.last_result: GenerationResult | None = None
        try:
            self.verifier = LlamaModelContext(verifier_path, config.verifier_model, config.context)
            if draft_path is not None:
                self.draft = LlamaModelContext(draft_path, config.draft_model,
                                               config.draft_context or config.context)
                check_vocab_compatible(self.verifier, self.draft)
        except BaseException:
            self.close()
            raise
        self._buffers_k = 0

    def _buffers(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Draft distributions p, float32 [k, V], and drafted ids, int32 [k]; grown on demand.
        Columns past the draft's vocabulary stay 0 (it never proposes those ids)."""
        if k > self._buffers_k:
            self._draft_probs = np.zeros((k, self.verifier.n_vocab), dtype=np.float32)
            self._draft_tokens = np.zeros(k, dtype=np.int32)
            self._buffers_k = k
        return self._draft_probs, self._draft_tokens

    def _drafter(self, cfg: DecoderConfig):
        if cfg.acceptance is None:
            return None
        if cfg.drafter == "ngram":
            return NgramDrafter(cfg.ngram_max, cfg.ngram_min)
        if self.draft is None:
            raise ValueError("the model drafter needs a draft model: this decoder was built without one")
        return ModelDrafter(self.draft, self.verifier.n_vocab, cfg.draft_p_min)

    # -- lifetime ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Free both models (contexts first). Idempotent."""
        for m in (self.draft, self.verifier):
            if m is not None:
                m.close()
        self.draft = self.verifier = None

    def __enter__(self) -> "SpeculativeDecoder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- prompts -----------------------------------------------------------------------------------

    def tokenize(self, prompt: str) -> list[int]:
        """The verifier's token ids for ``prompt``; both contexts receive exactly these ids.

        BOS is added when the model wants it, unless the text already starts with the BOS token
        (as a rendered chat template often does): never a double BOS.
        """
        ver = self.verifier
        bos_text = ver.token_text(ver.bos).decode("utf-8", "replace") if ver.bos >= 0 else ""
        add_special = not (ver.add_bos and bos_text and prompt.startswith(bos_text))
        return ver.tokenize(prompt, add_special=add_special, parse_special=True)

    def format_chat(self, messages: Sequence[dict]) -> str:
        """Render ``messages`` ([{"role": ..., "content": ...}]) with the GGUF's chat template."""
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        template = self.verifier.chat_template()
        if not template:
            raise ValueError(f"{self.verifier.path.name} has no chat template "
                             "(tokenizer.chat_template): use a plain prompt instead of chat")
        formatter = Jinja2ChatFormatter(
            template=template,
            eos_token=self.verifier.token_text(self.verifier.eos).decode("utf-8", "replace"),
            bos_token=self.verifier.token_text(self.verifier.bos).decode("utf-8", "replace"),
        )
        return formatter(messages=list(messages)).prompt

    # -- generation --------------------------------------------------------------------------------

    def generate(self, prompt: str | Sequence[int], *, n_predict: int = 128,
                 stop: Sequence[str] = (), seed: int | None = None,
                 on_text: Callable[[str], None] | None = None) -> GenerationResult:
        """Generate up to ``n_predict`` tokens after ``prompt`` (text or token ids).

        ``on_text`` receives each piece of text as soon as it is final (whole UTF-8 characters,
        never part of a stop string). ``seed`` None draws a random seed (reported in the result).
        Raises ContextLengthError when the prompt does not fit in n_ctx, ValueError for bad
        arguments, NonFiniteLogitsError if a model produces NaN/inf logits.
        """
        gen = self._run(prompt, n_predict, stop, seed)
        try:
            while True:
                piece = next(gen)
                if on_text is not None and piece:
                    on_text(piece)
        except StopIteration as done:
            self.last_result = done.value
            return done.value

    def stream(self, prompt: str | Sequence[int], *, n_predict: int = 128,
               stop: Sequence[str] = (), seed: int | None = None) -> Iterator[str]:
        """Yield text pieces as they become final; then the full result is in ``self.last_result``.

        Same arguments and errors as :meth:`generate`.
        """
        self.last_result = None
        self.last_result = yield from self._run(prompt, n_predict, stop, seed)

    def chat(self, messages: Sequence[dict], **kwargs) -> GenerationResult:
        """:meth:`generate` on ``messages`` rendered with the GGUF chat template."""
        return self.generate(self.format_chat(messages), **kwargs)

    def _run(self, prompt, n_predict: int, stop: Sequence[str], seed: int | None):
        if self.verifier is None:
            raise ValueError("decoder is closed")
        if not isinstance(n_predict, int) or n_predict < 1:
            raise ValueError(f"n_predict must be an integer >= 1, got {n_predict!r}")
        if seed is None or seed < 0:
            seed = secrets.randbits(32)
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not tokens:
            raise ValueError("the prompt is empty: give some text to continue")
        ver, cfg = self.verifier, self.config
        bad = next((t for t in tokens if not 0 <= t < ver.n_vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the verifier's vocabulary "
                             f"[0, {ver.n_vocab})")
        drafter = self._drafter(cfg)
        if len(tokens) >= ver.n_ctx:
            raise ContextLengthError(
                f"the prompt is {len(tokens)} tokens but n_ctx is {ver.n_ctx}: raise -c/--ctx-size "
                "or shorten the prompt")

        sampler = NativeSampler(ver.n_vocab, cfg.sampling,
                                cfg.acceptance or AcceptanceParams(method="sps"), seed)
        draft_probs, draft_tokens = self._buffers(cfg.k)
        stats = GenerationStats(n_prompt_tokens=len(tokens))
        stopper = _StopMatcher(stop)
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        out_tokens: list[int] = []
        stop_reason, message = "length", ""

        # Prefill everything but the last prompt token; it opens the first verification batch.
        t0 = time.perf_counter()
        ver.clear()
        if len(tokens) > 1:
            ver.decode(tokens[:-1], n_logits=0)
        if drafter is not None and not drafter.reset(tokens):
            drafter = None  # the prompt does not fit the draft's context: the verifier alone
        stats.prefill_seconds = time.perf_counter() - t0

        committed = list(tokens)
        t_start = time.perf_counter()
        finished = False
        while not finished:
            remaining = n_predict - len(out_tokens)
            # The verifier holds committed[:-1]; the batch adds the pending token plus k drafts,
            # so k <= n_ctx - len(committed). Below 0 not even the pending token fits.
            room_v = ver.n_ctx - len(committed)
            if room_v < 0:
                stop_reason, message = "length", f"context full (n_ctx={ver.n_ctx})"
                break
            # ... and the batch must fit one llama_decode: k <= n_batch - 1
            k = min(cfg.k, remaining - 1, room_v, ver.n_batch - 1)
            if drafter is not None and k > 0 and drafter.room(committed) < 1:
                drafter = None  # the draft's context is full: the verifier alone from here on
            if drafter is not None and k > 0:
                k = min(k, drafter.room(committed))

            # -- draft ----------------------------------------------------------------------------
            td = time.perf_counter()
            n_drafted = 0
            if drafter is not None and k > 0:
                n_drafted = drafter.propose(committed, k, sampler, draft_probs, draft_tokens)
                if n_drafted < cfg.draft_min:
                    n_drafted = 0  # too short to be worth a batched verification
            tv = time.perf_counter()
            stats.draft_seconds += tv - td

            # -- verify: one decode of the pending token(s) + the drafts, logits for k+1 rows -------
            batch = committed[ver.n_past:] + draft_tokens[:n_drafted].tolist()
            logits = ver.decode(batch, n_logits=n_drafted + 1)
            ta = time.perf_counter()
            stats.verify_seconds += ta - tv

            # -- accept ---------------------------------------------------------------------------
            if cfg.acceptance is None:
                n_acc, nxt = 0, sampler.sample(logits[0])
            else:
                p = None if n_drafted == 0 or drafter.deterministic else draft_probs[:n_drafted]
                res = sampler.verify(p, draft_tokens[:n_drafted], logits)
                n_acc, nxt = res.n_accepted, res.next_token
                stats.n_evaluated += res.n_evaluated
                stats.kl_sum += res.kl_sum
                stats.kl_max = max(stats.kl_max, res.kl_max)
            stats.accept_seconds += time.perf_counter() - ta
            stats.n_steps += 1
            stats.n_drafted += n_drafted
            stats.n_accepted += n_acc

            # -- commit ---------------------------------------------------------------------------
            emitted = draft_tokens[:n_acc].tolist() + [nxt]
            n_before = len(committed)
            for tok in emitted:
                if ver.is_eog(tok):
                    stop_reason, finished = "eos", True
                    break
                committed.append(tok)
                out_tokens.append(tok)
                piece = stopper.feed(utf8.decode(ver.token_to_piece(tok)))
                if piece:
                    yield piece
                if stopper.hit:
                    stop_reason, finished = "stop", True
                    break
                if len(out_tokens) >= n_predict:
                    stop_reason, finished = "length", True
                    break
            # Roll back: the verifier keeps t_0 .. t_{L-1} + the accepted drafts (the new pending
            # token is decoded next step); the draft keeps at most that much. After a stop inside
            # the block (EOS, stop string, length) that is committed[:-1]: nothing past the end.
            keep = min(n_before + n_acc, len(committed) - 1)
            ver.truncate(min(ver.n_past, keep))
            if drafter is not None:
                drafter.rollback(keep)

        if not stopper.hit:  # bytes of an unfinished character, then any text held for stop strings
            piece = stopper.feed(utf8.decode(b"", final=True))
            if not stopper.hit:
                piece += stopper.finish()
            if piece:
                yield piece
        stats.decode_seconds = time.perf_counter() - t_start
        stats.n_tokens = len(out_tokens)
        if stop_reason == "length" and not message:
            message = f"n_predict={n_predict} reached" if len(out_tokens) >= n_predict else ""
        return GenerationResult(text=stopper.text, tokens=out_tokens, stop_reason=stop_reason,
                                stats=stats, seed=seed, message=message)
