"""Fill-in-the-middle (cactus_gguf/prompting/fim.py, server/fim.py): the prompt token by token against
llama-server's layout, its trimming, the early stops (t_max_predict_ms, n_indent), llama-server's
``samplers``, and ``/infill`` and ``/v1/completions`` with ``suffix`` on a tiny FIM model over
real HTTP."""
from __future__ import annotations

import json

import httpx
import pytest

from cactus_gguf.errors import InputError
from cactus_gguf.prompting.fim import ExtraChunk, FimTokens, fim_tokens, infill_prompt
from cactus_gguf.llama.model import Model
from cactus_gguf.server.fim import _LineLimits, sampler_overrides
from support.server import LiveServer, client, serving, sse_events
from support.tiny_gguf import BOS, write_llama

# Qwen2.5-Coder's FIM tokens: llama.cpp finds them by their text (llama-vocab.cpp)
FIM = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|repo_name|>",
       "<|file_sep|>"]
PRE, SUF, MID, PAD, REP, SEP = range(3, 9)  # their ids: right after </s>


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("fim")
    return {"fim": write_llama(d / "fim.gguf", seed=11, extra_control=FIM),
            "dft": write_llama(d / "dft.gguf", seed=11, extra_control=FIM, noise=0.1,
                               noise_seed=12),
            "plain": write_llama(d / "plain.gguf", seed=11)}


@pytest.fixture(scope="module")
def model(files):
    m = Model(files["fim"])
    yield m
    m.close()


def test_the_fim_tokens_are_the_vocabularys(model, files):
    assert fim_tokens(model) == FimTokens(PRE, SUF, MID, REP, SEP)
    plain = Model(files["plain"])
    try:
        with pytest.raises(InputError, match="no fill-in-the-middle prefix / suffix / middle"):
            fim_tokens(plain)
    finally:
        plain.close()


def tok(model, text):
    return model.tokenize(text, add_special=False, parse_special=False)


def test_the_prompt_is_llama_servers_layout(model):
    ids = infill_prompt(model, "def f(", "):\n", extra=[ExtraChunk("a.py", "x = 1"),
                                                        ExtraChunk("", "y")], prompt="a")
    assert ids == ([REP] + tok(model, "myproject\n")
                   + [SEP] + tok(model, "a.py\n") + tok(model, "x = 1")
                   + [SEP] + tok(model, "tmp\n") + tok(model, "y")  # a chunk without a name
                   + [SEP] + tok(model, "filename\n")
                   + [BOS, PRE] + tok(model, "def f(") + tok(model, "a")  # prompt ends the prefix
                   + [SUF] + tok(model, "):\n") + [MID])
    # token ids may stand for text (llama-server's mixed prompts)
    assert infill_prompt(model, [PAD, "x"], "")[-6:] == [PRE, PAD] + tok(model, "x") + [SUF, MID]


def test_the_fim_part_fits_a_batch_and_the_extra_keeps_its_newest_tokens(model):
    prefix, suffix = "a" * 300, "b" * 300  # one token per "a" / "b" after the first
    p, s = tok(model, prefix), tok(model, suffix)
    ids = infill_prompt(model, prefix, suffix, n_batch=64, prompt="")
    head = ids.index(PRE)
    # 3/4 of the batch for the prefix's end, 64/4 - 2 for the suffix's start
    assert ids[head + 1:ids.index(SUF)] == p[-48:]
    assert ids[ids.index(SUF) + 1:-1] == s[:14]
    extra = [ExtraChunk("f.py", "c" * 500)]
    whole = infill_prompt(model, "x", "y", extra=extra)
    cut = infill_prompt(model, "x", "y", extra=extra, n_batch=64, n_ctx=256, n_predict=32)
    n_extra = 256 - 64 - 2 * 32
    fim_part = whole[whole.index(BOS):]
    assert cut == whole[whole.index(BOS) - n_extra:whole.index(BOS)] + fim_part


def test_early_stops_follow_llama_server(monkeypatch):
    # n_indent: a later line indented less ends the text before its first character
    lim = _LineLimits(None, 4)
    got = "".join(lim.take(p) for p in ["x = 1\n", "    y = 2\n  ", " ", "z\n", "more"])
    assert got == "x = 1\n    y = 2\n   " and lim.stop_type == "limit"
    assert "".join(_LineLimits(None, 4).take(p) for p in ["a\n", "\n", "    b"]) == "a\n\n    b"
    # t_max_predict_ms: the first newline after the time limit ends the text
    now = [100.0]
    monkeypatch.setattr("cactus_gguf.server.fim.time.perf_counter", lambda: now[0])
    lim = _LineLimits(500, None)
    assert lim.take("a\nb") == "a\nb"  # within the limit: a newline is fine
    now[0] = 100.7
    assert lim.take("cd") == "cd" and lim.stop_type is None  # past it, but no newline yet
    assert lim.take("e\nf\ng") == "e\n" and lim.stop_type == "limit"
    assert lim.take("more") == ""


def test_samplers_are_honoured_in_this_engines_order():
    assert sampler_overrides(None) == {}
    assert sampler_overrides(["top_k", "top_p", "infill"]) == {"min_p": 0.0, "temperature": 1.0}
    assert sampler_overrides([]) == {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "temperature": 1.0}
    assert sampler_overrides("kpmt") == {}
    for bad, what in ((["top_p", "top_k"], "in that order"), (["dry"], "'dry' is not applied"),
                      ("kx", "'x' is not applied"), (3, "must be a list")):
        with pytest.raises(InputError, match=what) as e:
            sampler_overrides(bad)
        assert e.value.param == "samplers"


# ---- the server ---------------------------------------------------------------------------------

# what llama.vscode sends (src/llama-server.ts: createRequestPayload), with a ring-buffer chunk
VSCODE = {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n\nprint(add(1, 2))\n",
          "input_extra": [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}],
          "prompt": "return", "n_predict": 24, "top_k": 40, "top_p": 0.99, "stream": False,
          "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
          "t_max_prompt_ms": 500, "t_max_predict_ms": 1000, "n_indent": 4}


@pytest.fixture(scope="module")
def server(files):
    with serving(files["fim"], files["dft"], "-t", "1", "-c", "1024", "-k", "4",
                 "--temp", "0.8") as s:
        yield s


def test_infill_answers_as_llama_server(server):
    r = httpx.post(server.url + "/infill", json={**VSCODE, "seed": 3}, timeout=60)
    assert r.status_code == 200, r.text
    a = r.json()
    for key in ("index", "content", "tokens", "id_slot", "stop", "model", "tokens_predicted",
                "tokens_evaluated", "generation_settings", "prompt", "has_new_line", "truncated",
                "stop_type", "stopping_word", "tokens_cached", "timings", "speculative"):
        assert key in a, key
    assert a["stop"] is True and a["stop_type"] in ("eos", "limit")
    assert 0 < a["tokens_predicted"] <= 24
    assert a["prompt"].startswith("<|repo_name|>") and a["prompt"].endswith("<|fim_middle|>")
    assert "<|file_sep|> util.py" in a["prompt"]
    # the caches hold every token generated; an early stop returns those of its text only
    assert a["tokens_cached"] >= a["tokens_evaluated"] + a["tokens_predicted"]
    if a["stop_type"] != "limit":
        assert a["tokens_cached"] == a["tokens_evaluated"] + a["tokens_predicted"]
    assert a["generation_settings"]["samplers"] == ["top_k", "top_p"]  # as llama-server: no temp
    assert a["generation_settings"]["temperature"] == 1.0
    t = a["timings"]
    assert t["predicted_n"] == a["tokens_predicted"] and t["prompt_n"] + t["cache_n"] == \
        a["tokens_evaluated"]
    assert a["speculative"]["method"] == "cactus" and t["draft_n"] > 0  # speculation is on
    # the next completion of the same file reuses the cached prefix
    again = httpx.post(server.url + "/infill", json={**VSCODE, "input_suffix": "\n", "seed": 3},
                       timeout=60).json()
    assert again["timings"]["cache_n"] > a["tokens_evaluated"] // 2
    # response_fields: llama-server's paths, keyed by the path
    only = httpx.post(server.url + "/infill", json={**VSCODE, "response_fields": [
        "content", "timings/prompt_n", "nothing"]}, timeout=60).json()
    assert set(only) == {"content", "timings/prompt_n"}


def test_infill_streams_llama_servers_events(server):
    with httpx.stream("POST", server.url + "/infill", timeout=60,
                      json={**VSCODE, "stream": True, "n_indent": 0, "t_max_predict_ms": 0,
                            "seed": 5}) as r:
        assert r.status_code == 200
        events = [json.loads(e) for e in sse_events(r)]  # every one JSON: no [DONE]
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    whole = httpx.post(server.url + "/infill", json={**VSCODE, "n_indent": 0,
                                                     "t_max_predict_ms": 0, "seed": 5},
                       timeout=60).json()
    assert "".join(e["content"] for e in events) == whole["content"]


def test_infill_streams_llama_servers_telemetry(server):
    """``return_progress``: an empty partial with ``prompt_progress`` before each ``-b`` chunk
    of the prompt and once it is processed; ``timings_per_token``: each event's timings."""
    with httpx.stream("POST", server.url + "/infill", timeout=60,
                      json={**VSCODE, "stream": True, "n_indent": 0, "t_max_predict_ms": 0,
                            "cache_prompt": False, "seed": 5, "return_progress": True,
                            "timings_per_token": True}) as r:
        assert r.status_code == 200
        events = [json.loads(e) for e in sse_events(r)]
    progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
    total = events[-1]["tokens_evaluated"]
    assert progress[0]["processed"] == progress[0]["cache"] == 0
    assert progress[-1]["processed"] == total and len(progress) >= 2
    text = [e for e in events[:-1] if e["content"]]
    assert text and all(e["timings"]["prompt_n"] == total for e in text)
    predicted = [e["timings"]["predicted_n"] for e in text]
    assert predicted == sorted(predicted) and 0 < predicted[-1]


def test_a_warm_up_request_fills_the_cache_and_answers_nothing(server):
    warm = {**VSCODE, "input_prefix": "class A:\n", "input_suffix": "", "n_predict": 0,
            "samplers": [], "t_max_predict_ms": 1}
    a = httpx.post(server.url + "/infill", json=warm, timeout=60).json()
    assert a["content"] == "" and a["tokens_predicted"] == 0
    b = httpx.post(server.url + "/infill", json={**warm, "n_predict": 8}, timeout=60).json()
    assert b["timings"]["cache_n"] >= a["tokens_evaluated"] - 1


def test_completions_take_a_suffix(server):
    c = client(server)
    r = c.completions.create(model="m", prompt="def add(a, b):\n    return", suffix="\n",
                             max_tokens=8, seed=1, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens > 0
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="m", prompt="def add(a, b):\n    return", suffix="\n", max_tokens=8, seed=1,
        temperature=0, stream=True) if ch.choices)
    assert streamed == r.choices[0].text
    plain = c.completions.create(model="m", prompt="def add(a, b):\n    return", max_tokens=8,
                                 seed=1, temperature=0)
    assert plain.usage.prompt_tokens < r.usage.prompt_tokens  # the FIM layout is longer


BAD = [({"input_suffix": "x"}, "input_prefix"), ({"input_prefix": "x"}, "input_suffix"),
       ({**VSCODE, "input_extra": [{"filename": "a"}]}, "input_extra.0.text"),
       ({**VSCODE, "samplers": ["dry", "top_k"]}, "samplers"),
       ({**VSCODE, "n_indent": -1}, "n_indent"),
       ({**VSCODE, "t_max_predict_ms": -5}, "t_max_predict_ms"),
       ({**VSCODE, "repeat_penalty": 1.1}, "repeat_penalty")]


@pytest.mark.parametrize("body,param", BAD, ids=[p for _, p in BAD])
def test_bad_infill_requests_are_a_400_naming_the_field(server, body, param):
    r = httpx.post(server.url + "/infill", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_a_model_without_fim_tokens_is_a_one_line_400(files):
    with LiveServer(files["plain"], "-t", "1", "--method", "none") as s:
        r = httpx.post(s.url + "/infill", json=VSCODE, timeout=60)
        assert r.status_code == 400 and "no fill-in-the-middle" in r.json()["error"]["message"]
        assert "\n" not in r.json()["error"]["message"]
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "a", "suffix": "b"}, timeout=60)
        assert r.status_code == 400 and "no fill-in-the-middle" in r.json()["error"]["message"]
    assert s.returncode == 0


def test_an_early_stop_reports_the_tokens_of_the_text_it_returns(model, monkeypatch):
    """Issue 52 item 5: a cut inside a speculative step trimmed its text, not its ids: content
    "if n == 0:\n" with every generated token in ``tokens``, ``tokens_predicted`` and
    ``timings.predicted_n``. Now those are the tokens of the text returned (t_max_predict_ms and
    n_indent alike); ``tokens_cached`` stays what the caches hold."""
    from cactus_gguf.options import Request
    from cactus_gguf.server.fim import InfillRequest, _Infill
    from cactus_gguf.stats import GenerationResult, GenerationStats

    whole = "if n == 0:\n    return 1\nx = 2\n"
    ids = [9 + b for b in whole.encode()]  # byte tokens (after the 6 FIM controls)
    assert b"".join(model.token_to_piece(t) for t in ids) == whole.encode()
    result = GenerationResult(text=whole, tokens=ids, stop_reason="length", seed=0,
                              stats=GenerationStats(n_tokens=len(ids), decode_seconds=0.5))
    now = [10.0]
    monkeypatch.setattr("cactus_gguf.server.fim.time.perf_counter", lambda: now[0])
    for limits, pieces, text in (
            (_LineLimits(100, None), ["if n", whole[4:]], "if n == 0:\n"),
            (_LineLimits(None, 4), [whole, ""], "if n == 0:\n    return 1\n")):
        sent = limits.take(pieces[0])
        now[0] += 1.0  # past t_max_predict_ms
        sent += limits.take(pieces[1])
        assert sent == text and limits.stop_type == "limit"
        body = InfillRequest(input_prefix="", input_suffix="", return_tokens=True)
        shape = _Infill(body, Request(), "m", "p", 7, lambda r: {}, model.token_to_piece)
        out = shape.final(sent, result, limits, "")
        n = len(text)
        assert out["content"] == text and out["tokens"] == ids[:n]
        assert out["tokens_predicted"] == out["timings"]["predicted_n"] == n
        # the first token left out, as llama-server does (stats/table.py predicted_per_token_ms)
        assert out["timings"]["predicted_per_token_ms"] == pytest.approx(500.0 / (n - 1))
        assert out["tokens_cached"] == 7 + len(ids)
