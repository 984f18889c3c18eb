"""The engine as a long-lived service: per-request settings, prefix KV reuse between requests,
one generation at a time across threads, interleaved streams kept apart, request validation.

Tiny random-weight models (float32, V = 281) that llama.cpp loads for real; one thread each.
"""
from __future__ import annotations

import dataclasses
import threading

import pytest

from cactus_gguf.errors import EngineBusyError, InputError
from cactus_gguf.options import Request

from support.harness import KvShadow, make_engine

PROMPTS = ["the cat sat on the mat", "hello world def f(a):", "the dog sat on the cat and"]


@pytest.fixture
def engine(tiny_pair):
    ver, dft = tiny_pair
    with make_engine(ver, dft, k=4, temp=0.9, context=None) as eng:
        yield eng


# ---- per-request settings ---------------------------------------------------------------------------

def test_a_request_never_changes_the_engine(engine):
    before = engine.defaults
    r = engine.generate(PROMPTS[0], n_predict=12, seed=1, k=2, method="sps", temperature=0.0)
    assert engine.defaults is before and engine.defaults.k == 4
    assert r.stats.n_drafted <= 2 * r.stats.n_steps
    # the same request given as an object or as overrides is the same generation
    req = engine.request(n_predict=12, seed=1, k=2, method="sps", temperature=0.0)
    assert engine.generate(PROMPTS[0], req, cache_prompt=False).tokens == r.tokens


def test_stop_as_a_string_is_one_stop_string_and_bad_arguments_are_clear(engine):
    want = engine.generate(PROMPTS[0], n_predict=40, seed=3, temperature=0.0)
    word = next(w for w in want.text.split() if len(w) >= 3)
    cut = engine.generate(PROMPTS[0], n_predict=40, seed=3, temperature=0.0, stop=word)
    assert cut.stop_reason == "stop" and cut.text == want.text[:want.text.index(word)]
    assert engine.generate(PROMPTS[0], n_predict=5, seed=3, stop=None).stop_reason == "length"
    with pytest.raises(InputError, match="stop must be a string or a list of strings"):
        engine.generate(PROMPTS[0], n_predict=5, stop=[1, 2])
    with pytest.raises(InputError, match="prompt must be a str or a sequence of token ids"):
        engine.generate(b"the cat", n_predict=5)
    with pytest.raises(InputError, match="unknown request option 'max_tokens'"):
        engine.generate(PROMPTS[0], max_tokens=5)
    with pytest.raises(InputError, match="top_p must be in"):
        engine.generate(PROMPTS[0], top_p=2.0)


# ---- prefix reuse -------------------------------------------------------------------------------------

def test_the_next_request_decodes_only_what_the_caches_lack(engine, monkeypatch):
    shadow = KvShadow.install(monkeypatch)
    engine.reset()
    ids = engine.tokenize(PROMPTS[0])
    first = engine.generate(PROMPTS[0], n_predict=20, seed=1)
    assert first.stats.n_prompt_tokens_reused == 0
    # the same prompt again: everything but the last prompt token is in both caches
    shadow.decodes.clear()
    again = engine.generate(PROMPTS[0], n_predict=20, seed=1)
    assert again.stats.n_prompt_tokens_reused == len(ids) - 1
    assert again.stats.n_draft_prompt_tokens_reused == len(ids) - 1
    assert again.tokens == first.tokens
    assert all(n_logits > 0 for _, _, n_logits in shadow.decodes)  # no prefill decode at all
    # a continuation of the conversation: the previous prompt and answer are reused
    follow = engine.tokenize(PROMPTS[0]) + again.tokens + engine.tokenize(" and then")[1:]
    r = engine.generate(follow, n_predict=10, seed=2)
    assert r.stats.n_prompt_tokens_reused == len(ids) + len(again.tokens) - 1


@pytest.mark.parametrize("method,k", [("none", 4), ("cactus", 4), ("sps", 1), ("cactus", 8)])
def test_greedy_output_is_the_same_with_and_without_reuse(tiny_pair, method, k):
    ver, dft = tiny_pair
    history = []
    with make_engine(ver, dft, k=k, method=method, temp=0.0) as warm, \
            make_engine(ver, dft, k=k, method=method, temp=0.0) as cold:
        text = ""
        for turn in ("the cat", " sat on the", " mat and the dog", " hello"):
            text += turn
            a = warm.generate(text, n_predict=24, seed=0)
            b = cold.generate(text, n_predict=24, seed=0, cache_prompt=False)
            history.append(a.stats.n_prompt_tokens_reused)
            assert a.tokens == b.tokens, turn
            text += a.text
    assert history[0] == 0 and all(n > 0 for n in history[1:])


def test_a_chat_turn_prefills_only_the_new_messages(tiny_pair):
    ver, dft = tiny_pair  # (tiny models have no chat template: the turns are plain text)
    with make_engine(ver, dft, k=3, temp=0.0) as eng:
        convo = ""
        reused = []
        for turn in ("hello", "the cat", "def f(a):"):
            convo += f"<s>user: {turn}\nassistant:"
            r = eng.generate(convo, n_predict=8, seed=0)
            reused.append((r.stats.n_prompt_tokens_reused, r.stats.n_prompt_tokens))
            convo += r.text + "\n"
    # each later turn reuses all of the previous turn's prompt and answer
    assert reused[0][0] == 0
    for (n_reused, n_prompt), (_, n_before) in zip(reused[1:], reused):
        assert n_before <= n_reused < n_prompt


# ---- one generation at a time ----------------------------------------------------------------------

def test_two_threads_on_one_engine_are_served_one_at_a_time(engine):
    jobs = [(PROMPTS[i % 3], 40, 10 + i) for i in range(6)]
    want = {seed: engine.generate(p, n_predict=n, seed=seed, cache_prompt=False).tokens
            for p, n, seed in jobs}
    got, errors = {}, []

    def worker(mine):
        try:
            for p, n, seed in mine:
                got[seed] = engine.generate(p, n_predict=n, seed=seed).tokens
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(jobs[i::2],)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert got == want


def test_a_caller_that_will_not_wait_gets_engine_busy(engine):
    inside, release = threading.Event(), threading.Event()

    def slow(piece):
        inside.set()
        release.wait(30)

    t = threading.Thread(target=lambda: engine.generate(PROMPTS[0], n_predict=30, seed=0,
                                                        on_text=slow))
    t.start()
    assert inside.wait(30)
    with pytest.raises(EngineBusyError, match="serving another generation"):
        engine.generate(PROMPTS[1], n_predict=5, wait=False)
    release.set()
    t.join(60)
    # seeded: an unseeded tiny model can sample its end-of-generation token within 5 tokens
    assert engine.generate(PROMPTS[1], n_predict=5, seed=3, wait=False).stats.n_tokens == 5


def test_interleaved_streams_and_a_generate_in_between_keep_their_own_text(engine):
    solo = {s: engine.generate(PROMPTS[s % 3], n_predict=30, seed=s, cache_prompt=False)
            for s in (1, 2, 3)}
    a = engine.stream(PROMPTS[1], n_predict=30, seed=1)
    b = engine.stream(PROMPTS[2], n_predict=30, seed=2)
    pieces = {1: [], 2: []}
    pieces[1].append(next(a))
    pieces[2].append(next(b))
    middle = engine.generate(PROMPTS[0], n_predict=30, seed=3)  # takes the caches over
    for x, key in ((a, 1), (b, 2)):
        pieces[key] += list(x)
    assert middle.tokens == solo[3].tokens
    for s, stream in ((1, a), (2, b)):
        assert stream.result.tokens == solo[s].tokens
        assert "".join(pieces[s]) == solo[s].text


def test_an_abandoned_stream_leaves_the_engine_consistent(engine):
    want = engine.generate(PROMPTS[2], n_predict=25, seed=4, cache_prompt=False)
    s = engine.stream(PROMPTS[0], n_predict=200, seed=9)
    next(s), next(s)
    s.close()
    del s
    got = engine.generate(PROMPTS[2], n_predict=25, seed=4)
    assert got.tokens == want.tokens
    assert engine.verifier.tokens == engine.tokenize(PROMPTS[2]) + got.tokens[:-1]


def test_request_objects_are_frozen_and_validated():
    r = Request(k=3)
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'k'"):
        r.k = 5  # frozen
    assert r.replace(k=5).k == 5 and r.k == 3
    with pytest.raises(InputError, match=r"draft_min must be in \[0, k=3\], got 4"):
        r.replace(draft_min=4)


def test_float_token_ids_are_refused(tiny_pair):
    with make_engine(*tiny_pair) as eng:
        with pytest.raises(InputError, match=r"prompt token ids must be integers, got 1.5"):
            eng.generate([1, 1.5], n_predict=2)
        with pytest.raises(InputError, match=r"got True"):
            eng.generate([1, True], n_predict=2)
        assert eng.generate([1, 259], n_predict=2, seed=0).stats.n_prompt_tokens == 2


def test_stream_chunks_say_where_each_piece_of_text_came_from(engine):
    want = engine.generate(PROMPTS[0], n_predict=40, seed=5, cache_prompt=False)
    s = engine.stream(PROMPTS[0], n_predict=40, seed=5, cache_prompt=False)
    chunks = list(s.chunks())
    assert "".join(c.text for c in chunks) == want.text == s.result.text
    sources = [src for c in chunks for _, src in c.segments]
    for c in chunks:
        assert "".join(t for t, _ in c.segments) == c.text
    # "verifier": a step without drafts, here only the last token (n_predict leaves no room)
    assert set(sources[:-1]) <= {"draft", "residual", "bonus"} and "draft" in sources
    assert sources[-1] in {"draft", "residual", "bonus", "verifier"}
    # one chunk per step at most: a step emits AL + 1 tokens, so at least as many drafts as steps
    assert len(chunks) <= s.result.stats.n_steps
    alone = engine.stream(PROMPTS[0], n_predict=10, seed=5, method="none")
    assert {src for c in alone.chunks() for _, src in c.segments} == {"verifier"}


def test_a_generation_cut_short_during_the_prompt_times_from_its_start(tiny_pair, monkeypatch):
    """A Ctrl-C while the prompt is processed: the partial result's seconds run from the request's
    start (they were the time since boot: the decode clock had not started)."""
    import time as _time

    from cactus_gguf.llama import Context

    with make_engine(*tiny_pair, k=2) as eng:
        stream = eng.stream("the cat sat on the mat", n_predict=8, seed=1)
        decode = Context.decode

        def interrupted(self, tokens, n_logits=1, **kw):
            _time.sleep(0.05)
            raise KeyboardInterrupt

        monkeypatch.setattr(Context, "decode", interrupted)
        with pytest.raises(KeyboardInterrupt):
            next(stream)
        monkeypatch.setattr(Context, "decode", decode)
        stats = stream.partial().stats
    assert stats.decode_seconds == 0.0 and stats.other_seconds == 0.0
    assert 0.05 <= stats.prefill_seconds == stats.answer_seconds < 5.0


def test_a_cancel_stops_a_prompt_inside_its_chunk(tiny_pair):
    """A long prompt chunk is one llama_decode: the cancel check is asked inside it (llama.cpp's
    abort callback, after each graph node), not only between chunks, so a cancel stops the
    chunk in progress (issue 42 item 2). The chunk is rolled back; the engine goes on."""
    from support.harness import ctx

    prompt = "the cat sat on the mat " * 20  # one chunk: n_batch 512
    with make_engine(*tiny_pair, k=2, temp=0.0, context=ctx(n_ctx=1024, n_batch=512)) as eng:
        asked = []

        def cancel() -> bool:
            asked.append(eng.verifier.n_past)  # what the cache held when it was asked
            return True

        r = eng.generate(prompt, cancel=cancel, n_predict=8)
        assert (r.stop_reason, r.message) == ("cancelled", "cancelled during prompt processing")
        assert asked[0] == 0 and eng.verifier.n_past == 0  # asked mid-decode; rolled back
        assert eng.draft.n_past == 0 and r.tokens == []
        # asked at every graph node of a chunk (a decode of the whole prompt asks many times)
        count = []
        eng.generate(prompt, cancel=lambda: count.append(1) and False, n_predict=1,
                     cache_prompt=False)
        assert len(count) > 20
        after = eng.generate(prompt, n_predict=8)
        fresh = eng.generate(prompt, n_predict=8, cache_prompt=False)
        assert after.tokens == fresh.tokens and len(after.tokens) == 8


def test_context_shift_goes_on_past_a_full_context_as_the_verifier_alone(tmp_path):
    """--context-shift (llama-server's): at n_ctx 256 a 600-token answer shifts three times
    (keep BOS, discard half of the rest), and speculation (greedy and SpS at temperature 0) gives
    the verifier alone's tokens under the same shifts; without it the answer stops at the full
    context. Another generation reuses nothing past the kept BOS of a shifted cache."""
    from cactus_gguf.options import LoadOptions, Request
    from cactus_gguf.speculative import Engine
    from support.tiny_gguf import EOS, write_llama

    ver = write_llama(tmp_path / "v.gguf", seed=11, zero_output_rows=[EOS])  # never ends
    dft = write_llama(tmp_path / "d.gguf", seed=11, noise=0.5, noise_seed=12,
                      zero_output_rows=[EOS])
    runs = {}
    for method in ("none", "greedy", "sps"):
        req = Request(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, method=method, k=4,
                      n_predict=600)
        load = LoadOptions(n_ctx=256, n_batch=64, n_threads=1, context_shift=True)
        with Engine(ver, dft if method != "none" else None, load, defaults=req) as e:
            r = e.generate("the cat sat on")
            assert (len(r.tokens), r.stop_reason, r.stats.n_context_shifts) == (600, "length", 3)
            assert e.verifier.n_past == 234  # 256 - 1 - 127 + 106 more
            again = e.generate("the cat sat on", n_predict=1)
            assert again.stats.n_prompt_tokens_reused == 1  # the kept BOS only
        runs[method] = r.tokens
    assert runs["greedy"] == runs["none"] and runs["sps"] == runs["none"]
    load = LoadOptions(n_ctx=256, n_batch=64, n_threads=1)
    with Engine(ver, None, load, defaults=req.replace(method="none")) as e:
        r = e.generate("the cat sat on")
    assert r.stop_reason == "length" and r.stats.n_context_shifts == 0 and len(r.tokens) < 256
    # the same answer up to the first shift (the last token, sampled from the full context,
    # comes after it with the shift)
    assert r.tokens[:-1] == runs["none"][:len(r.tokens) - 1]
