"""``cactus-gguf serve`` beyond plain chat (issue 40 items 3-5), on tiny GGUF models with real HTTP
clients (the official ``openai`` client and httpx): every speculation setting per request and the
generated schema; logprobs on the OpenAI endpoints; llama-server's native endpoints."""
from __future__ import annotations

import httpx
import pytest

from support.rule import NAMES
from support.server import LiveServer, client, serving, tiny_chat_pair
from support.tiny_gguf import CHAT_TEMPLATE


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return tiny_chat_pair(tmp_path_factory.mktemp("server_api"))


@pytest.fixture(scope="module")
def server(files):
    with serving(files["ver"], files["dft"], "-t", "1", "-c", "1024", "-k", "4", "-n", "16",
                 "--temp", "0.8") as s:
        yield s


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


def test_logprobs_are_the_raw_log_softmax_unless_post_sampling_probs_is_true(server):
    """Issue 52: the OpenAI routes gave the post-warp law by default (all 0.0 at temperature 0);
    llama-server's default and OpenAI's are the model's own log-probabilities."""
    raw = chat(server, logprobs=True, top_logprobs=5, temperature=0).json()
    for e in raw["choices"][0]["logprobs"]["content"]:  # the raw log-softmax: every token has one
        assert e["logprob"] < 0 and len(e["top_logprobs"]) == 5
        assert e["top_logprobs"][0]["token"] == e["token"]  # greedy: the top raw logit
    assert chat(server, logprobs=True, top_logprobs=5, temperature=0,
                post_sampling_probs=False).json()["choices"][0]["logprobs"] == \
        raw["choices"][0]["logprobs"]
    greedy = chat(server, logprobs=True, top_logprobs=5, temperature=0,
                  post_sampling_probs=True).json()  # the opt-in: q, after the warps
    assert raw["choices"][0]["message"] == greedy["choices"][0]["message"]  # the same text
    for e in greedy["choices"][0]["logprobs"]["content"]:  # q one-hot: log 1, no alternative
        assert e["logprob"] == 0.0 and [t["token"] for t in e["top_logprobs"]] == [e["token"]]
    legacy = httpx.post(server.url + "/v1/completions", timeout=120, json={
        "prompt": "the cat", "max_tokens": 6, "seed": 1, "temperature": 0, "logprobs": 1}).json()
    assert all(v < 0 for v in legacy["choices"][0]["logprobs"]["token_logprobs"])


def _whole_tokens(entries, text: str) -> list[str]:
    """The most leading entries whose bytes, decoded, are a prefix of ``text``: its whole
    tokens."""
    n = max(i for i in range(len(entries) + 1) if text.startswith(
        b"".join(bytes(e["bytes"]) for e in entries[:i]).decode("utf-8", errors="replace")))
    return [e["token"] for e in entries[:n]]


def test_logprobs_end_with_the_text_before_a_stop_string(server):
    """Issue 52 item 6: with a stop string the content ends before it, and the log-probabilities
    covered its tokens too; now they are the tokens of the text returned, on every route (streamed:
    tests/test_logprobs.py, the engine's chunks)."""
    base = dict(temperature=0, seed=1, max_tokens=16)
    whole = chat(server, logprobs=True, **base).json()["choices"][0]
    text, entries = whole["message"]["content"], whole["logprobs"]["content"]
    stop = text[6:9]
    cut = text[:text.index(stop)]
    expected = _whole_tokens(entries, cut)
    assert 0 < len(expected) < len(entries) == len(_whole_tokens(entries, text))
    got = chat(server, logprobs=True, stop=[stop], **base).json()["choices"][0]
    assert got["message"]["content"] == cut and got["finish_reason"] == "stop"
    assert [e["token"] for e in got["logprobs"]["content"]] == expected
    c = client(server)
    # /v1/completions and /completion, on their prompt
    plain = c.completions.create(model="x", prompt="the cat", logprobs=0, **base).choices[0]
    entries = plain.logprobs.model_extra["content"]
    stop = plain.text[6:9]
    cut = plain.text[:plain.text.index(stop)]
    expected = _whole_tokens(entries, cut)
    one = c.completions.create(model="x", prompt="the cat", logprobs=0, stop=[stop],
                               **base).choices[0]
    assert one.text == cut and one.logprobs.tokens == expected
    native = dict(prompt="the cat", n_predict=16, temperature=0, seed=1, n_probs=1, stop=[stop])
    r = post(server, "/completion", native).json()
    assert r["content"] == cut
    assert [p["token"] for p in r["completion_probabilities"]] == expected


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


# ---- item 3: llama-server's native endpoints ------------------------------------------------------

def post(server, path: str, body) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


def llama_error(r: httpx.Response, status: int, field: str | None = None) -> dict:
    """The llama-server error of ``r``: {"code": status, "message", "type"} (+ param)."""
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["message"] and err["type"], err
    assert "Traceback" not in err["message"]
    if field is not None:
        assert err["param"] == field and field in err["message"], err
    return err


def sse_data(r: httpx.Response) -> list[str]:
    return [ln[5:].strip() for ln in r.text.splitlines() if ln.startswith("data:")]


def test_completion_answers_as_llama_server(server):
    r = post(server, "/completion", {"prompt": "the cat", "n_predict": 8, "seed": 1,
                                     "return_tokens": True})
    assert r.status_code == 200, r.text
    out = r.json()
    assert {"index", "content", "tokens", "id_slot", "stop", "model", "tokens_predicted",
            "tokens_evaluated", "generation_settings", "prompt", "has_new_line", "truncated",
            "stop_type", "stopping_word", "tokens_cached", "timings", "speculative"} <= set(out)
    assert out["stop"] is True and out["stop_type"] == "limit" and out["model"] == "ver"
    assert out["tokens_predicted"] == len(out["tokens"]) == 8
    assert out["tokens_evaluated"] == len(post(server, "/tokenize", {
        "content": "the cat", "add_special": True}).json()["tokens"])
    assert out["prompt"].endswith("the cat") and out["generation_settings"]["n_predict"] == 8
    assert out["timings"]["predicted_n"] == 8 and "draft_n" in out["timings"]
    assert out["speculative"]["method"] == "cactus" and "completion_probabilities" not in out
    assert post(server, "/completion", {"prompt": "the cat", "n_predict": 4}).json()[
        "tokens"] == []  # ids only with return_tokens
    # the same generation as /v1/completions, from text, token ids, ids mixed with text
    greedy = {"n_predict": 10, "temperature": 0}
    want = post(server, "/v1/completions", {"prompt": "the cat", "max_tokens": 10,
                                            "temperature": 0}).json()["choices"][0]["text"]
    ids = post(server, "/tokenize", {"content": "the cat", "add_special": True}).json()["tokens"]
    for prompt in ("the cat", ids, ["the cat"], {"prompt_string": "the cat"}):
        got = post(server, "/completion", {"prompt": prompt, **greedy})
        assert got.status_code == 200 and got.json()["content"] == want, (prompt, got.text)
    assert post(server, "/completions", {"prompt": "the cat", **greedy}).json()["content"] == want
    # ids mixed with text: BOS before leading text only, as llama-server's tokenize_mixed
    head = post(server, "/tokenize", {"content": "the", "add_special": True}).json()["tokens"]
    tail = post(server, "/tokenize", {"content": " cat"}).json()["tokens"]
    mixed = post(server, "/completion", {"prompt": ["the", *tail], **greedy}).json()
    assert mixed["content"] == post(server, "/completion", {"prompt": head + tail,
                                                            **greedy}).json()["content"]
    assert mixed["tokens_evaluated"] == len(head + tail)


def test_completion_streams_llama_servers_events(server):
    body = {"prompt": "the cat", "n_predict": 12, "temperature": 0, "n_probs": 2}
    whole = post(server, "/completion", body).json()
    r = post(server, "/completion", {**body, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_data(r)
    assert "[DONE]" not in events  # llama-server's /completion ends without it
    parts = [__import__("json").loads(e) for e in events]
    *partial, final = parts
    assert all(p["stop"] is False for p in partial) and final["stop"] is True
    assert "".join(p["content"] for p in partial) == whole["content"] and final["content"] == ""
    assert sum(len(p["tokens"]) for p in partial) == final["tokens_predicted"] == 12
    probs = [c for p in partial for c in p.get("completion_probabilities", [])]
    assert probs == whole["completion_probabilities"] and len(probs) == 12
    assert "completion_probabilities" not in final
    assert [c["id"] for c in probs] == [t for p in partial for t in p["tokens"]]


def test_completion_probabilities_are_llama_servers(server):
    raw = post(server, "/completion", {"prompt": "the cat", "n_predict": 6, "temperature": 0,
                                       "n_probs": 3}).json()["completion_probabilities"]
    assert len(raw) == 6 and set(raw[0]) == {"id", "token", "bytes", "logprob", "top_logprobs"}
    for c in raw:  # the raw log-softmax (llama-server's default): every token has a value
        assert c["logprob"] < 0 and len(c["top_logprobs"]) == 3
        assert c["top_logprobs"][0]["id"] == c["id"]  # greedy: the top logit
    post_sampling = post(server, "/completion", {
        "prompt": "the cat", "n_predict": 6, "temperature": 0, "n_probs": 3,
        "post_sampling_probs": True}).json()["completion_probabilities"]
    for c in post_sampling:  # q at temperature 0: one token, probability 1
        assert set(c) == {"id", "token", "bytes", "prob", "top_probs"}
        assert c["prob"] == 1.0 and [t["id"] for t in c["top_probs"]] == [c["id"]]


def test_completion_stop_words_and_response_fields(server):
    full = post(server, "/completion", {"prompt": "the cat", "n_predict": 24,
                                        "temperature": 0}).json()["content"]
    word = full[5:7]
    out = post(server, "/completion", {"prompt": "the cat", "n_predict": 24, "temperature": 0,
                                       "stop": [word]}).json()
    assert out["stop_type"] == "word" and out["stopping_word"] == word
    assert out["content"] == full[:full.index(word)]
    picked = post(server, "/completion", {"prompt": "the cat", "n_predict": 3,
                                          "response_fields": ["content", "timings/predicted_n",
                                                              "nothing"]}).json()
    # keyed by the whole path, as llama-server's json_get_nested_values
    assert set(picked) == {"content", "timings/predicted_n"} and picked["timings/predicted_n"] == 3


@pytest.mark.parametrize("fields,param", [
    ({"n_predict": "3"}, "n_predict"), ({"n_predict": 0}, "n_predict"),
    ({"repeat_penalty": 1.1}, "repeat_penalty"), ({"n_indent": 4}, "n_indent"),
    ({"t_max_predict_ms": 500}, "t_max_predict_ms"), ({"id_slot": 3}, "id_slot"),
    ({"n_probs": -2}, "n_probs"), ({"speculative": {"top_gap": -1}}, "speculative.top_gap"),
    ({"prompt": ["a", "b"], "stream": True}, "prompt"), ({"prompt": [999999]}, "prompt"),
    ({"lora": [{"id": 0, "scale": 1}]}, "lora"), ({"samplers": ["top_k"]}, "samplers"),
])
def test_completion_errors_are_llama_servers_naming_the_field(server, fields, param):
    llama_error(post(server, "/completion", {"prompt": "the cat", **fields}), 400, param)


def test_completion_neutral_and_ignored_fields_are_accepted(server):
    r = post(server, "/completion", {"prompt": "the cat", "n_predict": 2, "n_keep": 4,
                                     "id_slot": -1, "n_indent": 0, "t_max_predict_ms": -1,
                                     "repeat_penalty": 1.0, "cache_prompt": True, "verbose": True,
                                     "timings_per_token": False, "n_cache_reuse": 0})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 2, r.text


def test_native_errors_without_a_field(server):
    err = llama_error(post(server, "/completion", {"prompt": "x " * 2000}), 400)
    assert err["type"] == "exceed_context_size_error"
    r = httpx.post(server.url + "/completion", content=b"{bad",
                   headers={"content-type": "application/json"})
    assert "not valid JSON" in llama_error(r, 400)["message"]
    llama_error(post(server, "/completion", {}), 400, "prompt")
    llama_error(httpx.post(server.url + "/props", timeout=30), 501)


def test_tokenize_and_detokenize(server):
    ids = post(server, "/tokenize", {"content": "the cat"}).json()["tokens"]
    with_bos = post(server, "/tokenize", {"content": "the cat", "add_special": True}).json()
    assert with_bos["tokens"][1:] == ids and len(with_bos["tokens"]) == len(ids) + 1
    pieces = post(server, "/tokenize", {"content": "the cat", "with_pieces": True}).json()
    assert [p["id"] for p in pieces["tokens"]] == ids
    text = post(server, "/detokenize", {"tokens": ids}).json()["content"]
    # each token's piece, as llama-server's tokens_to_str (a SentencePiece word keeps its space)
    assert "".join(p["piece"] for p in pieces["tokens"]) == text and text.strip() == "the cat"
    assert post(server, "/tokenize", {"content": ["the", 42]}).json()["tokens"][-1] == 42
    assert post(server, "/tokenize", {}).json() == {"tokens": []}  # no content: no tokens
    assert post(server, "/detokenize", {}).json() == {"content": ""}
    llama_error(post(server, "/detokenize", {"tokens": [1, 10**6]}), 400, "tokens")
    llama_error(post(server, "/detokenize", {"tokens": ["a"]}), 400, "tokens.0")
    llama_error(post(server, "/tokenize", {"content": "x", "add_special": "yes"}), 400,
                "add_special")


def test_text_parts_reach_the_template_as_llama_server_gives_them(server):
    """The tiny template takes text: a user's text parts are joined with a newline; a continued
    (prefilled) assistant message's parts with a blank line, as llama-server continues one."""
    parts = [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]
    r = post(server, "/apply-template", {"messages": [{"role": "user", "content": parts},
                                                      {"role": "assistant", "content": parts}]})
    assert r.json() == {"prompt": "user: Wh\nill\nassistant:Wh\n\nill"}, r.text
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": parts}],
                                              "max_tokens": 2, "verbose": True})
    assert r.json()["__verbose"]["prompt"].endswith("user: Wh\nill\nassistant:"), r.text


def test_apply_template_renders_the_ggufs_template(server):
    r = post(server, "/apply-template", {"messages": [{"role": "system", "content": "Be brief."},
                                                      {"role": "user", "content": "hi"}]})
    assert r.json() == {"prompt": "system: Be brief.\nuser: hi\nassistant:"}, r.text
    llama_error(post(server, "/apply-template", {"messages": []}), 400, "messages")
    r = post(server, "/apply-template", {  # a template without tools: the generic format's
        "messages": [{"role": "user", "content": "hi"}],  # system message (test_toolcalls.py)
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]})
    assert r.status_code == 200 and r.json()["prompt"].startswith(
        "system: These tools are available, one per line as JSON:\n{\"name\": \"f\"")


def test_a_final_assistant_message_is_continued_as_llama_server_prefills(server):
    hi = [{"role": "user", "content": "hi"}]
    then = [*hi, {"role": "assistant", "content": "The"}]

    def prompt(**kw):
        return post(server, "/apply-template", kw).json()["prompt"]

    assert prompt(messages=then) == "user: hi\nassistant:The"  # left open: continued
    closed = prompt(messages=then, continue_final_message=False)
    assert closed.startswith("user: hi\nassistant: The\n") and closed.endswith("assistant:")
    assert prompt(messages=hi, add_generation_prompt=False) == "user: hi\n"
    llama_error(post(server, "/apply-template", {"messages": hi, "continue_final_message": True,
                                                 "add_generation_prompt": False}),
                400, "continue_final_message")
    # llama-server's (and vLLM's) explicit form, and both switches on refused as they refuse it
    assert prompt(messages=then, continue_final_message=True, add_generation_prompt=False) == \
        "user: hi\nassistant:The"
    for both in ({"add_generation_prompt": True}, {}):  # (true is add_generation_prompt's default)
        llama_error(post(server, "/apply-template", {"messages": then,
                                                     "continue_final_message": True, **both}),
                    400, "continue_final_message")
    # the chat decodes that prompt: its answer continues "The"
    r = post(server, "/v1/chat/completions", {"messages": then, "max_tokens": 3, "seed": 1,
                                              "temperature": 0}).json()
    alone = post(server, "/completion", {"prompt": "user: hi\nassistant:The", "n_predict": 3,
                                         "seed": 1, "temperature": 0}).json()
    assert r["choices"][0]["message"]["content"] == alone["content"]


def test_props_describe_the_server_without_its_paths(server, files):
    p = httpx.get(server.url + "/props", timeout=30).json()
    assert p["default_generation_settings"]["n_ctx"] == 1024
    assert p["default_generation_settings"]["params"]["n_predict"] == 16
    assert p["total_slots"] == 1 and p["model_alias"] == "ver"
    assert p["model_path"] == "ver.gguf" and str(files["ver"].parent) not in str(p)
    assert p["chat_template"] == CHAT_TEMPLATE and p["modalities"]["vision"] is False
    assert p["speculative"]["method"] == "cactus" and p["speculative"]["k"] == 4
    assert "cactus-gguf" in p["build_info"]


def test_native_endpoints_need_the_key_and_answer_llama_style(files):
    with LiveServer(files["ver"], "-t", "1", "--method", "none", "--api-key", "k3y") as s:
        for path in ("/completion", "/tokenize", "/detokenize", "/apply-template"):
            llama_error(httpx.post(s.url + path, json={}, timeout=30), 401)
        llama_error(httpx.get(s.url + "/props", timeout=30), 401)
        ok = httpx.post(s.url + "/tokenize", json={"content": "a"},
                        headers={"Authorization": "Bearer k3y"}, timeout=30)
        assert ok.status_code == 200 and ok.json()["tokens"]
    assert s.returncode == 0


def test_llama_servers_fields_are_refused_on_the_openai_endpoints_too(server):
    for field, value in [("n_indent", 2), ("min_keep", 3), ("lora", [{"id": 0, "scale": 1}]),
                         ("t_max_predict_ms", 100), ("grammar_lazy", True)]:
        r = post(server, "/v1/completions", {"prompt": "the cat", field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (field, r.text)
    r = post(server, "/v1/completions", {"prompt": "the cat", "max_tokens": 2, "n_indent": 0,
                                         "min_keep": 0, "lora": [], "t_max_predict_ms": -1})
    assert r.status_code == 200, r.text
