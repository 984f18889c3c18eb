"""How many tokens to draft: the draft-length policy of a generation.

A policy answers two questions for the engine's step (step.py), each a pure query (it changes
nothing, so the order and number of the calls do not matter):
- ``plan(limit)``: what this step may draft, as a DraftPlan (draft.py), a value the drafter
  reads: the draft length k (at most ``limit``: the room left in both contexts, in one
  llama_decode batch, and before n_predict), the proposers allowed (the draft model
  ``"model"``, prompt lookup ``"ngram"``), llama.cpp's ``--draft-p-min``, and whether another
  drafted token still pays given the drafted ones' own probabilities;
- ``keep(draft)``: how many tokens of the Draft to verify, a prefix (0 drops a draft shorter
  than llama.cpp's ``--draft-min``: that step is verifier-only).
Its state changes in two places: ``prompt_processed(seconds, draft_behind)``, once, after the
prompt (how long it took, and how many tokens the draft model has yet to decode before it can
draft: a cost-aware policy defers the draft's prompt until drafting is worth it), and
``observe(draft, outcome)``, once per step, with the draft the drafter proposed (grammar-checked,
before ``keep``) and the step's StepOutcome (stats/generation.py); adaptive policies learn from
them and decide what the next step may do.
"""
from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .draft import SOURCES, Draft, DraftPlan

if TYPE_CHECKING:
    from ..stats import StepOutcome

log = logging.getLogger(__name__)

__all__ = ["DraftPolicy", "FixedDraftLength", "ForwardCosts", "AcceptanceModel",
           "CostAwareDraftLength"]


class DraftPolicy(Protocol):
    def plan(self, limit: int) -> DraftPlan: ...

    def keep(self, draft: Draft) -> int: ...

    def observe(self, draft: Draft, outcome: StepOutcome) -> None: ...

    def prompt_processed(self, seconds: float, draft_behind: int) -> None: ...


class FixedDraftLength:
    """Draft ``k`` tokens every step (fewer only when ``limit`` says so), as llama.cpp's
    ``--draft-max``; ``draft_p_min`` / ``draft_min`` as llama.cpp's options of those names."""

    def __init__(self, k: int, draft_min: int = 0, draft_p_min: float = 0.0) -> None:
        self.k, self.draft_min, self.draft_p_min = k, draft_min, draft_p_min

    def plan(self, limit: int) -> DraftPlan:
        return DraftPlan(max(0, min(self.k, limit)), frozenset(SOURCES), self.draft_p_min)

    def keep(self, draft: Draft) -> int:
        return len(draft) if len(draft) >= self.draft_min else 0

    def observe(self, draft: Draft, outcome: StepOutcome) -> None:
        pass

    def prompt_processed(self, seconds: float, draft_behind: int) -> None:
        pass

    @classmethod
    def from_request(cls, request) -> "FixedDraftLength":
        return cls(request.draft_ceiling, request.draft_min, request.draft_p_min)


# -------------------------------------------------------------------------------------------------
# The cost-aware policy (-k auto)
# -------------------------------------------------------------------------------------------------

class ForwardCosts:
    """What one forward pass costs on this machine, in seconds, corrected online.

    ``verify(b)``: the verifier's decode of a batch of b tokens with logits for every row
    (piecewise-linear between the probed batch sizes, extrapolated from the last two);
    ``draft``: the draft model's decode of one token. Each observation moves the estimate of its
    batch size a fifth of the way (an exponential moving average; one observation counts at most
    1.5x or 1/1.5 the current estimate, so a single hiccup cannot swing it) and scales every other
    estimate by the same factor, the draft's too while it is not being measured: what changes
    between the probe and a generation (the context's length, the machine's load, thermal
    limits) slows both models alike, and decisions that depend only on the ratios of the probed
    costs (whether drafting could ever pay) stay put while only the verifier runs.

    Args:
        verify_seconds: {batch size: seconds}, at least {1: ...}.
        draft_seconds: per token; 0 for a drafter without a model (n-gram lookup).
    """

    RATE = 0.2

    def __init__(self, verify_seconds: dict[int, float], draft_seconds: float) -> None:
        if 1 not in verify_seconds:
            raise ValueError("verify_seconds needs the cost of a 1-token batch")
        self._v = {int(b): float(s) for b, s in verify_seconds.items()}
        self._sizes = sorted(self._v)
        self.draft = float(draft_seconds)

    def verify(self, b: int) -> float:
        v = self._v.get(b)
        if v is not None:
            return v
        sizes = self._sizes
        i = bisect.bisect_left(sizes, b)  # sizes[i - 1] < b < sizes[i]
        if i == len(sizes):  # beyond the largest probed size: the slope of the last two
            if len(sizes) == 1:
                return self._v[sizes[0]] * b
            a, c = sizes[-2], sizes[-1]
            return self._v[c] + (b - c) * (self._v[c] - self._v[a]) / (c - a)
        lo, hi = sizes[max(0, i - 1)], sizes[i]
        if lo > b:  # below the smallest probed size
            lo = hi
        return self._v[lo] + (b - lo) * (self._v[hi] - self._v[lo]) / (hi - lo) if hi != lo \
            else self._v[lo]

    def observe_verify(self, b: int, seconds: float, draft_too: bool = True) -> None:
        """Move size b's estimate towards ``seconds`` and every other size (with ``draft_too``,
        the draft's cost too) by the same factor; sizes the policy stops using would otherwise
        keep their probed values."""
        current = self.verify(b)  # an unprobed size starts from its interpolation
        new = current + self.RATE * (self._clip(seconds, current) - current)
        if current > 0:
            f = new / current
            for size in self._v:
                self._v[size] *= f
            if draft_too:
                self.draft *= f
        if b not in self._v:
            bisect.insort(self._sizes, b)
        self._v[b] = new

    def observe_draft(self, seconds_per_token: float) -> None:
        self.draft += self.RATE * (self._clip(seconds_per_token, self.draft) - self.draft)

    @staticmethod
    def _clip(seconds: float, current: float) -> float:
        return min(max(seconds, current / 1.5), current * 1.5) if current > 0 else seconds

    def as_dict(self) -> dict:
        return {"verify": {str(b): s for b, s in sorted(self._v.items())}, "draft": self.draft}


class AcceptanceModel:
    """P(a drafted token is accepted | its draft probability p[n]), learned in this generation.

    Ten buckets of p[n] ([0, 0.1), ..., [0.9, 1]); each bucket's estimate is its acceptance count
    shrunk towards the overall rate with a weight of 2 pseudo-observations, and the overall rate
    towards ``prior`` with 2: (acc_b + 2 m) / (n_b + 2), m = (acc + 2 prior) / (n + 2). A bucket
    the draft's confidence lands in for the first time starts at the overall rate. Updated with
    every verification, for the acceptance rule in use (so Cactus's higher acceptance counts).
    """

    N_BUCKETS = 10

    def __init__(self, prior: float = 0.5) -> None:
        self.prior = prior
        self.acc = [0] * self.N_BUCKETS
        self.n = [0] * self.N_BUCKETS
        self.mean = prior  # the overall rate, shrunk: kept up to date by update

    @classmethod
    def bucket(cls, p: float) -> int:
        """The bucket of a draft probability p."""
        return min(cls.N_BUCKETS - 1, max(0, int(p * cls.N_BUCKETS)))

    def estimate(self, p: float) -> float:
        b = self.bucket(p)
        return (self.acc[b] + 2.0 * self.mean) / (self.n[b] + 2.0)

    def update(self, draft_probs: list[float], n_accepted: int) -> None:
        """The drafted tokens' p[n] of one step, in order, and how many were accepted: the first
        n_accepted were, the next (if any) was rejected, the rest were never tested."""
        for i, p in enumerate(draft_probs[:n_accepted + 1]):
            b = self.bucket(p)
            self.n[b] += 1
            self.acc[b] += i < n_accepted
        self.mean = (sum(self.acc) + 2.0 * self.prior) / (sum(self.n) + 2.0)


class _Channel:
    """One kind of proposal under the cost-aware policy: the draft model's (``model``) or prompt
    lookup's (``ngram``: free to propose, p one-hot), with its own acceptance model and its own
    pause / re-probe schedule.

    A step's verdict for a channel: "on" (drafting pays), "off" (it cannot win even with every
    draft accepted: never pay for it), "paused" (off until its re-probe) or "probe" (draft and
    verify the ceiling, to measure its acceptance again)."""

    def __init__(self, acceptance: AcceptanceModel) -> None:
        self.acceptance = acceptance
        self.paused_steps = 0
        self.backoff = CostAwareDraftLength.EXPLORE_MIN

    def advance(self, verdict: str, measured: bool) -> None:
        """The schedule after a step with this verdict; ``measured``: this channel proposed the
        step's (non-empty) draft."""
        lo, hi = CostAwareDraftLength.EXPLORE_MIN, CostAwareDraftLength.EXPLORE_MAX
        if verdict == "on":
            self.paused_steps, self.backoff = 0, lo
        elif verdict == "paused":
            self.paused_steps += 1
        elif verdict == "probe":
            self.paused_steps, self.backoff = 0, min(hi, 2 * self.backoff)  # less often each time
            if not measured:  # the other channel proposed, or this one found nothing: take the
                self.backoff = max(lo, self.backoff // 2)  # probe back, the next step probes again
                self.paused_steps = self.backoff


@dataclass(frozen=True)
class _WorthMore:
    """CostAwareDraftLength's rule for drafting another token, for one step (its DraftPlan's
    ``worth_more``): given drafted tokens' own probabilities p (float32 [j]), with A_j, E_j and
    T_j as the class docstring defines them, draft another when its expected gain A_j · m per
    its marginal cost c_d + c_v(j+2) − c_v(j+1) is at least the step's rate so far E_j / T_j
    (always below ``draft_min``).

    estimates: the acceptance model's estimate per bucket of p (AcceptanceModel). mean: m.
    draft: c_d, seconds. verify: c_v(b) for b = 0 .. k + 2, seconds.
    """

    estimates: tuple[float, ...]
    mean: float
    draft: float
    verify: tuple[float, ...]
    draft_min: int

    def __call__(self, p: np.ndarray) -> bool:
        j = len(p)
        if j < self.draft_min:
            return True
        a_run, e = 1.0, 1.0
        for x in p:
            a_run *= self.estimates[AcceptanceModel.bucket(float(x))]  # A_j: the first j accepted
            e += a_run  # E_j
        c_v = self.verify
        rate = e / (j * self.draft + c_v[j + 1])  # E_j / T_j
        gain = a_run * self.mean
        cost = self.draft + c_v[j + 2] - c_v[j + 1]
        return cost <= 0 or gain / cost >= rate


@dataclass(frozen=True)
class _UpTo:
    """A DraftPlan's ``worth_more`` that drafts exactly ``n`` tokens (a probe's length)."""

    n: int

    def __call__(self, p: np.ndarray) -> bool:
        return len(p) < self.n


class CostAwareDraftLength:
    """Draft as many tokens as pay for themselves, 0 when none do (``-k auto``).

    The rule (expected tokens per step: Leviathan et al. 2023, "Fast Inference from Transformers
    via Speculative Decoding", sec. 3; here with a per-position acceptance instead of one α):
    with a_i the estimated acceptance of the i-th drafted token (AcceptanceModel, from its p[n])
    and A_j = a_1 ... a_j the chance the first j are all accepted, a step that verifies j drafts
    yields in expectation E_j = 1 + A_1 + ... + A_j tokens and costs T_j = j c_d + c_v(j + 1)
    (ForwardCosts: draft per token, verifier batch of j + 1). The verifier alone yields 1 token per
    c_v(1). Each step:
      - drafting stops after token j when the next one cannot pay for itself: its expected gain
        A_j · m (m = the overall acceptance rate) per its marginal cost c_d + c_v(j+2) − c_v(j+1)
        is below the step's rate so far, E_j / T_j, or j reaches the ceiling ``k``;
      - of the j drafted, the first j* = argmax_{0 <= i <= j} E_i / (j c_d + c_v(i + 1)) are
        verified (the j drafts are paid for whichever prefix is; j* = 0 is a verifier-only step);
      - before drafting, the step is verifier-only when even the best length with every a_i = m,
        max_j E_j / T_j, is below 1 / c_v(1). Such a pause is re-probed after 4, 8, ... 64
        verifier-only steps, unless even every draft accepted (m = 1) would beat the verifier
        alone by less than 10% (PROBE_MARGIN): then the draft model is never used, not even to
        catch up on the prompt, which a re-probe must decode first (the draft prefills lazily
        under this policy).
      - a probe drafts and verifies the length that is best at the acceptance halfway between
        the break-even m0 (the lowest m at which some length beats the verifier alone) and 1:
        the length drafting would use if the probe showed it pays, usually far below the
        ceiling (a probe at the ceiling costs ``k`` draft tokens and a k+1-row verification
        for the same verdict);
      - exploring never takes more than EXPLORE_SHARE (3%) of the answer's time: a probe is
        made only when the net seconds probes have cost so far (each probe's catch-up of the
        draft on the tokens it has not seen, its drafting and its verification, less the
        verifier-alone time of the tokens it yielded) plus the next probe's worst case (nothing
        accepted, the catch-up estimated at the draft's per-token cost in the verifier's
        largest probed batch, ``c_d · c_v(k+1) / ((k+1) c_v(1))``) stay within that share of
        the seconds spent so far (the prompt's processing and every step). So where drafting
        does not pay, the answer takes at most about 3% longer than the verifier alone's, and a
        short answer after a long prompt never pays for the draft's prefill of that prompt.
    Prompt lookup (the ``ngram`` channel: the n-gram drafter, and the hybrid drafter's lookup
    steps) follows the same rule with c_d = 0 and its own acceptance model and pause schedule
    (its proposals are one-hot, so every a_i is its overall rate): on a machine where a batch of
    j + 1 costs about j + 1 single decodes even a free, always-accepted lookup cannot pay, and it
    stays off. Costs are corrected from each step's measured draft and verify times.

    Args:
        k: the ceiling, the longest draft a step may make.
        costs: ForwardCosts of this machine and these models.
        draft_min, draft_p_min: as FixedDraftLength (llama.cpp's options).
        channels: the proposals the drafter makes: ("model",), ("ngram",) or both (hybrid).
        acceptance, lookup_acceptance: the channels' AcceptanceModels to start from (default:
            the prior 0.5).

    What a step may do (each channel's verdict, see _Channel) is decided at construction and by
    each ``observe``, for the step that follows; the queries only read it.
    """

    EXPLORE_MIN, EXPLORE_MAX = 4, 64
    PROBE_MARGIN = 1.1  # a re-probe needs perfect acceptance to beat the verifier alone by 10%
    EXPLORE_SHARE = 0.03  # the most of the answer's seconds that probes may cost, net

    def __init__(self, k: int, costs: ForwardCosts, draft_min: int = 0,
                 draft_p_min: float = 0.0, acceptance: AcceptanceModel | None = None,
                 channels: tuple[str, ...] = ("model",),
                 lookup_acceptance: AcceptanceModel | None = None) -> None:
        self.k, self.costs = k, costs
        self.draft_min, self.draft_p_min = draft_min, draft_p_min
        self.acceptance = acceptance or AcceptanceModel()  # the draft model's
        self.lookup_acceptance = lookup_acceptance or AcceptanceModel()
        self._channels = {"model": _Channel(self.acceptance),
                          "ngram": _Channel(self.lookup_acceptance)}
        self._channels = {name: self._channels[name] for name in channels}
        self._drafted_last = False  # the draft model drafted in the previous step
        self.n_paused = 0  # verifier-only steps the policy chose (for the stats)
        self.elapsed = 0.0  # seconds of the answer so far: the prompt and every step
        self.explored = 0.0  # net seconds the probes cost (never below 0)
        self.draft_behind = 0  # tokens the draft model has yet to decode before it drafts
        self._verdicts = self._plan()  # {channel: verdict} of the coming step
        self._explain({})

    # -- the rule ---------------------------------------------------------------------------------

    def _draft_cost(self, kind: str) -> float:
        return self.costs.draft if kind == "model" else 0.0

    def _rate(self, accept: list[float], sunk: float | None = None,
              kind: str = "model") -> list[float]:
        """E_j / T_j for j = 0 .. len(accept) (j = 0: the verifier alone), T_j = j c_d +
        c_v(j + 1); with ``sunk`` (drafts already paid for) T_j = sunk + c_v(j + 1)."""
        c, c_d = self.costs, self._draft_cost(kind)
        draft = (lambda j: sunk) if sunk is not None else (lambda j: j * c_d)
        rates, e, a_run = [1.0 / (draft(0) + c.verify(1))], 1.0, 1.0
        for j, a in enumerate(accept, 1):
            a_run *= a
            e += a_run
            rates.append(e / (draft(j) + c.verify(j + 1)))
        return rates

    def _pays(self, m: float, margin: float = 1.0, kind: str = "model") -> bool:
        rates = self._rate([m] * self.k, kind=kind)
        return max(rates[1:], default=0.0) > margin * rates[0]

    def probe_length(self, kind: str = "model") -> int:
        """The draft length a probe of channel ``kind`` drafts and verifies: the best length
        (argmax_j E_j / T_j) at the acceptance halfway between the break-even m0 and 1, m0 the
        lowest acceptance at which some length beats the verifier alone (bisection, 1e-3)."""
        lo, hi = 0.0, 1.0
        if not self._pays(hi, kind=kind):
            return self.k
        while hi - lo > 1e-3:
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if self._pays(mid, kind=kind) else (mid, hi)
        rates = self._rate([(hi + 1.0) / 2] * self.k, kind=kind)
        return max(1, int(np.argmax(rates[1:])) + 1)

    def probe_cost(self, kind: str = "model") -> float:
        """Seconds a probe of channel ``kind`` can cost beyond the verifier alone at worst (no
        draft accepted): the draft's catch-up on the ``draft_behind`` tokens it has not seen (the
        model channel's), its drafts and the verification's extra rows."""
        c, j = self.costs, self.probe_length(kind)
        catch_up = 0.0
        if kind == "model" and self.draft_behind:
            b = self.k + 1  # per token in the verifier's largest probed batch, scaled to the draft
            catch_up = self.draft_behind * c.draft * c.verify(b) / (b * c.verify(1))
        return catch_up + j * self._draft_cost(kind) + c.verify(j + 1) - c.verify(1)

    def _affordable(self, kind: str) -> bool:
        """Whether a probe of ``kind`` now keeps the net exploration within EXPLORE_SHARE of the
        answer's seconds, even if it is wasted."""
        worst = self.probe_cost(kind)
        return self.explored + worst <= self.EXPLORE_SHARE * (self.elapsed + worst)

    def _verdict(self, kind: str) -> str:
        """The coming step's verdict for one channel (see _Channel), from its schedule and the
        exploration budget."""
        ch = self._channels[kind]
        if self._pays(ch.acceptance.mean, kind=kind):
            return "on"
        if not self._pays(1.0, self.PROBE_MARGIN, kind=kind):
            return "off"  # drafting cannot win here (by the margin): never pay for the draft
        due = ch.paused_steps + 1 > ch.backoff
        return "probe" if due and self._affordable(kind) else "paused"

    def _plan(self) -> dict[str, str]:
        return {kind: self._verdict(kind) for kind in self._channels} if self.k >= 1 else {}

    # -- the DraftPolicy protocol: queries ---------------------------------------------------------

    def draft_length(self, limit: int) -> int:
        if limit < 1 or not any(self.uses(kind) for kind in self._verdicts):
            return 0
        if all(self._verdicts[kind] == "probe" for kind in self._verdicts if self.uses(kind)):
            return min(max(self.probe_length(kind) for kind in self._verdicts
                           if self.uses(kind)), limit)
        return min(self.k, limit)

    def uses(self, source: str) -> bool:
        return self._verdicts.get(source) in ("on", "probe")

    def plan(self, limit: int) -> DraftPlan:
        return DraftPlan(self.draft_length(limit),
                         frozenset(kind for kind in self._verdicts if self.uses(kind)),
                         self.draft_p_min, self._worth_more())

    def more(self, p: np.ndarray) -> bool:
        """After drafting tokens whose own draft probabilities are ``p`` (float32 [j]), whether
        to draft another (what the coming step's plan says)."""
        worth = self._worth_more()
        return worth is None or worth(p)

    def _worth_more(self) -> "_WorthMore | _UpTo":
        """The coming step's rule for drafting another token, frozen (a probe of the draft
        model: up to its probe length, whatever the plan's k allows prompt lookup)."""
        if self._verdicts.get("model") == "probe":
            return _UpTo(self.probe_length("model"))
        a, c = self.acceptance, self.costs
        return _WorthMore(tuple((a.acc[b] + 2.0 * a.mean) / (a.n[b] + 2.0)
                                for b in range(a.N_BUCKETS)),
                          a.mean, c.draft, tuple(c.verify(b) for b in range(self.k + 3)),
                          self.draft_min)

    def keep(self, draft: Draft) -> int:
        n, kind = len(draft), "ngram" if draft.lookup else "model"
        if self._verdicts.get(kind) == "probe":  # a probe verifies its whole draft
            return n if n >= self.draft_min else 0
        if draft.lookup:
            accept = [self.lookup_acceptance.mean] * n
        else:
            accept = [self.acceptance.estimate(float(x)) for x in draft.p] if n else []
        # the n drafts are paid for whichever prefix is verified: rate_i = E_i / (n c_d + c_v(i+1))
        sunk = n * self._draft_cost(kind)
        best = int(np.argmax(self._rate(accept, sunk=sunk, kind=kind)))
        return best if best >= self.draft_min else 0

    # -- the DraftPolicy protocol: the step's outcome ----------------------------------------------

    def prompt_processed(self, seconds: float, draft_behind: int) -> None:
        """The prompt took ``seconds``; the draft model has ``draft_behind`` of its tokens yet to
        decode (deferred: the first step that drafts decodes them). Both count in whether a
        probe is affordable."""
        self.elapsed += max(0.0, seconds)
        self.draft_behind = max(0, int(draft_behind))
        before, self._verdicts = self._verdicts, self._plan()
        self._explain(before)

    def observe(self, draft: Draft, outcome: StepOutcome) -> None:
        """Advance each channel's schedule by the step's verdict, count its seconds (and a
        probe's net cost), correct the costs from its times, update the proposing channel's
        acceptance model, then decide the next step's verdicts. ``draft``: what the drafter
        proposed (grammar-checked, before ``keep``)."""
        source = ("ngram" if draft.lookup else "model") if len(draft) else None
        seconds = (outcome.catch_up_seconds + outcome.draft_seconds + outcome.verify_seconds
                   + outcome.accept_seconds)
        self.elapsed += seconds
        yielded = outcome.n_drafts_used + 1
        if source is not None and self._verdicts.get(source) == "probe":
            # what the probe cost beyond the verifier alone's time for the tokens it yielded
            self.explored = max(0.0, self.explored + seconds - yielded * self.costs.verify(1))
        self.draft_behind = 0 if source == "model" else self.draft_behind + yielded
        for kind, verdict in self._verdicts.items():
            self._channels[kind].advance(verdict, measured=kind == source)
        if self._verdicts and not any(self.uses(kind) for kind in self._verdicts):
            self.n_paused += 1
        model_drafted = source == "model"
        measured = model_drafted and self._drafted_last  # else its first decode caught a backlog up
        n, n_acc = outcome.n_drafted, outcome.verdict.n_accepted
        self.costs.observe_verify(n + 1, outcome.verify_seconds, draft_too=not measured)
        if measured:
            self.costs.observe_draft(outcome.draft_seconds / len(draft))
        if n and source == "ngram":
            self.lookup_acceptance.update([1.0] * n, n_acc)
        elif n:
            self.acceptance.update([float(x) for x in draft.p[:n]], n_acc)
        self._drafted_last = model_drafted
        before, self._verdicts = self._verdicts, self._plan()
        self._explain(before)

    def _explain(self, before: dict[str, str]) -> None:
        """Log each channel whose verdict changed, with what decided it (-v)."""
        if before == self._verdicts or not log.isEnabledFor(logging.DEBUG):
            return
        c = self.costs
        for kind, verdict in self._verdicts.items():
            if before.get(kind) == verdict:
                continue
            m = self._channels[kind].acceptance.mean
            best = self._rate([m] * self.k, kind=kind)
            j = int(np.argmax(best))
            log.debug("draft length (%s): %s; acceptance %.2f, verifier %.1f ms for 1 row and "
                      "%.1f ms for %d, draft %.1f ms a token: best k %d at %.1f tokens/s against "
                      "%.1f alone%s", kind, {"on": "drafting up to k=%d" % self.k,
                                             "off": "never drafting (it cannot pay here)",
                                             "paused": "verifier alone for now",
                                             "probe": "one probe step at k=%d" % self.k}[verdict],
                      m, c.verify(1) * 1e3, c.verify(self.k + 1) * 1e3, self.k + 1,
                      self._draft_cost(kind) * 1e3, j, best[j], best[0],
                      "" if not before else f" (was {before.get(kind)})")
