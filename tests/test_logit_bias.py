"""A request's logit bias (llama-server's ``logit_bias`` and ``ignore_eos``): the value forms the
Request takes, the biased row the sampler adds before the warps (exactly the same verification
as on pre-biased logits, every rule), a banned token never emitted under any rule or drafter,
and the law of the first token moved as the softmax of the biased logits predicts (chi-square at
``ALPHA``, fixed seeds)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from cactus_gguf.errors import InputError
from cactus_gguf.options import Request
from cactus_gguf.sampling import AcceptanceParams, NativeSampler, SamplingParams
from cactus_gguf.speculative.vocab import bias_row

from support.stats import ALPHA, PROMPT, chisquare_pvalue, decoder, first_token_histogram

RULES = ("sps", "cactus", "typical", "topk", "greedy", "ears")


def test_the_request_keeps_llama_servers_forms_as_one_json_text():
    assert Request(logit_bias={"15": -100, "hello": False, 3: 2}).logit_bias == \
        '[[15,-100.0],["hello",false],[3,2.0]]'
    assert Request(logit_bias=[[15, -1], [" the ", 0.5]]).logit_bias == \
        '[[15,-1.0],[" the ",0.5]]'
    assert Request(logit_bias={}).logit_bias is None and Request().logit_bias is None
    for bad, words in (({"a": True}, "finite number, or false"),
                       ({"a": math.inf}, "finite number"), ([[1, 2, 3]], "[token, bias] pairs"),
                       (5, "an object"), ({"": 1}, "non-empty text")):
        with pytest.raises(InputError, match="logit_bias") as e:
            Request(logit_bias=bad)
        assert words in str(e.value) and e.value.param == "logit_bias"


def test_bias_row_sums_entries_and_a_ban_wins():
    row = bias_row([(1, 2.0), (1, 0.5), (3, -math.inf), (3, 10.0)], 5)
    assert row.dtype == np.float32 and row.tolist() == [0.0, 2.5, 0.0, -math.inf, 0.0]
    assert bias_row([], 5) is None


@pytest.mark.parametrize("method", RULES)
def test_a_biased_sampler_verifies_exactly_as_on_biased_logits(method):
    """The bias is added before the warps, nowhere else: the same seed gives the same StepResult
    as a sampler without bias given logits + bias, for every rule (and the draft's p too)."""
    rng = np.random.default_rng(3)
    V, k = 40, 4
    bias = np.zeros(V, np.float32)
    bias[[2, 7]] = -np.inf
    bias[[5, 11]] = (3.0, -1.5)
    sp = SamplingParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0)
    acc = AcceptanceParams(method=method, delta=0.5)
    for trial in range(20):
        ver = rng.normal(0, 2, (k + 1, V)).astype(np.float32)
        dft = rng.normal(0, 2, V).astype(np.float32)
        a = NativeSampler(V, sp, acc, trial, logit_bias=bias)
        b = NativeSampler(V, sp, acc, trial)
        pa, pb = np.empty((k, V), np.float32), np.empty((k, V), np.float32)
        ta = [a.draft(dft, pa[i]) for i in range(k)]
        tb = [b.draft(dft + bias, pb[i]) for i in range(k)]
        assert ta == tb and np.array_equal(pa, pb) and not pa[:, [2, 7]].any()
        tokens = np.array(ta, np.int32)
        assert a.verify(pa, tokens, ver) == b.verify(pb, tokens, ver + bias)
        assert np.array_equal(a.warp(ver[0]), b.warp(ver[0] + bias))
        assert a.sample(ver[1]) == b.sample(ver[1] + bias)


def test_a_biased_sampler_refuses_compact_rows():
    bias = np.zeros(8, np.float32)
    s = NativeSampler(8, SamplingParams(), AcceptanceParams(), 0, logit_bias=bias)
    with pytest.raises(ValueError, match="full rows only"):
        s.sample_compact(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="logit_bias must be"):
        NativeSampler(8, SamplingParams(), AcceptanceParams(), 0,
                      logit_bias=np.full(8, np.inf, np.float32))


@pytest.mark.parametrize("method,drafter", [(m, "model") for m in RULES]
                         + [("ears", "ngram"), ("sps", "hybrid"), ("none", "model")])
def test_a_banned_token_is_never_emitted(tiny_pair, method, drafter):
    """The verifier's 6 likeliest first tokens banned (false), and ``ignore_eos``: over 40 seeds
    of 12 tokens none of them appears, under every rule and drafter (prompt lookup proposes
    unbiased tokens: the step cuts its proposal before a banned one)."""
    ver, dft = tiny_pair
    with decoder(ver, dft, method=method, drafter=drafter, delta=1.0, k=4) as dec:
        top = [int(t) for t in first_token_histogram(dec, 60, dec.verifier.n_vocab).argsort()[-6:]]
        banned = set(top) | {dec.verifier.model.eos}
        seen = set()
        for seed in range(40):
            r = dec.generate(PROMPT + " the cat sat on", n_predict=12, seed=seed,
                             logit_bias={t: False for t in top}, ignore_eos=True)
            seen |= set(r.tokens)
            assert len(r.tokens) == 12 and r.stop_reason == "length"
        assert not seen & banned, (seen & banned)


def test_a_bias_moves_the_first_tokens_law_as_the_softmax_predicts(tiny_pair):
    """SpS emits the biased verifier's law q' = warp(logits + b): +2 on one token of the top-k,
    -1 on another, one banned. The first token's histogram over 3000 seeds against q' (chi-square,
    significance ALPHA) passes, and against the unbiased q fails."""
    from cactus_gguf.llama import Context

    from support.stats import CTX

    ver, dft = tiny_pair
    sp = SamplingParams(temperature=1.0, top_k=8, top_p=1.0, min_p=0.0)
    with Context.load(ver, context_options=CTX) as m:
        V = m.n_vocab
        row = np.array(m.decode(m.model.tokenize(PROMPT), 1)[0])
    plain = NativeSampler(V, sp, AcceptanceParams(), 0)
    order = np.argsort(-row, kind="stable")
    up, down, ban = int(order[5]), int(order[1]), int(order[0])
    bias = np.zeros(V, np.float32)
    bias[[up, down, ban]] = (2.0, -1.0, -np.inf)
    q_biased = plain.warp((row + bias).astype(np.float32))
    q = plain.warp(row)
    assert q_biased[ban] == 0 and q_biased[up] > 2 * q[up]
    with decoder(ver, dft, method="sps", k=3, temp=1.0, top_k=8,
                 logit_bias=[[up, 2.0], [down, -1.0], [ban, False]]) as dec:
        counts = first_token_histogram(dec, 3000, V)
    assert chisquare_pvalue(counts, q_biased.astype(np.float64)) > ALPHA
    assert chisquare_pvalue(counts, q.astype(np.float64), strict=False) < ALPHA


def test_text_keys_and_ignore_eos_resolve_to_token_ids(tiny_pair):
    ver, dft = tiny_pair
    with decoder(ver, dft, method="sps") as dec:
        model = dec.verifier.model
        ids = model.tokenize(" the cat", add_special=False, parse_special=False)
        got = dec.logit_biases(dec.request(logit_bias={" the cat": -3, "9": 1,
                                                       str(10**6): 1}, ignore_eos=True))
        eogs = [t for t in range(model.n_vocab) if model.is_eog(t)]
        assert got == [(t, -3.0) for t in ids] + [(9, 1.0)] + [(t, -math.inf) for t in eogs]
        assert eogs and dec.logit_biases(dec.request()) == []


def test_prompt_lookup_proposing_banned_tokens_emits_none(tiny_pair):
    """Prompt lookup proposes the prompt's repeated tokens, unbiased, so here banned ones (by
    text); EARS at ears_alpha 1 accepts with probability min(1, q/p + 1 - max q), but never a
    draft q gives 0 (native/rules.c), so none is emitted."""
    ver, dft = tiny_pair
    prompt = " ".join(["the cat sat on"] * 6)
    with decoder(ver, dft, method="ears", ears_alpha=1.0, drafter="ngram", k=4) as dec:
        banned = set(dec.verifier.model.tokenize(" the cat sat on", add_special=False,
                                                 parse_special=False))
        emitted = set()
        for seed in range(20):
            emitted |= set(dec.generate(prompt, n_predict=16, seed=seed,
                                        logit_bias={" the cat sat on": False}).tokens)
        assert emitted and not emitted & banned


# ---- the server: llama-server's fields ----------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from support.server import serving, tiny_chat_pair

    pair = tiny_chat_pair(tmp_path_factory.mktemp("bias-server"))
    with serving(pair["ver"], pair["dft"], "-t", "1", "-c", "512", "-k", "4", "-n", "16") as s:
        yield s


def test_completion_takes_logit_bias_and_ignore_eos_as_llama_server(server):
    """/completion at temperature 0: the greedy answer's first two tokens banned (by id, and by
    their text) never come back, and generation_settings lists the entries as ids, a ban null,
    ignore_eos's end-of-generation ids after them."""
    import httpx

    url = server.url + "/completion"
    body = {"prompt": "the cat", "n_predict": 8, "temperature": 0, "return_tokens": True}
    plain = httpx.post(url, json=body, timeout=120).json()
    assert plain["generation_settings"]["logit_bias"] == []
    assert plain["generation_settings"]["ignore_eos"] is False
    first, second = plain["tokens"][:2]
    text = httpx.post(server.url + "/detokenize", json={"tokens": [second]}, timeout=60)
    ids = httpx.post(server.url + "/tokenize", json={"content": text.json()["content"]},
                     timeout=60).json()["tokens"]
    for bias in ([[first, False], [text.json()["content"], -100]],
                 {str(first): False, text.json()["content"]: -100}):
        r = httpx.post(url, json={**body, "logit_bias": bias, "ignore_eos": True}, timeout=120)
        assert r.status_code == 200, r.text
        got = r.json()
        assert first not in got["tokens"] and not set(ids) & set(got["tokens"])
        settings = got["generation_settings"]
        assert settings["ignore_eos"] is True
        entries = settings["logit_bias"]
        assert entries[:1 + len(ids)] == ([{"bias": None, "token": first}]
                                          + [{"bias": -100.0, "token": t} for t in ids])
        assert entries[1 + len(ids):] and all(e["bias"] is None for e in entries[1 + len(ids):])
    r = httpx.post(url, json={**body, "logit_bias": {"7": True}}, timeout=60)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "logit_bias" and \
        err["message"].startswith("logit_bias"), r.text


def test_chat_takes_openais_logit_bias(server):
    """OpenAI's form through the openai client: the greedy answer's first token at -100, and the
    chat answers what /completion answers on the chat's prompt with the same bias."""
    import httpx

    from support.server import client

    messages = [{"role": "user", "content": "hi"}]
    prompt = httpx.post(server.url + "/apply-template", json={"messages": messages},
                        timeout=60).json()["prompt"]

    def completion(**kw):
        return httpx.post(server.url + "/completion", timeout=120, json={
            "prompt": prompt, "n_predict": 6, "temperature": 0, "return_tokens": True,
            **kw}).json()

    first = completion()["tokens"][0]
    biased = completion(logit_bias={str(first): -100})
    assert biased["tokens"][0] != first
    r = client(server).chat.completions.create(model="x", messages=messages, temperature=0,
                                               max_tokens=6, logit_bias={str(first): -100})
    assert r.choices[0].message.content == biased["content"]
