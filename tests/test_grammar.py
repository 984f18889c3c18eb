"""Grammar-constrained decoding (sampling/constraints.py) on tiny generated GGUFs llama.cpp runs.

The allowed set of a finite-language grammar is recomputed here from the model's token pieces
(a token is allowed iff its text is a prefix of a sentence still possible), independently of the
grammar engine. Statistical tests: Pearson's chi-square at alpha = 0.001, fixed seeds.
"""
from __future__ import annotations

import numpy as np
import pytest

from cactus_gguf.errors import InputError
from cactus_gguf.llama import Context, ContextOptions
from cactus_gguf.options import Request
from cactus_gguf.sampling import reference
from cactus_gguf.sampling.constraints import Constraint, grammar_spec, tokenizer_for

from support.harness import make_engine
from support.stats import ALPHA, PROMPT, chisquare_pvalue

CTX = ContextOptions(n_ctx=512, n_batch=64, n_threads=1)
SENTENCES = [" the cat sat on the mat.", " a dog sat.", " the dog and the cat.", " hello world."]
FINITE = "root ::= " + " | ".join('"' + s + '"' for s in SENTENCES)
WARPS = dict(temperature=1.0, top_k=8, top_p=1.0, min_p=0.0)


def first_logits(path):
    with Context.load(path, context_options=CTX) as m:
        row = np.array(m.decode(m.model.tokenize(PROMPT), 1)[0], dtype=np.float32)
        pieces = [m.model.token_to_piece(t).decode("utf-8", "replace") for t in range(m.n_vocab)]
    return row, pieces


def allowed_first(pieces, eos):
    """Tokens whose text starts one of SENTENCES (recomputed without the grammar engine)."""
    ok = np.array([bool(p) and any(s.startswith(p) for s in SENTENCES) for p in pieces])
    ok[eos] = False
    return ok


def first_token_counts(engine, n, V, **kw):
    counts = np.zeros(V, np.int64)
    for seed in range(n):
        r = engine.generate(PROMPT, n_predict=2, seed=seed, grammar=FINITE, **kw)
        counts[r.tokens[0]] += 1
    return counts


@pytest.fixture(scope="module")
def first_position(tiny_pair):
    ver, dft = tiny_pair
    q_logits, pieces = first_logits(ver)
    p_logits, _ = first_logits(dft)
    with Context.load(ver, context_options=CTX) as m:
        eos = m.model.eos
    allowed = allowed_first(pieces, eos)
    assert 5 <= allowed.sum() < len(allowed) // 4  # a real restriction, not a point mass
    V = len(pieces)
    q = reference.warp(q_logits, V, allowed=allowed, **WARPS)
    p = reference.warp(p_logits, V, allowed=allowed, **WARPS)
    return p, q, allowed


def test_the_grammar_engines_mask_is_the_prefix_set(tiny_pair, first_position):
    ver, _ = tiny_pair
    _, _, allowed = first_position
    with Context.load(ver, context_options=CTX) as m:
        c = Constraint(grammar_spec("grammar", FINITE), tokenizer_for(m.model), m.n_vocab,
                       m.model.is_eog)
        c.start(0)
        got = reference.allowed_bool(c.allowed(0), m.n_vocab)
    assert np.array_equal(got, allowed)


@pytest.mark.parametrize("method,delta", [("sps", 0.0), ("cactus", 1.0), ("none", 0.0)])
def test_first_token_follows_the_masked_law(tiny_pair, first_position, method, delta):
    """SpS (and the verifier alone) emit norm(q · mask); Cactus the mixture of the paper computed
    on the masked p and q; nothing outside the mask, ever."""
    ver, dft = tiny_pair
    p, q, allowed = first_position
    expected = (q.astype(np.float64) if method == "none" else
                reference.emitted_first_token_distribution(p, q, method, delta=delta,
                                                           solver="taylor"))
    with make_engine(ver, dft, temp=1.0, top_k=8, k=1, method=method, delta=delta) as eng:
        counts = first_token_counts(eng, 4000, len(q))
    assert counts[~allowed].sum() == 0
    assert chisquare_pvalue(counts, expected) > ALPHA
    if method == "cactus":  # it really moves mass towards the draft: not the masked q
        assert chisquare_pvalue(counts, q.astype(np.float64), strict=False) < ALPHA


def test_the_unmasked_law_is_rejected(tiny_pair, first_position):
    """The test above has power: the unconstrained verifier's law restricted nowhere fails."""
    ver, dft = tiny_pair
    _, q, allowed = first_position
    q_logits, _ = first_logits(ver)
    free = reference.warp(q_logits, len(q), **WARPS).astype(np.float64)
    with make_engine(ver, dft, temp=1.0, top_k=8, k=1, method="sps") as eng:
        counts = first_token_counts(eng, 1000, len(q))
    assert chisquare_pvalue(counts, free, strict=False) < ALPHA


OPEN = 'root ::= (" " [a-z]+){2,6} "."'


@pytest.mark.parametrize("method,k,drafter", [("sps", 3, "model"), ("cactus", 5, "model"),
                                              ("cactus", 4, "ngram"), ("typical", 2, "model")])
def test_greedy_under_the_grammar_equals_the_verifier_alone(tiny_pair, method, k, drafter):
    ver, dft = tiny_pair
    for grammar in (FINITE, OPEN):
        with make_engine(ver, None, temp=0.0, method="none") as alone:
            want = alone.generate(PROMPT, n_predict=40, grammar=grammar)
        with make_engine(ver, dft, temp=0.0, k=k, method=method, drafter=drafter) as eng:
            got = eng.generate(PROMPT, n_predict=40, grammar=grammar)
        assert got.tokens == want.tokens and got.stop_reason == want.stop_reason == "eos"
        if grammar == FINITE:
            assert got.text in SENTENCES
        else:
            assert got.text.endswith(".") and got.text[:-1].replace(" ", "").isalpha()
        if drafter == "model":
            assert got.stats.n_drafted > 0


def test_the_state_after_every_step_equals_a_fresh_matcher(tiny_pair, monkeypatch):
    """Rollback: after each step (rejections included) the grammar state equals a matcher fed
    only the committed tokens: same mask, same accepting flag."""
    from llguidance import LLMatcher

    ver, dft = tiny_pair
    state, checked = {}, []
    start, push, commit = Constraint.start, Constraint.push, Constraint.commit

    def start_spy(self, k_max):
        state.setdefault(id(self), {"committed": []})["pushed"] = []
        start(self, k_max)

    def push_spy(self, token):
        ok = push(self, token)
        if ok:
            state[id(self)]["pushed"].append(token)
        return ok

    def commit_spy(self, n_accepted, token):
        st = state[id(self)]
        commit(self, n_accepted, token)
        st["committed"] += st["pushed"][:n_accepted] + [token]
        if any(self._is_eog(t) for t in st["committed"]):
            return  # the output ended there: nothing follows, nothing to compare
        fresh = LLMatcher(eng._grammar_tokenizer, self.spec.compiled, log_level=0)
        assert fresh.consume_tokens(st["committed"])
        assert fresh.compute_bitmask() == self.copy_state_for_test().compute_bitmask()
        assert fresh.is_accepting() == self.is_accepting()
        checked.append(n_accepted < len(st["pushed"]))

    monkeypatch.setattr(Constraint, "start", start_spy)
    monkeypatch.setattr(Constraint, "push", push_spy)
    monkeypatch.setattr(Constraint, "commit", commit_spy)
    with make_engine(ver, dft, temp=1.5, top_k=0, k=6, method="cactus", delta=0.5) as eng:
        for seed in range(3):
            eng.generate(PROMPT, n_predict=60, seed=seed, grammar='root ::= (" " [a-z]+)+ "."')
    assert len(checked) > 30 and sum(checked) > 10  # many steps, many with a rejection


def test_same_seed_same_tokens_under_a_grammar(tiny_pair):
    ver, dft = tiny_pair
    with make_engine(ver, dft, temp=1.0, top_k=8, k=4) as eng:
        a = eng.generate(PROMPT, n_predict=30, seed=7, grammar=OPEN)
        b = eng.generate(PROMPT, n_predict=30, seed=7, grammar=OPEN)
    assert a.tokens == b.tokens and a.stats.grammar_seconds > 0


def test_json_object_and_schema_outputs_parse(tiny_pair):
    """Random weights and a JSON constraint: whatever the model wants, the text is JSON once it
    ends (eos), and the schema's required field and bounds hold."""
    import json

    ver, dft = tiny_pair
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3,
                                                     "maximum": 9}}, "required": ["n"],
              "additionalProperties": False}
    ended = 0
    with make_engine(ver, dft, temp=1.0, top_k=8, k=4) as eng:
        for seed in range(6):
            r = eng.generate(PROMPT, n_predict=60, seed=seed, json_schema=schema)
            if r.stop_reason == "eos":
                ended += 1
                obj = json.loads(r.text)
                assert set(obj) == {"n"} and 3 <= obj["n"] <= 9
            r = eng.generate(PROMPT, n_predict=200, seed=seed, json_object=True)
            if r.stop_reason == "eos":
                assert isinstance(json.loads(r.text), dict)
    assert ended >= 3


@pytest.mark.parametrize("fields,param,words", [
    ({"grammar": "root ::= undefined"}, "grammar", "not found"),
    ({"grammar": "  "}, "grammar", "empty"),
    ({"json_schema": "{nope"}, "json_schema", "not valid JSON"),
    ({"json_schema": '{"type": "objec"}'}, "json_schema", "Invalid type"),
    ({"json_schema": [1, 2]}, "json_schema", "must be a JSON Schema object"),
    ({"json_schema": {"type": "string", "pattern": "a(b"}}, "json_schema", "unclosed group"),
    ({"grammar": 'root ::= "a"', "json_object": True}, "json_object", "one output constraint"),
    ({"grammar": "root ::= root"}, "grammar", "matches no text"),
    ({"grammar": 'root ::= "a" root'}, "grammar", "never lets the output end"),
    ({"json_schema": False}, "json_schema", "no JSON matches"),
    ({"json_schema": ""}, "json_schema", "is empty"),
    ({"json_schema": {"enum": [{1, 2}]}}, "json_schema", "not JSON data"),
])
def test_bad_constraints_are_one_line_input_errors(fields, param, words):
    with pytest.raises(InputError) as e:
        Request(**fields)
    assert e.value.param == param and words in str(e.value) and "\n" not in str(e.value)


def test_a_constraint_replaces_the_default_one_and_true_is_any_json():
    base = Request(json_object=True)
    r = base.replace(grammar='root ::= "a"')
    assert (r.grammar, r.json_object, r.json_schema) == ('root ::= "a"', False, None)
    assert base.replace(temperature=0.5).json_object is True  # other changes keep it
    assert Request(json_schema=True).json_schema == "{}"
    for g in ('root ::= "a"+', 'root ::= ""', 'root ::= "a" root | "a"', OPEN, FINITE):
        Request(grammar=g)  # the up-front probe refuses none of these


def test_a_schema_dict_keeps_its_property_order():
    r = Request(json_schema={"type": "object", "properties": {"b": {}, "a": {}}})
    assert r.json_schema == '{"type":"object","properties":{"b":{},"a":{}}}'
    assert Request(json_schema=r.json_schema) == r
