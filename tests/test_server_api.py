"""``cactus-gguf serve`` beyond plain chat (issue 40 items 3-5), on tiny GGUF models with real HTTP
clients (the official ``openai`` client and httpx): every speculation setting per request and the
generated schema; logprobs on the OpenAI endpoints; llama-server's native endpoints."""
from __future__ import annotations

import httpx
import pytest

from support.server import LiveServer, client
from support.tiny_gguf import CHAT_TEMPLATE, EOS, write_llama

from test_rule import NAMES


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("server_api")
    return {"ver": write_llama(d / "ver.gguf", seed=11, zero_output_rows=[EOS],
                               chat_template=CHAT_TEMPLATE),
            "dft": write_llama(d / "dft.gguf", seed=11, zero_output_rows=[EOS], noise=0.1,
                               noise_seed=12, chat_template=CHAT_TEMPLATE)}


@pytest.fixture(scope="module")
def server(files):
    with LiveServer(files["ver"], files["dft"], "-t", "1", "-c", "1024", "-k", "4", "-n", "16",
                    "--temp", "0.8") as s:
        yield s
    assert s.returncode == 0 and not any("Traceback" in ln for ln in s.stderr_lines), \
        s.stderr_lines


def chat(server, speculative=None, **kw) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 12, "seed": 3, **kw}
    if speculative is not None:
        body["speculative"] = speculative
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)


# ---- item 5: every speculation setting per request ------------------------------------------------

PER_REQUEST = [  # (speculative object, what the response's speculative block must say)
    ({"top_gap": 0.5, "protect_ends": 0.1, "draft_min": 1, "output_kl": False},
     {"method": "cactus", "top_gap": 0.5, "protect_ends": 0.1, "draft_min": 1, "output_kl": False,
      "ears_alpha": None, "k_max": None}),
    ({"method": "ears", "ears_alpha": 0.3}, {"method": "ears", "ears_alpha": 0.3, "delta": None,
                                             "top_gap": None}),
    ({"method": "typical", "typical_epsilon": 0.05, "typical_alpha": 0.2},
     {"typical_epsilon": 0.05, "typical_alpha": 0.2, "solver": None}),
    ({"method": "topk", "accept_top_k": 3}, {"accept_top_k": 3, "budget": None}),
    ({"drafter": "ngram", "ngram_max": 4, "ngram_min": 2},
     {"drafter": "ngram", "ngram_max": 4, "ngram_min": 2, "draft_temp": None,
      "draft_window": None, "draft_vocab": None}),
    ({"drafter": "hybrid", "ngram_max": 2, "draft_window": 8, "draft_p_min": 0.1},
     {"ngram_max": 2, "ngram_min": None, "draft_window": 8, "draft_p_min": 0.1}),
    ({"draft_vocab": "same", "draft_temp": 0, "solver": "exact", "budget": "output"},
     {"draft_vocab": "same", "draft_temp": 0, "solver": "exact", "budget": "output"}),
]


@pytest.mark.parametrize("speculative,expect", PER_REQUEST,
                         ids=[",".join(s) for s, _ in PER_REQUEST])
def test_every_speculation_setting_is_taken_per_request_and_reported(server, speculative,
                                                                     expect):
    r = chat(server, speculative)
    assert r.status_code == 200, r.text
    block = r.json()["speculative"]
    assert set(NAMES) <= set(block)
    assert {k: block[k] for k in expect} == expect


def test_a_per_request_setting_changes_what_runs(server):
    """draft_p_min 1 stops a draft at the first row that is not one-hot (most are not): far fewer
    tokens per verifier call than the server's default, which drafts k = 4."""
    drafting = chat(server, {"k": 4}).json()["speculative"]
    stopped = chat(server, {"k": 4, "draft_p_min": 1.0}).json()["speculative"]
    assert stopped["tokens_per_verifier_call"] < 0.6 * drafting["tokens_per_verifier_call"], \
        (stopped, drafting)
    assert stopped["draft_p_min"] == 1.0


@pytest.mark.parametrize("speculative,param", [
    ({"top_gap": -1}, "speculative.top_gap"), ({"protect_ends": 2}, "speculative.protect_ends"),
    ({"protect_ends": "on"}, "speculative.protect_ends"), ({"ears_alpha": "0.3"},
                                                           "speculative.ears_alpha"),
    ({"k": 2, "draft_min": 3}, "speculative.draft_min"),
    ({"ngram_min": 3, "ngram_max": 2}, "speculative.ngram_min"),
    ({"typical_epsilon": -0.1}, "speculative.typical_epsilon"),
    ({"output_kl": "yes"}, "speculative.output_kl"), ({"top_k": 3}, "speculative.top_k"),
])
def test_a_bad_speculation_setting_is_a_400_naming_it(server, speculative, param):
    r = chat(server, speculative)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"], err


def test_the_openapi_schema_has_the_generated_speculative_object(server):
    spec = httpx.get(server.url + "/openapi.json", timeout=30).json()
    speculative = spec["components"]["schemas"]["Speculative"]
    assert list(speculative["properties"]) == NAMES
    assert speculative["additionalProperties"] is False
    assert "only with method cactus" in speculative["properties"]["top_gap"]["description"]
    assert httpx.get(server.url + "/docs", timeout=30).status_code == 200
