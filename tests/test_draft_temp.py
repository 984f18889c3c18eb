"""The draft's own temperature (``--draft-temp``, docs/maths.md "The draft's temperature").

``NativeSampler.draft`` warps the draft's logits with the request's top-k / top-p / min-p at
``draft_temp`` (0 = greedy: one-hot at the lowest-id argmax) and writes exactly the law it drew the
token from, so every acceptance rule receives the real proposal: SpS emits q (the verifier's law at
the request's warps) whatever the draft's temperature, Cactus emits the exact mixture law of that
proposal (``NativeSampler.emitted_law``, equal to the NumPy reference).

Statistical tests: Pearson's chi-square goodness of fit at significance ALPHA = 0.001 (a test fails
when its p-value is <= ALPHA) with fixed seeds, so each is deterministic; the controls show that a
wrong law is rejected at the same sample size. Dimension letters: V = vocabulary size, k = draft
length.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from cactus_gguf.errors import InputError
from cactus_gguf.options import Request
from cactus_gguf.sampling import (AcceptanceParams, NativeSampler, SamplingParams, draft_sampling,
                                  draft_sampling_params, sampling_params)
from cactus_gguf.sampling import reference as ref

from support.harness import StepLog, assert_one_line_error, make_engine, run_cli

ALPHA = 0.001  # significance level of every chi-square test below
N_MC = 30_000  # draft-verify steps per histogram

# One position, V = 8. The request's warps: T = 0.8 and top-k 6 (tokens 0 and 7 are cut from both
# rows, so the draft's warps must keep the request's top-k). The draft's top token (2) is the
# verifier's second (q[2] ~ 0.31, the top is 3), so the three draft temperatures give clearly
# different proposals, and Cactus at delta 0.5 moves its law well away from q.
V = 8
REQUEST = SamplingParams(temperature=0.8, top_k=6, top_p=1.0, min_p=0.0)
DRAFT_LOGITS = np.log(np.array([0.02, 0.10, 0.40, 0.15, 0.12, 0.09, 0.08, 0.04])).astype(np.float32)
VERIFIER_LOGITS = np.log(np.array([[0.03, 0.06, 0.28, 0.33, 0.05, 0.12, 0.09, 0.04]] * 2)
                         ).astype(np.float32)  # row 1: the bonus position (k = 1)
DRAFT_TEMPS = [0.0, 0.3, None]  # None: the request's temperature (0.8), today's behaviour
RULES = {"sps": AcceptanceParams("sps"), "cactus": AcceptanceParams("cactus", 0.5, "taylor")}


def sampler(method: str, draft_temp: float | None, seed: int = 1) -> NativeSampler:
    return NativeSampler(V, REQUEST, RULES[method], seed, draft_temp=draft_temp)


def effective(draft_temp: float | None) -> float:
    return REQUEST.temperature if draft_temp is None else draft_temp


def draft_law(draft_temp: float | None) -> np.ndarray:
    """The reference's draft row at the draft's warps: float64 [V]."""
    return ref.warp(DRAFT_LOGITS, V, effective(draft_temp), REQUEST.top_k, REQUEST.top_p,
                    REQUEST.min_p).astype(np.float64)


def emitted_histogram(s: NativeSampler, n: int = N_MC, verify_probs=None):
    """Counts of the token the first position emits (the accepted draft or the residual) over n
    independent k = 1 steps, each drafted with ``s.draft`` and verified with ``s.verify``; and of
    the drafted tokens. ``verify_probs``: float32 [1, V] passed to verify instead of the row the
    draft wrote (the controls: a proposal law that is not the one drawn from)."""
    row = np.zeros((1, V), np.float32)
    token = np.zeros(1, np.int32)
    emitted, drafted = np.zeros(V, np.int64), np.zeros(V, np.int64)
    for _ in range(n):
        token[0] = s.draft(DRAFT_LOGITS, row[0])
        r = s.verify(row if verify_probs is None else verify_probs, token, VERIFIER_LOGITS)
        emitted[token[0] if r.n_accepted == 1 else r.next_token] += 1
        drafted[token[0]] += 1
    return emitted, drafted


def chi_square_pvalue(counts: np.ndarray, law: np.ndarray) -> float:
    """Pearson chi-square p-value of ``counts`` against ``law``; a count outside the law's support
    fails the test outright; a point mass holding every count is a p-value of 1."""
    law = law / law.sum()
    support = law > 0
    assert counts[~support].sum() == 0, "a token outside the law's support was emitted"
    if support.sum() == 1:
        return 1.0
    return stats.chisquare(counts[support], law[support] * counts.sum()).pvalue


# ---- the sampler: what draft() writes and draws --------------------------------------------------

@pytest.mark.parametrize("draft_temp", DRAFT_TEMPS)
def test_draft_writes_the_law_it_draws_from_at_the_draft_temperature(draft_temp):
    s = sampler("sps", draft_temp)
    assert s.sampling == REQUEST  # the verifier's warps stay the request's
    assert s.draft_sampling == SamplingParams(effective(draft_temp), 6, 1.0, 0.0)
    np.testing.assert_allclose(s.warp(VERIFIER_LOGITS[0]),
                               ref.warp(VERIFIER_LOGITS[0], V, 0.8, 6, 1.0, 0.0), atol=1e-7)
    row = np.zeros(V, np.float32)
    u = s.peek_uniforms(2)
    s.draft(DRAFT_LOGITS, row)
    assert s.peek_uniforms(1)[0] == u[1]  # one uniform per draft, at any temperature
    np.testing.assert_allclose(row, draft_law(draft_temp), atol=1e-7)
    assert row[0] == row[7] == 0.0  # the request's top-k 6 holds for the draft too
    _, drafted = emitted_histogram(s, n=6000)
    assert chi_square_pvalue(drafted, draft_law(draft_temp)) > ALPHA  # drawn from that row


def test_draft_temperature_zero_is_one_hot_at_the_lowest_argmax():
    s = NativeSampler(V, REQUEST, RULES["sps"], 0, draft_temp=0.0)
    row = np.zeros(V, np.float32)
    tied = np.array([0.0, 2.0, 5.0, 1.0, 5.0, 0.0, 0.0, 0.0], np.float32)  # argmax 2 and 4
    for _ in range(50):
        assert s.draft(tied, row) == 2
        assert row.tolist() == [0, 0, 1, 0, 0, 0, 0, 0]
    # as the greedy warp of the request's sampler (temperature 0): the same tie rule
    greedy = NativeSampler(V, SamplingParams(0.0, 6, 1.0, 0.0), RULES["sps"], 0)
    assert greedy.warp(tied).tolist() == row.tolist()
    mask = np.zeros(1, np.uint32)
    mask[0] = 0b11110000  # tokens 4..7 allowed: the argmax among them
    assert s.draft(tied, row, allowed=mask) == 4 and row[4] == 1.0


def test_no_draft_temperature_is_todays_sampler_token_for_token():
    """draft_temp None (the default) and draft_temp = the request's temperature give the same
    drafts, rows and verification results as a sampler built without it."""
    rng = np.random.default_rng(3)
    samplers = [NativeSampler(V, REQUEST, RULES["cactus"], 9),
                NativeSampler(V, REQUEST, RULES["cactus"], 9, draft_temp=None),
                NativeSampler(V, REQUEST, RULES["cactus"], 9, draft_temp=0.8)]
    assert samplers[1].draft_sampling is REQUEST
    for _ in range(200):
        dl = (rng.standard_normal((3, V)) * 2).astype(np.float32)
        vl = (rng.standard_normal((4, V)) * 2).astype(np.float32) + np.vstack([dl, dl[:1]])
        outs = []
        for s in samplers:
            rows = np.zeros((3, V), np.float32)
            toks = np.array([s.draft(dl[i], rows[i]) for i in range(3)], np.int32)
            outs.append((toks.tolist(), rows.tobytes(), s.verify(rows, toks, vl), s.sample(vl[0])))
        assert outs[0] == outs[1] == outs[2]


@pytest.mark.parametrize("bad", [-1.0, -1e-9, math.nan, math.inf, "0.5", True])
def test_a_draft_temperature_that_is_not_a_finite_number_at_least_zero_is_refused(bad):
    for make in (lambda: NativeSampler(V, REQUEST, RULES["sps"], 0, draft_temp=bad),
                 lambda: Request(draft_temp=bad),
                 lambda: draft_sampling(REQUEST, bad)):
        with pytest.raises(InputError, match=r"^draft_temp must be "):
            make()
    assert draft_sampling(REQUEST, 0).temperature == 0.0


def test_a_request_derives_both_warps():
    r = Request(temperature=0.6, top_k=20, top_p=0.95, min_p=0.0, draft_temp=0.0)
    assert sampling_params(r) == SamplingParams(0.6, 20, 0.95, 0.0)
    assert draft_sampling_params(r) == SamplingParams(0.0, 20, 0.95, 0.0)
    assert draft_sampling_params(r.replace(draft_temp=None)) == sampling_params(r)
    assert (r.draft_temperature, r.replace(draft_temp=None).draft_temperature) == (0.0, 0.6)
    assert r.replace(drafter="ngram").draft_temperature is None  # nothing samples a draft
    assert r.replace(method="none").draft_temperature is None


# ---- the emitted law: SpS emits q, Cactus its exact law, at every draft temperature --------------

@pytest.mark.parametrize("draft_temp", DRAFT_TEMPS, ids=lambda t: f"draft_temp={t}")
@pytest.mark.parametrize("method", ["sps", "cactus"])
def test_the_emitted_token_follows_the_rule_law_at_every_draft_temperature(method, draft_temp):
    s = sampler(method, draft_temp)
    q = s.warp(VERIFIER_LOGITS[0])
    p = draft_law(draft_temp).astype(np.float32)
    acc = RULES[method]
    law = s.emitted_law(p, q).probs
    want = ref.emitted_first_token_distribution(p, q, acc.method, acc.delta, acc.solver)
    np.testing.assert_allclose(law, want, atol=1e-6)  # the C law is the reference's
    if method == "sps":
        np.testing.assert_allclose(law, q, atol=1e-6)  # SpS emits q for any proposal
    if draft_temp == 0.0:  # the one-hot proposal, given as None + the drafted token: the same law
        np.testing.assert_allclose(s.emitted_law(None, q, token=2).probs, law, atol=1e-7)
    emitted, _ = emitted_histogram(s)
    assert chi_square_pvalue(emitted, law) > ALPHA


def test_the_chi_square_tests_above_can_fail():
    """At N_MC steps the statistic separates the laws the tests tell apart (Pearson statistic
    N * sum (a - b)^2 / b far above the 0.001 critical value of 5 degrees of freedom, 20.5), and a
    sampler whose verify received another law than the one drawn from is caught."""
    q = sampler("sps", None).warp(VERIFIER_LOGITS[0]).astype(np.float64)
    cactus = {t: sampler("cactus", t).emitted_law(draft_law(t).astype(np.float32),
                                                  q.astype(np.float32)).probs
              for t in DRAFT_TEMPS}
    support = q > 0
    for a, b in [(cactus[0.0], q), (cactus[None], q), (cactus[0.0], cactus[None]),
                 (cactus[0.3], cactus[None])]:
        assert N_MC * ((a[support] - b[support]) ** 2 / b[support]).sum() > 200
    # drafting greedily but telling verify the proposal was the request-temperature row: SpS's
    # output is then not q, and the test rejects it
    wrong = draft_law(None).astype(np.float32).reshape(1, V)
    emitted, _ = emitted_histogram(sampler("sps", 0.0), verify_probs=wrong)
    assert chi_square_pvalue(emitted, q) < ALPHA


# ---- the option on the command line and the server -----------------------------------------------

MISSING = "/nonexistent/dir/model.gguf"


@pytest.mark.parametrize("value,message", [
    ("-1", "--draft-temp must be in [0, inf) (0 = greedy), got -1"),
    ("nan", "--draft-temp must be a number in [0, inf) (0 = greedy), got nan"),
    ("inf", "--draft-temp must be in [0, inf) (0 = greedy), got inf"),
])
def test_a_bad_draft_temperature_is_a_one_line_error_before_any_model_loads(value, message):
    r = run_cli("run", MISSING, MISSING, "-p", "hello", "--draft-temp", value)  # paths missing:
    assert_one_line_error(r, message)  # the option is refused first


def test_the_server_takes_draft_temp_in_its_speculative_object():
    pytest.importorskip("pydantic")
    from cactus_gguf.server.schemas import CompletionRequest, to_request

    base = Request()
    body = CompletionRequest.model_validate({"prompt": "x", "speculative": {"draft_temp": 0.0}})
    assert to_request(base, body).draft_temp == 0.0
    assert to_request(base, CompletionRequest(prompt="x")).draft_temp is None
    body = CompletionRequest.model_validate({"prompt": "x", "speculative": {"draft_temp": -1.0}})
    with pytest.raises(InputError) as e:
        to_request(base, body)
    assert e.value.param == "speculative.draft_temp"


# ---- end to end on tiny models -------------------------------------------------------------------

PROMPT = "the cat sat on"


def run_json(*args: str) -> dict:
    r = run_cli("run", *args, "-p", PROMPT, "-c", "256", "-t", "1", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_draft_temperature_zero_end_to_end_on_the_tiny_pair(tiny_pair):
    ver, dft = tiny_pair
    alone = run_json(ver, "--method", "none", "--temp", "0", "-n", "40")
    for method in ("sps", "cactus"):  # greedy: the verifier's tokens whatever the draft does
        got = run_json(ver, dft, "--method", method, "--temp", "0", "--draft-temp", "0", "-k",
                       "4", "-n", "40")
        assert got["tokens"] == alone["tokens"] and got["n_drafted"] > 0, method
    sampled = run_json(ver, dft, "--method", "sps", "--temp", "0.8", "--draft-temp", "0", "-k",
                       "4", "-n", "40", "-s", "5")
    assert sampled["draft_temp"] == 0 and sampled["temperature"] == 0.8
    assert sampled["n_tokens"] > 0 and sampled["n_drafted"] > 0
    assert run_json(ver, dft, "-k", "2", "-n", "4")["draft_temp"] == 0.8  # default: --temp


def test_a_foreign_draft_samples_at_the_draft_temperature(tiny_pair, tmp_path):
    """A draft of another vocabulary drafts with its own sampler (draft_vocab intersect): it gets
    the draft's warps too. At draft temperature 0 every proposal verify receives is one-hot at the
    drafted token, and greedy output is the verifier's; at the request's temperature it is not
    one-hot."""
    from support.tiny_gguf import EXTRA, FOREIGN_WORDS, write_llama

    ver = tiny_pair[0]
    foreign = write_llama(tmp_path / "foreign.gguf", seed=5, words=FOREIGN_WORDS,
                          extra_control=EXTRA)
    with make_engine(ver, foreign, method="none", temp=0.0) as e:
        alone = e.generate(PROMPT, n_predict=24, seed=0).tokens
    for temp, draft_temp in ((0.0, 0.0), (0.8, 0.0), (0.8, None)):
        with pytest.MonkeyPatch.context() as mp:
            log = StepLog.install(mp, keep_probs=True)
            with make_engine(ver, foreign, k=3, method="sps", temp=temp, top_k=0,
                             draft_temp=draft_temp, draft_vocab="intersect") as e:
                got = e.generate(PROMPT, n_predict=24, seed=1).tokens
        rows = [(probs[i], tokens[i]) for n, _, probs, tokens in log.steps for i in range(n)]
        assert len(rows) > 10
        one_hot = all(p[t] == 1.0 and p.sum() == 1.0 for p, t in rows)
        assert one_hot == (draft_temp == 0.0), (temp, draft_temp)
        if temp == 0.0:
            assert got == alone


def test_a_greedy_draft_raises_sps_acceptance_where_the_draft_ranks_as_the_verifier(tiny_pair,
                                                                                  tmp_path):
    """SpS's acceptance with a one-hot draft is q(d), with a sampled one sum min(p, q): the greedy
    draft wins where the draft's top token is the verifier's and the draft is less sure. The pair
    here is the tiny verifier and its own weights with a flatter output layer (logit scale 0.7
    instead of 2, small noise): it ranks tokens nearly as the verifier does. (The conftest tiny
    pair's draft disagrees with the verifier's top token: SpS accepts under 1% of its drafts at
    any draft temperature there, so it cannot show the effect.) Fixed seeds: deterministic;
    measured 0.22 against 0.12."""
    from support.tiny_gguf import write_llama

    ver = tiny_pair[0]
    flat = write_llama(tmp_path / "flat-draft.gguf", seed=11, logit_scale=0.7, noise=0.05,
                       noise_seed=12)
    rates = {}
    for draft_temp in (0.0, None):
        with pytest.MonkeyPatch.context() as mp:
            log = StepLog.install(mp)
            with make_engine(ver, flat, k=4, method="sps", temp=0.8, draft_temp=draft_temp) as e:
                for seed in range(6):
                    e.generate(PROMPT, n_predict=40, seed=seed)
        assert sum(s[0] for s in log.steps) > 200  # drafted tokens behind each rate
        rates[draft_temp] = log.acceptance()
    assert rates[0.0] >= rates[None] + 0.05, rates


def test_a_sharper_draft_still_tells_the_policy_how_sure_it_is(tiny_pair):
    """At draft temperature 0 the proposal row is one-hot, so it says nothing about the draft's
    confidence; a plan that reads it (--draft-p-min, -k auto's cost rule) gets the drafted token's
    probability in the draft's row under the request's warps instead: the same numbers as a draft
    sampling at the request's temperature gives for the same token."""
    from cactus_gguf.speculative import ModelDrafter
    from cactus_gguf.speculative.draft import DraftPlan

    ver, dft = tiny_pair
    warps = SamplingParams(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0)
    with make_engine(ver, dft, method="sps") as e:
        prompt = e.tokenize(PROMPT)
        V = e.verifier.n_vocab
        drafted = {}
        for draft_temp in (0.0, None):
            for plan in (DraftPlan(4), DraftPlan(4, worth_more=lambda p: True)):
                drafter = ModelDrafter(e.draft, V)
                drafter.reset(prompt, reuse=False)
                sampler = NativeSampler(V, warps, AcceptanceParams(method="sps"), 3,
                                        draft_temp=draft_temp)
                d = drafter.propose(list(prompt), plan, sampler)
                drafted[draft_temp, plan.reads_confidence] = (d.tokens.tolist(), d.p.tolist())
        greedy_tokens, greedy_p = drafted[0.0, True]
        assert drafted[0.0, False] == (greedy_tokens, [1.0] * len(greedy_tokens))  # one-hot
        assert len(greedy_tokens) == 4 and min(greedy_p) < 0.5  # measured 0.32, 0.84, 0.99, 0.24
        # the confidence of each greedy token: its probability at T 0.8 after the same prefix
        ModelDrafter(e.draft, V).reset(prompt, reuse=False)  # the draft holds prompt[:-1]
        q = NativeSampler(V, warps, AcceptanceParams(method="sps"), 0)
        for i, t in enumerate(greedy_tokens):
            last = prompt[-1] if i == 0 else greedy_tokens[i - 1]
            row = np.array(e.draft.decode([last], n_logits=1)[0])
            assert q.warp(row[:V])[t] == pytest.approx(greedy_p[i], rel=1e-5)
        # --draft-p-min reads the confidence too: a one-hot row never looks unsure
        unsure = DraftPlan(4, p_min=0.99)
        drafter = ModelDrafter(e.draft, V)
        drafter.reset(prompt, reuse=False)
        sampler = NativeSampler(V, warps, AcceptanceParams(method="sps"), 3, draft_temp=0.0)
        assert len(drafter.propose(list(prompt), unsure, sampler)) == 0
