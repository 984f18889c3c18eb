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


# ---- item 4: logprobs on the OpenAI endpoints -----------------------------------------------------

def joined(entries) -> str:
    return b"".join(bytes(e["bytes"]) for e in entries).decode("utf-8", errors="replace")


def test_chat_logprobs_cover_every_token_accepted_drafts_included(server):
    c = client(server)
    kw = dict(model="x", messages=[{"role": "user", "content": "hello"}], max_tokens=16, seed=7,
              logprobs=True, top_logprobs=3)
    r = c.chat.completions.create(**kw)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 16
    assert r.model_extra["speculative"]["acceptance_length"] > 0  # some were accepted drafts
    assert joined([e.model_dump() for e in content]) == r.choices[0].message.content
    for e in content:
        assert e.logprob <= 0 and 1 <= len(e.top_logprobs) <= 3
        assert e.top_logprobs[0].logprob >= e.logprob - 1e-6  # most likely first
        assert [t.logprob for t in e.top_logprobs] == sorted(
            (t.logprob for t in e.top_logprobs), reverse=True)
    # streamed, the chunks carry the same values in order
    chunks = list(c.chat.completions.create(**kw, stream=True))
    streamed = [e for ch in chunks if ch.choices and ch.choices[0].logprobs
                for e in ch.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    assert chunks[0].choices[0].logprobs is None  # the role chunk
    # top_logprobs 0 and llama-server's n_probs
    plain = chat(server, logprobs=True).json()["choices"][0]["logprobs"]["content"]
    assert plain and all(e["top_logprobs"] == [] for e in plain)
    n_probs = chat(server, n_probs=2).json()["choices"][0]["logprobs"]["content"]
    assert all(len(e["top_logprobs"]) <= 2 for e in n_probs)
    assert chat(server).json()["choices"][0]["logprobs"] is None  # not asked: none


def test_logprobs_are_the_warped_law_unless_post_sampling_probs_is_false(server):
    greedy = chat(server, logprobs=True, top_logprobs=5, temperature=0).json()
    for e in greedy["choices"][0]["logprobs"]["content"]:  # q one-hot: log 1, no alternative
        assert e["logprob"] == 0.0 and [t["token"] for t in e["top_logprobs"]] == [e["token"]]
    raw = chat(server, logprobs=True, top_logprobs=5, temperature=0,
               post_sampling_probs=False).json()
    assert raw["choices"][0]["message"] == greedy["choices"][0]["message"]  # the same text
    for e in raw["choices"][0]["logprobs"]["content"]:  # the raw log-softmax: every token has one
        assert e["logprob"] < 0 and len(e["top_logprobs"]) == 5
        assert e["top_logprobs"][0]["token"] == e["token"]  # greedy: the top raw logit


def test_completion_logprobs_have_openais_legacy_shape(server):
    c = client(server)
    r = c.completions.create(model="x", prompt="the cat", max_tokens=10, seed=2, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 10
    # a token may hold part of a UTF-8 character: its bytes join to the text
    assert joined(lp.model_extra["content"]) == r.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(10)]
    assert all(len(top) <= 2 and all(v <= 0 for v in top.values()) for top in lp.top_logprobs)
    chunks = list(c.completions.create(model="x", prompt="the cat", max_tokens=10, seed=2,
                                       logprobs=2, stream=True))
    streamed = [t for ch in chunks if ch.choices and ch.choices[0].logprobs
                for t in ch.choices[0].logprobs.tokens]
    offsets = [o for ch in chunks if ch.choices and ch.choices[0].logprobs
               for o in ch.choices[0].logprobs.text_offset]
    assert streamed == lp.tokens and offsets == lp.text_offset


@pytest.mark.parametrize("endpoint,fields,param", [
    ("chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat/completions", {"logprobs": "yes"}, "logprobs"),
    ("chat/completions", {"n_probs": -1}, "n_probs"),
    ("chat/completions", {"logprobs": True, "top_logprobs": 2, "n_probs": 3}, "n_probs"),
    ("chat/completions", {"logprobs": True, "post_sampling_probs": 1}, "post_sampling_probs"),
    ("completions", {"logprobs": True}, "logprobs"),
    ("completions", {"logprobs": 21}, "logprobs"),
    ("completions", {"n_probs": "2"}, "n_probs"),
])
def test_bad_logprobs_fields_are_a_400_naming_them(server, endpoint, fields, param):
    body = {"messages": [{"role": "user", "content": "x"}]} if endpoint.startswith("chat") \
        else {"prompt": "x"}
    r = httpx.post(f"{server.url}/v1/{endpoint}", json={**body, **fields}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
