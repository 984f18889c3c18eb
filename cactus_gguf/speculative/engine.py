"""The engine: two loaded models, their KV caches, and the generations they serve.

Dimension letters: k = draft length (tokens proposed per step), V = verifier vocabulary size.

Glossary (see ``native/cactus_native.h`` for the acceptance math):
  committed   the prompt plus every emitted token; both KV caches hold a prefix of it
  pending     committed tokens a context has not decoded yet (usually just the newest one)
  drafted     tokens the drafter proposed this step, d_1 .. d_k
  accepted    the drafted tokens the acceptance rule kept, d_1 .. d_AL  (AL = acceptance length)
  residual    the token emitted at the first rejection; bonus: the token emitted when all k pass

One step (step.py, ``run_step``): the drafter proposes d_1 .. d_k, one verifier decode scores
them, the native helper accepts a prefix and emits the residual / bonus token, both KV caches roll
back to the committed prefix. The models are loaded by loading.py.

Between requests the caches keep what they hold: a new request reuses the longest common prefix of
its prompt with it (llama-server's ``cache_prompt``) and decodes only the rest. With
``n_parallel`` N the contexts hold N sequences, the slots (slots.py): each generation runs on one,
so N of them keep their own caches. One step runs at a time (it takes the engine's lock), so
generations interleave step by step; one whose slot's caches were used by another in between
(more interleaved streams than slots) gets them restored to its own committed tokens first.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import secrets
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import EngineBusyError, InputError
from ..llama import Context, ContextOptions
from ..options import (BY_NAME, LoadOptions, Request, check_speculation, constraint_of,
                       runnable_drafters, validate_pairing)
from ..options.rule import applies, rule_words
from ..sampling import AcceptanceParams, NativeSampler, acceptance_params, sampling_params
from ..sampling.native import pack_allowed
from ..sampling.constraints import Constraint, tokenizer_for
from ..stats import GenerationResult
from ..prompting.templates import enable_thinking, is_builtin
from ..prompting.text import continued_text, render_chat
from ..prompting.tokens import prompt_tokens
from .device import device_top_k
from .factory import make_drafter
from .mtp import MtpHead
from ..registry.cache import cache_dir
from .costs import SlowStepWatch, forward_costs
from .loading import load_pair
from .logprobs import LogprobReader
from .policy import CostAwareDraftLength, FixedDraftLength, ForwardCosts
from .prefill import prefill, resync
from .scope import CodeScope, chat_opening, gap_words, opens_chat_answer
from .session import Chunk, Progress, Session
from .slots import Slot, Slots
from .together import batchable, steps_together
from .step import run_step
from .stream import Stream
from .vocab import bias_row, end_set, eog_ids, logit_biases, token_pieces

__all__ = ["Engine", "Stream", "Chunk"]


log = logging.getLogger(__name__)


class Engine:
    """A verifier GGUF and an optional draft GGUF, loaded once, serving generations.

    Example::

        with Engine("verifier.gguf", "draft.gguf", LoadOptions(n_ctx=4096)) as eng:
            r = eng.generate("def add(a, b):", n_predict=64, seed=1, k=4, temperature=0.6)
            print(r.text, r.stats.mean_accepted_length, r.stats.n_prompt_tokens_reused)

    Args:
        verifier, draft: GGUF paths or models.yaml names (fetched on first use); draft None:
            method none or the ngram drafter only.
        load: context size, batch, threads, GPU offload, flash attention (cactus_gguf/options/).
        defaults: the Request each call starts from (its keyword overrides apply on top).
        draft_context: the draft's own context options, when they should differ (e.g. a smaller
            n_ctx); default: the verifier's.
        repack: weight repacking for both models, overriding ``load.repack`` (None = that).
        load_mtp: load the verifier's next-n (MTP) layers and its MTP context, so that requests
            may use ``drafter="mtp"``; None = when the defaults' drafter is mtp.
    Raises:
        ModelLoadError (a file llama.cpp cannot load; ``load_mtp`` with a verifier without
            next-n layers), VocabMismatchError (a draft that shares no
            text token with the verifier; other vocabularies are served:
            docs/models.md "Foreign drafts"),
        KvCacheTooLargeError, InputError (bad options). Nothing stays loaded after an error.
    """

    def __init__(self, verifier: str | Path, draft: str | Path | None = None,
                 load: LoadOptions | None = None, *, defaults: Request | None = None,
                 draft_context: ContextOptions | None = None, repack: bool | None = None,
                 load_mtp: bool | None = None) -> None:
        self.load_options = load if load is not None else LoadOptions()
        self.defaults = defaults if defaults is not None else Request()
        self.verifier: Context | None
        self.draft: Context | None
        mtp = self.defaults.drafter == "mtp" if load_mtp is None else load_mtp
        self.verifier, self.draft, self.pair_vocab = load_pair(
            verifier, draft, self.load_options, draft_context=draft_context, repack=repack,
            load_mtp=mtp)
        # --chat-template / --chat-template-file: every chat prompt and tool call is rendered
        # with it; --reasoning: the enable_thinking each is rendered with (prompting/templates.py)
        model = self.verifier.model
        model.template_override = self.load_options.template
        template = model.chat_template()
        self.enable_thinking = enable_thinking(
            self.load_options.reasoning, template,
            bos=model.token_text(model.bos).decode("utf-8", "replace"),
            eos=model.token_text(model.eos).decode("utf-8", "replace"))
        log.debug("chat template: %s; --reasoning %s: enable_thinking %s",
                  f"built-in {template}" if is_builtin(template) else "Jinja" if template
                  else "none", self.load_options.reasoning, self.enable_thinking)
        for role, c in (("verifier", self.verifier), ("draft", self.draft)):
            if c is not None:
                log.debug("%s: %s", role, c.model.placement.summary())
        #: the verifier's MTP head (``--drafter mtp`` at load), kept in step with it (mtp.py)
        self.mtp: MtpHead | None = None
        n_seq = self.verifier.n_seq
        if mtp:
            try:
                head = Context(self.verifier.model, dataclasses.replace(
                    draft_context or ContextOptions(
                        n_ctx=self.verifier.n_ctx, n_batch=self.verifier.n_batch,
                        n_threads=self.verifier.n_threads, flash_attn=self.load_options.flash_attn),
                    n_ctx=self.verifier.n_ctx * (1 if self.verifier.kv_unified else n_seq),
                    n_parallel=n_seq, kv_unified=self.verifier.kv_unified, mtp=True))
                self.mtp = MtpHead(self.verifier, head)
            except BaseException:
                self.close()
                raise
        #: the slots (slots.py): slot 0 holds the contexts above, the others their sequences
        self.slots = Slots([Slot(0, self.verifier, self.draft, self.mtp)] + [
            Slot(i, self.verifier.sequence(i), self.draft and self.draft.sequence(i),
                 self.mtp and MtpHead(self.verifier.sequence(i), self.mtp.head.sequence(i)))
            for i in range(1, n_seq)])
        self._slot_lock = threading.Lock()  # a slot's choice and its marking as taken
        cannot = next((name for name, c in (("VERIFIER", self.verifier), ("DRAFT", self.draft))
                        if c is not None and not c.can_shift), None)
        if self.load_options.context_shift and cannot is not None:
            self.close()  # llama-server turns it off there; here it is refused in one line
            raise InputError(f"{{context_shift}} needs KV caches that can shift, and {cannot} "
                             "keeps a recurrent state (or a cache llama.cpp cannot shift): drop "
                             "{context_shift}", param="context_shift")
        if self.pair_vocab is not None:
            try:  # a pair the defaults' draft_vocab cannot use is refused now, not per request
                method = self.pair_vocab.method_for(self.defaults.draft_vocab)
                if method != "same" and self.defaults.draft_window:
                    raise InputError(
                        f"{{draft_window}} works only with a draft of the verifier's vocabulary, "
                        f"and this pair drafts with {{draft_vocab}} {method}: set "
                        "{draft_window} 0", param="draft_window", options=("draft_vocab",))
            except BaseException:
                self.close()
                raise
        self._lock = threading.RLock()
        # the vocabulary tables built on first use (end sets, grammar tokenizer, vocabulary maps):
        # read-only model data, so a caller that will not wait is not held by a generation
        self._cache_lock = threading.Lock()
        self._costs: ForwardCosts | None = None  # -k auto: probed on first use
        self._costs_k = 0
        self.probe: dict | None = None  # how forward_costs got them
        self._slow_steps = SlowStepWatch(self.verifier.n_threads)  # steps far above those costs
        self._grammar_tokenizer = None  # llguidance's view of the vocabulary: on first use
        self._pieces: list[str] | None = None  # every id's text: on first use (protected ends)
        self._end_masks: dict[tuple[str, ...], np.ndarray] = {}  # packed end sets by stop strings
        self._eogs: tuple[int, ...] | None = None  # end-of-generation ids: on first ignore_eos
        self._opening: str | None = None  # the text that opens a chat answer (scope.py)

    # -- lifetime ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Free both models (contexts first). Idempotent."""
        for slot in getattr(self, "slots", ()):
            if slot.mtp is not None:
                slot.mtp.close()
        if getattr(self, "mtp", None) is not None:
            self.mtp.close()
            self.mtp.head.close()  # a context of the verifier's model: before it (every
            self.mtp = None  # sequence's with it)
        for c in (self.draft, self.verifier):
            if c is not None:
                c.close()
        self.draft = self.verifier = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(self) -> None:
        """Empty every slot's KV caches (the next request reuses nothing)."""
        with self._lock:
            for slot in self.slots:
                for c in slot.contexts():
                    c.clear()
                slot.owner = None

    def save_cache(self, path: str | Path, id_slot: int = 0) -> tuple[int, int]:
        """Write slot ``id_slot``'s verifier cache (its KV cache and any recurrent state: what
        the next request's prefix reuse reads) and its tokens to ``path``, llama.cpp's state
        file. Returns (tokens, bytes) written. Raises DecodeError when llama.cpp writes nothing,
        InputError for a slot out of range."""
        with self._lock:
            self._live()
            ctx = self.slots.get(id_slot).verifier
            return ctx.n_past, ctx.save_file(path)

    def restore_cache(self, path: str | Path, id_slot: int = 0) -> tuple[int, int]:
        """Replace slot ``id_slot``'s verifier cache by the one :meth:`save_cache` wrote (the
        same model and n_ctx), so the next request that starts with its tokens reuses them; the
        slot's draft cache (and an MTP head's) is emptied: it decodes its prompt again. Returns
        (tokens, bytes) read. Raises DecodeError for a file llama.cpp cannot read (the slot's
        caches are then empty), InputError for a slot out of range."""
        with self._lock:
            self._live()
            slot = self.slots.get(id_slot)
            for c in slot.contexts()[1:]:
                c.clear()
            slot.owner = None
            n = slot.verifier.load_file(path)
            return slot.verifier.n_past, n

    def erase_cache(self, id_slot: int = 0) -> int:
        """Empty slot ``id_slot``'s caches (llama-server's slot erase); the tokens it held.
        InputError for a slot out of range."""
        with self._lock:
            self._live()
            slot = self.slots.get(id_slot)
            n = slot.verifier.n_past
            for c in slot.contexts():
                c.clear()
            slot.owner = None
            return n

    # -- prompts -----------------------------------------------------------------------------------

    def tokenize(self, prompt: str) -> list[int]:
        """The verifier's token ids for ``prompt``; both contexts receive exactly these ids.

        BOS is added when the model wants it, unless the text already starts with the BOS token
        (as a rendered chat template often does): never a double BOS.
        """
        m = self._live().model
        bos_text = m.token_text(m.bos).decode("utf-8", "replace") if m.bos >= 0 else ""
        add_special = not (m.add_bos and bos_text and prompt.startswith(bos_text))
        return m.tokenize(prompt, add_special=add_special, parse_special=True)

    def template_variables(self, kwargs: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """What every chat template is given beside the messages: ``enable_thinking`` (from
        ``--reasoning``; none under ``auto`` for a template without the switch), then a
        request's ``chat_template_kwargs`` (llama-server's field: a key it names wins).
        InputError for a key that is the request's own (messages, tools, add_generation_prompt,
        bos_token, eos_token)."""
        out = {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}
        taken = sorted(set(kwargs or {}) & {"messages", "tools", "add_generation_prompt",
                                            "bos_token", "eos_token"})
        if taken:
            raise InputError(f"chat_template_kwargs cannot set {taken[0]}: the request's own "
                             "fields give it", param="chat_template_kwargs")
        return {**out, **(kwargs or {})}

    def format_chat(self, messages: Sequence[dict], *, add_generation_prompt: bool = True,
                    continue_final_message: bool | None = None,
                    template_kwargs: Mapping[str, Any] | None = None) -> str:
        """Render ``messages`` ([{"role": ..., "content": ...}]) with the GGUF's chat template.

        A final assistant message is continued (prefilled: the messages before it with the
        assistant's turn opened, then its text, left open), as llama-server does, unless
        ``continue_final_message`` is False (then it is closed like the others);
        ``add_generation_prompt`` False ends the prompt with the last message instead of
        opening the assistant's turn; ``template_kwargs``: a request's ``chat_template_kwargs``
        (:meth:`template_variables`)."""
        m = self._live().model
        last_is_assistant = bool(messages) and messages[-1].get("role") == "assistant"
        if last_is_assistant and len(messages) > 1 and messages[-2].get("role") == "assistant":
            raise InputError("the last two messages are both the assistant's: merge them, or "
                             "put the user's turn between them", param="messages")
        prefill = last_is_assistant and continue_final_message is not False
        variables = self.template_variables(template_kwargs)
        if continue_final_message and not last_is_assistant:
            raise InputError("continue_final_message needs the last message to be the "
                             "assistant's (the text to continue)", param="continue_final_message")

        def render(ms, opened: bool) -> str:
            return render_chat(m.chat_template(), ms, model_name=m.path.name,
                               eos=m.token_text(m.eos).decode("utf-8", "replace"),
                               bos=m.token_text(m.bos).decode("utf-8", "replace"),
                               add_generation_prompt=opened, variables=variables)

        if prefill:
            return render(messages[:-1], True) + continued_text(messages[-1].get("content"))
        return render(messages, add_generation_prompt)

    @property
    def drafters(self) -> tuple[str, ...]:
        """The drafters a request may name here: ``ngram``; ``model`` and ``hybrid`` with a draft
        model; ``mtp`` with the verifier's MTP head (options/speculation.py)."""
        return runnable_drafters(draft_model=self.draft is not None, mtp=self.mtp is not None)

    # -- generation --------------------------------------------------------------------------------

    def request(self, request: Request | None = None, **overrides) -> Request:
        """``request`` (default: the engine's defaults) with ``overrides`` applied, validated."""
        base = request if request is not None else self.defaults
        if not isinstance(base, Request):
            raise InputError(f"request must be a Request, got {type(base).__name__}")
        return base.replace(**overrides) if overrides else base

    def generate(self, prompt: str | Sequence[int], request: Request | None = None, *,
                 on_text: Callable[[str], None] | None = None, wait: bool = True,
                 cancel: Callable[[], bool] | None = None, **overrides) -> GenerationResult:
        """Generate after ``prompt`` (text, or token ids) with ``request`` and keyword overrides
        (any Request field: ``n_predict=64, seed=1, stop="return", k=4, method="sps"`` ...).

        ``on_text`` receives each piece of text as soon as it is final. ``wait`` False raises
        EngineBusyError instead of waiting while another generation holds the engine.
        ``cancel``: asked between steps and between the ``n_batch`` chunks of the prompt, and on
        a CPU inside a chunk's decode too (llama.cpp's abort callback, on the calling thread:
        llama/abort.py); when it returns true the generation ends there with ``stop_reason``
        "cancelled".
        Raises InputError (bad arguments, empty prompt), ContextLengthError (the prompt does not
        fit n_ctx), EngineError (llama.cpp or the native helper failed).
        """
        session = self._begin(prompt, self.request(request, **overrides), cancel)
        with self._acquire(wait):
            while not session.finished:
                if cancel is not None and session.started and cancel():
                    session.stop("cancelled", "cancelled by the caller")
                    session.finish()
                    break
                chunk = self._advance(session)
                if chunk is not None and on_text is not None:
                    on_text(chunk.text)
        return session.result

    def stream(self, prompt: str | Sequence[int], request: Request | None = None, *,
               wait: bool = True, cancel: Callable[[], bool] | None = None,
               progress: Callable[[Progress], None] | None = None,
               **overrides) -> Stream:
        """Like :meth:`generate`, as an iterator of text pieces (a :class:`Stream`; its ``result``
        is set once exhausted). Arguments are checked here; the engine is taken per step, so
        other callers may run between two pieces. ``wait`` applies to the first step.
        ``progress``: called with a :class:`Progress` as the prompt is processed (before each
        ``n_batch`` chunk, then once it is all in the caches), in the thread that iterates."""
        session = self._begin(prompt, self.request(request, **overrides), cancel)
        session.progress = progress
        return Stream(self._chunks(session, wait), session)

    def step_streams(self, streams: Sequence[Stream]) -> list:
        """One engine call for each of ``streams`` (the server's round over its slots): a prompt
        not yet processed, else one step; the steps of generations on separate KV-only slots
        share one verification batch (together.py), and a prompt beside others is processed
        ``n_batch`` tokens a call (prefill.py). Per stream, in order: its Chunk or None (as
        :meth:`Stream.steps`), :data:`DONE` once it has ended (``result`` set), or the exception
        that ended it."""
        out: list = [None] * len(streams)
        with self._lock:
            chunk = self._live().n_batch if len(streams) > 1 else None
            together = [i for i, st in enumerate(streams) if batchable(st._session)]
            if len(together) < 2:
                together = []
            for i, st in enumerate(streams):
                if i not in together:
                    out[i] = st._call(lambda s: self._advance(s, chunk))
            if together:
                for i, got in zip(together, steps_together(
                        self, [streams[i]._session for i in together])):
                    out[i] = got
        for i, st in enumerate(streams):
            if st._session.finished and not isinstance(out[i], BaseException) and out[i] is None:
                out[i] = st._ended()
        return out

    def chat(self, messages: Sequence[dict], request: Request | None = None, **kwargs
             ) -> GenerationResult:
        """:meth:`generate` on ``messages`` rendered with the GGUF chat template."""
        return self.generate(self.format_chat(messages), request, **kwargs)

    # -- internals ---------------------------------------------------------------------------------

    def _live(self) -> Context:
        if self.verifier is None:
            raise InputError("the engine is closed")
        return self.verifier

    @contextlib.contextmanager
    def _acquire(self, wait: bool):
        if not self._lock.acquire(blocking=wait):
            raise EngineBusyError("the engine is serving another generation: wait for it to end "
                                  "(wait=True) or use another engine")
        try:
            yield
        finally:
            self._lock.release()

    def _chunks(self, session: Session, wait: bool):
        first = True
        try:
            while not session.finished:
                with self._acquire(wait or not first):
                    chunk = self._advance(session)
                first = False
                yield chunk
        finally:  # finished, or abandoned (the stream closed): the slot is free
            session.slot.release(session)
        return session.result

    def _begin(self, prompt, req: Request, cancel: Callable[[], bool] | None = None) -> Session:
        """Check the prompt and the request against this engine; a Session ready to prefill."""
        ver = self._live()
        validate_pairing(self.load_options, req)
        check_speculation(req, drafters=self.drafters)  # a drafter these models run
        tokens = prompt_tokens(prompt, self.tokenize, ver.n_vocab, ver.n_ctx, len(self.slots))
        acceptance = acceptance_params(req, self._end_mask(req))
        if acceptance is not None and (req.spec_synth_rates or req.spec_synth_len):
            # synthetic acceptance runs no rule (drafters.py SynthDrafter); under greedy's
            # parameters the drafts draw from their own stream, so all-refusing coins leave the
            # verifier alone's tokens whatever the method named
            acceptance = dataclasses.replace(acceptance, method="greedy")
        seed = req.seed if req.seed >= 0 else secrets.randbits(32)
        with self._slot_lock:  # a free slot is taken by one generation only
            slot = self.slots.choose(tokens, req.id_slot)
            placeholder = _Taken()
            slot.take(placeholder)
        try:
            drafter = self._make_drafter(req, seed, slot) if acceptance is not None else None
        except BaseException:
            slot.release(placeholder)
            raise
        bias = bias_row(self.logit_biases(req), ver.n_vocab)
        sampler = NativeSampler(ver.n_vocab, sampling_params(req),
                                acceptance or AcceptanceParams(method="sps"), seed,
                                draft_temp=req.draft_temp, logit_bias=bias)
        try:
            session = Session(tokens, req, seed, sampler, drafter, self._policy(req, drafter),
                              n_ctx=ver.n_ctx, constraint=self._constraint(req),
                              should_stop=cancel)
        except BaseException:
            slot.release(placeholder)
            raise
        session.slot = slot
        with self._slot_lock:
            if not slot.busy or slot._active() is placeholder:
                slot.take(session)
        session.context_shift = self.load_options.context_shift
        # how a draft model's tokens reached the verifier: None where draft_vocab does not apply
        # (no draft model: ngram, mtp), as every answer reports it (options/rule.py)
        session.stats.draft_vocab = (drafter.vocab_method if drafter is not None
                                     and applies(BY_NAME["draft_vocab"], req) else None)
        if self._scoped_gap(req, acceptance, tokens):  # the top gap in code only (scope.py)
            session.scope = CodeScope(acceptance)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("rule: %s%s", rule_words(req), gap_words(acceptance, session.scope))
        if req.n_probs is not None:  # log-probabilities of the emitted tokens (logprobs.py)
            session.logprobs = LogprobReader(sampler, req.n_probs, req.post_sampling_probs,
                                             ver.model.token_to_piece)
        session.device_top_k = device_top_k(req, slot.verifier, drafter, logprobs=req.n_probs is not None,
                                            grammar=session.constraint is not None,
                                            biased=bias is not None)
        return session

    def logit_biases(self, req: Request) -> list[tuple[int, float]]:
        """``req``'s logit bias as (token id, bias) entries on the verifier's vocabulary
        (vocab.py, logit_biases: texts tokenized, ``ignore_eos``'s -inf on every
        end-of-generation id, found once per engine); [] for none."""
        if req.logit_bias is None and not req.ignore_eos:
            return []
        ver = self._live()
        if req.ignore_eos:
            with self._cache_lock:
                if self._eogs is None:
                    self._eogs = eog_ids(ver.model)
        return logit_biases(ver.model, req.logit_bias, req.ignore_eos, self._eogs or (),
                            ver.n_vocab)

    def _make_drafter(self, req: Request, seed: int, slot: Slot):
        """The drafter ``req`` drafts with on ``slot``'s sequences of this engine's models
        (factory.py)."""
        self._live()
        return make_drafter(req, seed, verifier=slot.verifier, draft=slot.draft, mtp=slot.mtp,
                            pair_vocab=self.pair_vocab, lock=self._cache_lock)

    def _scoped_gap(self, req: Request, acceptance: AcceptanceParams | None,
                    tokens: Sequence[int]) -> bool:
        """Whether the request's top gap applies in code only here: Cactus with a finite top gap,
        ``top_gap_scope`` code, and a prompt that opens a chat answer (it ends with the chat
        template's generation prompt; a raw or prefilled completion is code throughout)."""
        if (acceptance is None or acceptance.method != "cactus" or req.top_gap_scope != "code"
                or math.isinf(acceptance.top_gap)):
            return False
        model = self._live().model
        return opens_chat_answer(tokens, self._chat_opening(),
                                 lambda ids: model.detokenize(ids, special=True))

    def _chat_opening(self) -> str:
        """The text that opens a chat answer after a user's message (scope.py); "" when the
        model has no chat template. Rendered once."""
        if self._opening is None:
            probe = "cactus-gguf probe"
            try:
                rendered = self.format_chat([{"role": "user", "content": probe}])
            except InputError:  # no chat template: no prompt opens a chat answer
                rendered = ""
            self._opening = chat_opening(rendered, probe)
        return self._opening

    def _end_mask(self, req: Request) -> np.ndarray | None:
        """The packed end set (uint32 [ceil(V / 32)]) of a Cactus request with ``protect_ends``:
        end-of-generation tokens and the starts of its stop strings (speculative/vocab.py); None when
        the request does not protect ends. Built once per set of stop strings."""
        if not req.speculates or req.method != "cactus" or req.protect_ends == "off":
            return None
        ver = self._live()
        key = tuple(req.stop)
        with self._cache_lock:
            if key not in self._end_masks:
                if self._pieces is None:
                    self._pieces = token_pieces(ver.model)
                self._end_masks[key] = pack_allowed(end_set(ver.model, self._pieces, key,
                                                            ver.n_vocab))
            return self._end_masks[key]

    def _constraint(self, req: Request) -> Constraint | None:
        """The grammar state of a constrained request (grammar, json_schema, json_object)."""
        spec = constraint_of(req)
        if spec is None:
            return None
        ver = self._live()
        with self._cache_lock:
            if self._grammar_tokenizer is None:
                self._grammar_tokenizer = tokenizer_for(ver.model)
        return Constraint(spec, self._grammar_tokenizer, ver.n_vocab, ver.model.is_eog)

    def _policy(self, req: Request, drafter):
        """The draft-length policy: the cost-aware one under ``k="auto"`` (its channels: the
        draft model, prompt lookup, or both for the hybrid drafter), else the fixed k."""
        if req.k == "auto" and drafter is not None:
            channels = {"model": ("model",), "ngram": ("ngram",), "mtp": ("model",),
                        "hybrid": ("model", "ngram")}[req.drafter]
            return CostAwareDraftLength(req.k_max, self.forward_costs(req.k_max), req.draft_min,
                                        req.draft_p_min, channels=channels)
        return FixedDraftLength.from_request(req)

    def forward_costs(self, k_max: int) -> ForwardCosts:
        """What a verifier batch of 1 .. k_max + 1 tokens and a draft token cost on this machine
        (``-k auto``'s cost model, speculative/costs.py): from the cache directory when probed before
        for these models, build, threads and context size, else probed now (both KV caches are
        emptied). ``probe`` tells how: {"cached": bool, "seconds": float} (None before)."""
        with self._lock:  # the probe decodes on both contexts
            if self._costs is None or self._costs_k < k_max:
                t0 = time.perf_counter()
                self._costs, cached = forward_costs(self, k_max, cache_dir())
                self._slow_steps.expect(self._costs)
                self.probe = {"cached": cached, "seconds": time.perf_counter() - t0}
                self._costs_k = k_max
                self.slots[0].owner = None  # the probe emptied slot 0's caches
            return self._costs

    def _advance(self, session: Session, chunk: int | None = None) -> Chunk | None:
        """Under the lock: process the prompt (``chunk``: at most that many of its tokens this
        call: prefill.py), or run one step; the text released."""
        self._live()
        slot = session.slot
        try:
            if not session.started:
                prefill(session, chunk)
                return None
            if slot.owner is not session:
                resync(session)
            pieces = run_step(slot.verifier, session, self._slow_steps)
            if session.finished:
                pieces += session.finish()
            return session.chunk(pieces)
        except BaseException:
            slot.owner = None  # the caches may hold part of a step: restore before any reuse
            session.finished = True
            raise


class _Taken:
    """A slot's ``active`` while the generation that took it is being made (never finished)."""

    finished = False
