"""What rule ran, named from the options table (issue 40 item 5): options/rule.py, the server's
generated ``speculative`` object, ``run --json`` and the run summary."""
from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from cactus_gguf import options
from cactus_gguf.options.rule import SPECULATION, rule_of, rule_words
from cactus_gguf.server.speculative import Speculative

from support.harness import run_cli
from support.rule import NAMES


def test_the_speculation_settings_are_the_tables_request_options_but_sampling_and_output():
    assert [o.name for o in SPECULATION] == NAMES
    others = {o.name for o in options.options_in("request")} - set(NAMES)
    # what every generation has, the verifier alone included: the server takes them at the
    # body's top level (OpenAI's and llama-server's fields), the rule does not name them
    assert others == {"n_predict", "temperature", "top_k", "top_p", "min_p", "seed", "stop",
                      "grammar", "json_schema", "json_object", "cache_prompt", "n_probs",
                      "post_sampling_probs", "backend_sampling", "logit_bias", "ignore_eos",
                      "timings_per_token", "return_progress", "id_slot"}
    for o in SPECULATION:  # a condition names another option and values it takes
        for name, values in o.applies:
            assert name in options.BY_NAME and all(
                options.BY_NAME[name].problem(v) is None for v in values), o.name


def test_each_setting_is_reported_where_it_applies_and_null_elsewhere():
    r = options.Request(method="cactus", k=4, top_gap=0.5, protect_ends=0.1, delta=2.0)
    rule = rule_of(r)
    assert list(rule) == NAMES
    assert (rule["method"], rule["delta"], rule["top_gap"], rule["protect_ends"]) == \
        ("cactus", 2.0, 0.5, 0.1)
    assert rule["ears_alpha"] is None and rule["typical_alpha"] is None  # other rules'
    assert rule["k_max"] is None and rule["ngram_min"] is None  # fixed k, a draft model
    assert rule["draft_temp"] == r.temperature and rule["draft_vocab"] == "auto"
    assert rule_of(options.Request(top_gap=float("inf")))["top_gap"] == "inf"  # JSON has none
    ears = rule_of(options.Request(method="ears", ears_alpha=0.25, k="auto", drafter="ngram"))
    assert (ears["ears_alpha"], ears["delta"], ears["k_max"], ears["ngram_min"]) == \
        (0.25, None, 16, 1)
    assert ears["draft_temp"] is None and ears["draft_p_min"] is None  # nothing samples a draft
    for off in (options.Request(method="none"), options.Request(k=0)):
        assert rule_of(off) == {**{n: None for n in NAMES}, "method": "none"}


def test_the_summary_names_the_acceptance_rule_and_its_settings():
    # the default rule (docs/benchmarks.md "Which rule is the default"), then the paper's
    assert rule_words(options.Request()) == ("method cactus delta=1 solver=taylor budget=target "
                                             "top_gap=0.5 protect_ends=0.1 top_gap_scope=code")
    paper = options.Request(top_gap=float("inf"), protect_ends="off")
    assert rule_words(paper).endswith("top_gap=inf protect_ends=off top_gap_scope=code")
    assert rule_words(options.Request(method="ears", ears_alpha=0.3)) == "method ears ears_alpha=0.3"
    assert rule_words(options.Request(method="typical")) == \
        "method typical typical_epsilon=0.09 typical_alpha=0.3"
    assert rule_words(options.Request(method="sps")) == "method sps"
    assert rule_words(options.Request(k=0)) == "method none"


def test_the_servers_speculative_object_is_generated_from_the_table():
    assert list(Speculative.model_fields) == NAMES
    every = {"k": "auto", "k_max": 3, "method": "cactus", "delta": 0.5, "solver": "exact",
             "budget": "output", "output_kl": False, "typical_epsilon": 0.1, "typical_alpha": 0.2,
             "accept_top_k": 3, "ears_alpha": 0.4, "top_gap": 0.5, "protect_ends": "off",
             "top_gap_scope": "all", "drafter": "hybrid", "ngram_max": 4, "ngram_min": 2, "draft_window": 0,
             "draft_vocab": "same", "draft_min": 1, "draft_p_min": 0.1,
             "spec_synth_rates": None, "spec_synth_len": None, "draft_temp": 0}
    assert Speculative.model_validate(every).model_dump() == every
    options.Request(**every)  # every value the object takes, the Request takes
    for bad in ({"k": "4"}, {"top_gap": "0.5"}, {"output_kl": 1}, {"bogus": 1}):
        with pytest.raises(ValidationError):  # strict types, unknown names refused
            Speculative.model_validate(bad)
    schema = Speculative.model_json_schema()["properties"]
    assert schema["method"]["enum"] == [*options.METHODS, "none", None]
    assert schema["delta"]["minimum"] == 0 and "Cactus" in schema["delta"]["description"]
    assert "only with method ears" in schema["ears_alpha"]["description"]
    assert (schema["draft_p_min"]["minimum"], schema["draft_p_min"]["maximum"]) == (0, 1)


def test_json_and_the_summary_name_the_whole_rule(tiny_pair):
    ver, dft = tiny_pair
    r = run_cli("run", ver, dft, "-p", "the cat", "-n", "6", "-k", "2", "-t", "1", "-c", "256",
                "--top-gap", "0.5", "--protect-ends", "0.2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["method"], out["top_gap"], out["protect_ends"], out["ears_alpha"]) == \
        ("cactus", 0.5, 0.2, None)
    assert set(NAMES) <= set(out)
    r = run_cli("run", ver, dft, "-p", "the cat", "-n", "6", "-k", "2", "-t", "1", "-c", "256",
                "--method", "ears", "--ears-alpha", "0.3")
    assert r.returncode == 0, r.stderr
    assert "method ears ears_alpha=0.3 k=2" in r.stderr, r.stderr
