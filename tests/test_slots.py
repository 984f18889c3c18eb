"""Slots (``--parallel N``): N sequences of one verifier and one draft context, generations served
side by side (speculative/slots.py, llama/context.py "Sequences", server/worker.py).

What must hold: a slot is its own sequence (its n_ctx is n_ctx / N, another slot's decodes change
none of its logits); N generations interleaved step by step give exactly the tokens each gives
alone, for every rule, sampled or greedy, on KV-only and hybrid (recurrent) models and on the real
pair; abandoning one leaves the others' tokens unchanged; a request lands on the free slot that
shares the longest prefix with it, or the one it names; through the server N requests run at once,
/slots and /props show the N slots, and a slot's cache is saved, restored into another and erased.
"""
from __future__ import annotations

import threading
import time

import httpx
import numpy as np
import pytest

from cactus_gguf import Engine
from cactus_gguf.errors import ContextLengthError, InputError
from cactus_gguf.llama import Context, ContextOptions
from cactus_gguf.options import LoadOptions
from cactus_gguf.speculative.together import DONE
from support.harness import assert_greedy_equal
from support.server import serving, tiny_chat_pair
from support.tiny_gguf import write_llama, write_qwen35

#: the largest top-two logit gap a batch shape's rounding flips on the Q4_K_M pair
#: (docs/behaviour.md "Greedy equivalence": up to ~0.5 logit between batch shapes)
QUANTIZED_TIE_GAP = 0.6
PROMPTS = ["hello world the", "a b c d e f", "the cat sat on", "one two three four five six seven"]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    d = tmp_path_factory.mktemp("slots")
    return {
        "llama": (write_llama(d / "v.gguf", seed=11, logit_scale=2.0),
                  write_llama(d / "d.gguf", seed=11, logit_scale=2.0, noise=0.5, noise_seed=12)),
        "hybrid": (write_qwen35(d / "hv.gguf", seed=11),
                   write_qwen35(d / "hd.gguf", seed=11, noise=0.5, noise_seed=12)),
    }


def interleaved(engine: Engine, prompts, **kw) -> list:
    """Every prompt's generation, one engine call of each in turn (what the server's worker
    does with as many jobs as slots); their results."""
    streams = [engine.stream(p, **kw) for p in prompts]
    steps = [s.steps() for s in streams]
    live = list(range(len(streams)))
    while live:
        for i in list(live):
            if next(steps[i], StopIteration) is StopIteration:
                live.remove(i)
    return [s.result for s in streams]


# ---- the context: sequences ----------------------------------------------------------------------

def test_each_sequence_has_n_ctx_over_n_positions_and_its_own_logits(pairs):
    ver, _ = pairs["llama"]
    with Context.load(ver, context_options=ContextOptions(n_ctx=256, n_batch=64)) as alone:
        want = alone.decode([1, 40, 41, 42], n_logits=1)[0].copy()
    with Context.load(ver, context_options=ContextOptions(n_ctx=1024, n_batch=64,
                                                          n_parallel=4)) as ctx:
        seqs = [ctx] + [ctx.sequence(i) for i in (1, 2, 3)]
        assert [s.n_ctx for s in seqs] == [256] * 4 and [s.seq_id for s in seqs] == [0, 1, 2, 3]
        assert ctx.sequence(2) is seqs[2]
        seqs[1].decode([1, 50, 51, 52, 53, 54], n_logits=0)  # another sequence's tokens first
        got = seqs[3].decode([1, 40, 41, 42], n_logits=1)[0].copy()
        np.testing.assert_array_equal(got, want)
        seqs[3].truncate(2)
        seqs[1].clear()  # one sequence's clear leaves the others
        assert seqs[3].n_past == 2 and seqs[3].kv_pos_max() == 1 and seqs[1].kv_pos_max() == -1
        np.testing.assert_array_equal(seqs[3].decode([41, 42], n_logits=1)[0], want)
        with pytest.raises(InputError, match="sequence 4 of a context of 4"):
            ctx.sequence(4)


# ---- the engine: N generations interleaved --------------------------------------------------------

@pytest.mark.parametrize("kind", ["llama", "hybrid"])
@pytest.mark.parametrize("method,temperature", [("sps", 0.0), ("cactus", 0.0), ("greedy", 0.0),
                                                ("sps", 0.8), ("cactus", 0.8)])
def test_interleaved_generations_give_each_one_its_tokens_alone(pairs, kind, method, temperature):
    ver, dft = pairs[kind]
    kw = dict(n_predict=40, seed=3, k=4, temperature=temperature, method=method)
    with Engine(ver, dft, LoadOptions(n_ctx=2048, n_parallel=4, n_threads=1)) as e:
        alone = [e.generate(p, **kw) for p in PROMPTS]  # one at a time (each on a free slot)
        together = interleaved(e, PROMPTS, **kw)
    assert [r.tokens for r in together] == [r.tokens for r in alone]
    assert sum(len(r.tokens) for r in alone) > 60  # (not a run of immediate ends)
    assert sum(r.stats.n_drafted for r in together) > 0


def test_each_slot_has_its_own_mtp_head(tmp_path):
    ver = write_qwen35(tmp_path / "mtp.gguf", seed=11, n_nextn=1, mimic=0.3)
    kw = dict(n_predict=30, seed=4, k=3, temperature=0.8, method="sps", drafter="mtp")
    with Engine(ver, None, LoadOptions(n_ctx=1024, n_parallel=3, n_threads=1),
                load_mtp=True) as e:
        assert len({id(s.mtp) for s in e.slots}) == 3
        alone = [e.generate(p, **kw) for p in PROMPTS[:3]]
        got = interleaved(e, PROMPTS[:3], **kw)
        assert all(s.mtp.follows for s in e.slots)
    assert [r.tokens for r in got] == [r.tokens for r in alone]
    assert all(r.stats.n_accepted > 0 for r in got)


def test_more_generations_than_slots_share_one_and_keep_their_tokens(pairs):
    ver, dft = pairs["hybrid"]  # the shared slot's caches are restored: recurrent state too
    kw = dict(n_predict=30, seed=5, k=3, temperature=0.8, method="sps")
    prompts = PROMPTS + ["seven eight nine"]
    with Engine(ver, dft, LoadOptions(n_ctx=1024, n_parallel=2, n_threads=1)) as e:
        alone = [e.generate(p, **kw).tokens for p in prompts]
        assert [r.tokens for r in interleaved(e, prompts, **kw)] == alone


def test_abandoning_a_generation_frees_its_slot_and_changes_no_other(pairs):
    ver, dft = pairs["llama"]
    kw = dict(n_predict=40, seed=3, k=4, temperature=0.8, method="cactus")
    with Engine(ver, dft, LoadOptions(n_ctx=1024, n_parallel=2, n_threads=1)) as e:
        want = e.generate(PROMPTS[1], **kw).tokens
        first, second = e.stream(PROMPTS[0], **kw), e.stream(PROMPTS[1], **kw)
        assert (first.slot, second.slot) != (0, 0) and first.slot != second.slot
        a, b = first.steps(), second.steps()
        for _ in range(3):
            next(a), next(b)
        first.close()  # the client left
        assert not e.slots[first.slot].busy and e.slots[second.slot].busy
        for _ in b:
            pass
        assert second.result.tokens == want
        third = e.stream(PROMPTS[2], **kw)  # the freed slot serves the next one
        assert third.slot == first.slot
        third.close()


def test_a_generation_takes_the_free_slot_sharing_its_prompt_or_the_one_it_names(pairs):
    ver, dft = pairs["llama"]
    with Engine(ver, dft, LoadOptions(n_ctx=1024, n_parallel=3, n_threads=1)) as e:
        for slot, prompt in ((0, PROMPTS[0]), (1, PROMPTS[1]), (2, PROMPTS[2])):
            assert e.generate(prompt, n_predict=4, seed=1, id_slot=slot).tokens
        assert [s.verifier.n_past > 0 for s in e.slots] == [True] * 3
        r = e.stream(PROMPTS[1] + " and more", n_predict=4, seed=1)
        assert r.slot == 1  # the longest shared prefix
        for _ in r.steps():
            pass
        assert r.result.stats.n_prompt_tokens_reused >= len(e.tokenize(PROMPTS[1])) - 1
        with pytest.raises(InputError, match=r"id_slot 3 is not a slot: this server has 3 "
                                             r"\(0 \.\. 2"):
            e.generate("x", n_predict=2, id_slot=3)
        n_ctx = e.verifier.n_ctx
        with pytest.raises(ContextLengthError, match=rf"a slot holds {n_ctx} \(n_ctx "
                                                     rf"{3 * n_ctx} / n_parallel 3\)"):
            e.generate([40] * (n_ctx + 1), n_predict=2)


def test_slot_caches_save_restore_into_another_slot_and_erase(pairs, tmp_path):
    ver, dft = pairs["llama"]
    with Engine(ver, dft, LoadOptions(n_ctx=1024, n_parallel=2, n_threads=1)) as e:
        r = e.generate(PROMPTS[3], n_predict=8, seed=1, id_slot=1)
        n_tokens, n_bytes = e.save_cache(tmp_path / "s1.bin", 1)
        assert n_tokens == e.slots[1].verifier.n_past > len(r.tokens) and n_bytes > 0
        assert e.restore_cache(tmp_path / "s1.bin", 0)[0] == n_tokens
        assert e.slots[0].verifier.tokens == e.slots[1].verifier.tokens
        again = e.generate(PROMPTS[3], n_predict=8, seed=1, id_slot=0)
        assert again.tokens == r.tokens
        assert again.stats.n_prompt_tokens_reused == len(e.tokenize(PROMPTS[3])) - 1
        assert e.erase_cache(1) == n_tokens and e.slots[1].verifier.n_past == 0
        assert e.slots[0].verifier.n_past > 0


# ---- the real pair --------------------------------------------------------------------------------

def test_four_greedy_answers_verified_together_on_the_real_pair_equal_each_alone(qwen_pair):
    ver, dft = qwen_pair
    prompts = ["def fib(n):", "# sort a list in Python\n", "import os\n\ndef list_files(",
               "The capital of France is"]
    for method in ("sps", "cactus", "greedy"):
        with Engine(ver, dft, LoadOptions(n_ctx=2048, n_parallel=4)) as e:
            kw = dict(n_predict=12, seed=1, k=3, temperature=0.0, method=method)
            alone = [e.generate(p, **kw).tokens for p in prompts]
            e.reset()  # nothing reused: each prompt decoded again beside the others
            got = together(e, prompts, **kw)  # as the server runs them: one batch a round
            assert sum(r.stats.n_shared_steps for r in got) >= 6, method
            ids = [e.tokenize(p) for p in prompts]
        for r, want, p in zip(got, alone, ids):  # (the engine closed: one model loaded at a time)
            # the same tokens, but where the Q4 verifier's two best logits are closer than the
            # rounding of its batch shapes (docs/behaviour.md "Greedy equivalence")
            assert_greedy_equal(r.tokens, want, ver, p, QUANTIZED_TIE_GAP, what=method)


# ---- the server -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("slot-server")
    files = tiny_chat_pair(d)
    # 16,384 positions a slot: the long generation below runs for many seconds
    with serving(files["ver"], files["dft"], "-t", "1", "-c", "65536", "-np", "4", "-k", "4",
                 "--temp", "0.8", "--slot-save-path", str(d / "saved"), "--metrics") as s:
        yield s


def complete(url: str, prompt: str, **kw) -> dict:
    r = httpx.post(url + "/completion", json={"prompt": prompt, "seed": 7, "n_predict": 24,
                                              **kw}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_server_serves_requests_beside_a_long_one_each_as_alone(server):
    want = [complete(server.url, p)["content"] for p in PROMPTS[:3]]
    props = httpx.get(server.url + "/props").json()
    assert props["total_slots"] == 4 and props["default_generation_settings"]["n_ctx"] == 16384
    with httpx.stream("POST", server.url + "/completion", timeout=120, json={
            "prompt": "a long one", "n_predict": 15000, "stream": True}) as long:
        lines = long.iter_lines()
        next(line for line in lines if line.startswith("data:"))  # it runs
        got, errors = {}, []

        def one(i):
            try:
                got[i] = complete(server.url, PROMPTS[i])
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        # three answers, each as alone, while the long one still runs on the fourth slot
        assert not errors and [got[i]["content"] for i in range(3)] == want
        slots = httpx.get(server.url + "/slots").json()
        assert [s["id"] for s in slots] == [0, 1, 2, 3] and {s["n_ctx"] for s in slots} == {16384}
        assert sum(s["is_processing"] for s in slots) == 1
        long_slot = next(s["id"] for s in slots if s["is_processing"])
        assert all(got[i]["id_slot"] != long_slot for i in range(3))  # (a short one may reuse
        # another short one's slot once that one has finished)
        metrics = {line.split(" ")[0]: float(line.split(" ")[1])
                   for line in httpx.get(server.url + "/metrics").text.splitlines()
                   if line.startswith("cactus_slot_") or line.startswith("llamacpp:requests_p")}
        busy = [metrics[f'cactus_slot_processing{{slot="{i}"}}'] for i in range(4)]
        assert sorted(busy) == [0, 0, 0, 1] and metrics["llamacpp:requests_processing"] == 1
        for i in range(3):  # each short answer's slot holds its prompt and answer
            slot = got[i]["id_slot"]
            assert metrics[f'cactus_slot_cached_tokens{{slot="{slot}"}}'] == \
                slots[slot]["n_prompt_tokens"] > 24
        assert next(line for line in lines if line.startswith("data:"))  # still streaming
    # the client left: its slot is freed once the server sees it gone (its next event's send)
    deadline = time.monotonic() + 60
    while any(s["is_processing"] for s in httpx.get(server.url + "/slots").json()):
        assert time.monotonic() < deadline, "the abandoned generation still holds its slot"
        time.sleep(0.05)


def test_the_server_saves_a_slot_restores_it_into_another_and_erases_it(server):
    url = server.url
    first = complete(url, "the cat sat on the mat", id_slot=1, n_predict=8)
    assert first["id_slot"] == 1
    saved = httpx.post(url + "/slots/1?action=save", json={"filename": "s1.bin"}).json()
    assert saved["id_slot"] == 1 and saved["n_saved"] > 8
    restored = httpx.post(url + "/slots/0?action=restore", json={"filename": "s1.bin"}).json()
    assert restored == {**restored, "id_slot": 0, "n_restored": saved["n_saved"]}
    again = complete(url, "the cat sat on the mat", id_slot=0, n_predict=8)
    assert again["content"] == first["content"] and again["timings"]["prompt_n"] == 1
    erased = httpx.post(url + "/slots/1?action=erase").json()
    assert erased == {"id_slot": 1, "n_erased": saved["n_saved"]}
    assert httpx.get(url + "/slots").json()[1]["n_prompt_tokens"] == 0
    bad = httpx.post(url + "/slots/4?action=erase")
    assert bad.status_code == 400 and "this server has 4 (0 .. 3" in bad.json()["error"]["message"]
    bad = httpx.post(url + "/completion", json={"prompt": "x", "id_slot": 9, "n_predict": 2})
    assert bad.status_code == 400 and bad.json()["error"]["message"].startswith("id_slot 9")


# ---- steps taken together: one verification batch ------------------------------------------------

def together(engine: Engine, prompts, **kw) -> list:
    """Every prompt's generation through Engine.step_streams (the server's round)."""
    streams = [engine.stream(p, **kw) for p in prompts]
    live = list(streams)
    while live:
        for st, got in zip(list(live), engine.step_streams(live)):
            if isinstance(got, BaseException):
                raise got
            if got is DONE:
                live.remove(st)
    return [s.result for s in streams]


@pytest.mark.parametrize("method,temperature,k", [("sps", 0.0, 4), ("cactus", 0.8, 4),
                                                  ("greedy", 0.8, "auto"), ("sps", 0.8, 3)])
def test_steps_verified_in_one_batch_give_each_generation_its_tokens_alone(pairs, method,
                                                                           temperature, k,
                                                                           monkeypatch):
    from cactus_gguf.speculative import together as module

    ver, dft = pairs["llama"]
    kw = dict(n_predict=40, seed=3, k=k, temperature=temperature, method=method)
    batches = []  # (the model's file, sequences) of each shared decode
    real = module.decode_together
    monkeypatch.setattr(module, "decode_together", lambda parts: batches.append(
        (parts[0][0].model.path.name, len(parts))) or real(parts))
    with Engine(ver, dft, LoadOptions(n_ctx=2048, n_parallel=4, n_threads=1)) as e:
        alone = [e.generate(p, **kw) for p in PROMPTS]
        assert not batches
        got = together(e, PROMPTS, **kw)
    if k != "auto":  # (auto: the draft may not run at all on this machine's costs)
        # each draft position of the slots in one decode of the draft, each verification batch
        # in one of the verifier: both with up to 4 sequences
        assert {name for name, _ in batches} == {"v.gguf", "d.gguf"}
        assert max(n for _, n in batches) == 4
    assert [r.tokens for r in got] == [r.tokens for r in alone]
    assert all(r.stats.n_shared_steps == 0 for r in alone)
    shared = sum(r.stats.n_shared_steps for r in got)
    assert shared >= min(len(r.tokens) for r in alone) // 5  # the steps did share batches


def test_a_hybrid_model_steps_alone_in_the_same_round(pairs):
    ver, dft = pairs["hybrid"]  # recurrent: no shared batch, each its own decode
    kw = dict(n_predict=30, seed=3, k=3, temperature=0.8, method="sps")
    with Engine(ver, dft, LoadOptions(n_ctx=1024, n_parallel=3, n_threads=1)) as e:
        alone = [e.generate(p, **kw).tokens for p in PROMPTS[:3]]
        got = together(e, PROMPTS[:3], **kw)
    assert [r.tokens for r in got] == alone and all(r.stats.n_shared_steps == 0 for r in got)


def test_a_long_prompt_beside_other_generations_is_processed_a_chunk_a_call(pairs):
    ver, dft = pairs["llama"]
    long_prompt = " ".join(["word"] * 150)  # byte-level: ~750 tokens, 6 chunks of -b 128
    kw = dict(n_predict=24, seed=3, k=4, temperature=0.8, method="sps")
    with Engine(ver, dft, LoadOptions(n_ctx=4096, n_batch=128, n_parallel=2, n_threads=1)) as e:
        want = [e.generate(p, **kw).tokens for p in (PROMPTS[0], long_prompt)]
        e.reset()
        short, long = e.stream(PROMPTS[0], **kw), e.stream(long_prompt, **kw)
        seen = []
        live = [short, long]
        while live:
            for st, got in zip(list(live), e.step_streams(live)):
                if got is DONE:
                    live.remove(st)
            seen.append((long._session.started, len(short._session.out_tokens)))
        # the short one went on generating while the long prompt was still coming in
        assert any(not started and n > 0 for started, n in seen)
        assert [short.result.tokens, long.result.tokens] == want
        n_long = len(e.tokenize(long_prompt))
        assert sum(1 for started, _ in seen if not started) >= (n_long - 1) // 128


def test_a_slots_first_token_keeps_its_rules_law_while_another_slot_runs(tiny_pair):
    """Cactus (δ = 1) on slot 0, each answer's steps verified in one batch with a generation
    running on slot 1: the first emitted token's histogram over 3,000 seeds against the rule's
    exact law (Pearson chi-square, significance ALPHA = 0.001), and against q as a control (the
    rule moves mass towards the draft, so q's law must be rejected)."""
    from cactus_gguf.options import Request
    from cactus_gguf.sampling import SamplingParams, reference
    from support.stats import ALPHA, PROMPT, chisquare_pvalue, first_position_dists

    ver, dft = tiny_pair
    q, p = first_position_dists(ver, dft, SamplingParams(temperature=1.0, top_k=8, top_p=1.0,
                                                         min_p=0.0))
    expected = reference.emitted_first_token_distribution(p, q, "cactus", delta=1.0,
                                                          solver="taylor")
    req = Request(temperature=1.0, top_k=8, top_p=1.0, min_p=0.0, k=1, method="cactus", delta=1.0,
                  top_gap=float("inf"), protect_ends="off")
    counts, shared = np.zeros(len(q), np.int64), 0
    with Engine(ver, dft, LoadOptions(n_ctx=2048, n_batch=64, n_parallel=2, n_threads=1),
                defaults=req) as e:
        other = None
        for seed in range(3000):
            if other is None or other._session.finished:
                other = e.stream("one two three", n_predict=400, seed=seed, id_slot=1)
            mine = e.stream(PROMPT, n_predict=2, seed=seed, id_slot=0)
            while e.step_streams([mine, other])[0] is not DONE:
                pass
            r = mine.result
            counts[r.tokens[0] if r.tokens else e.verifier.model.eos] += 1
            shared += r.stats.n_shared_steps
    assert shared >= 3000  # every answer's step shared a batch with slot 1's
    assert chisquare_pvalue(counts, expected) > ALPHA
    assert chisquare_pvalue(counts, q.astype(np.float64), strict=False) < ALPHA


def test_an_engine_round_that_fails_ends_its_jobs_with_the_error_not_the_worker():
    """The worker's round (Engine.step_streams) raising is each running job's error, and the
    worker serves the next job."""
    import asyncio

    from cactus_gguf.errors import EngineError
    from cactus_gguf.server.worker import Job, Worker

    class FakeStream:
        slot = 0

        def close(self):
            pass

    class FakeEngine:
        slots = [None, None]
        calls = 0

        def stream(self, *a, **kw):
            return FakeStream()

        def step_streams(self, streams):
            FakeEngine.calls += 1
            if FakeEngine.calls == 1:
                raise RuntimeError("the round failed")
            return [DONE] * len(streams)

        def close(self):
            pass

    async def run_two():
        loop = asyncio.get_running_loop()
        jobs = [Job(prompt="x", request=type("R", (), {"return_progress": False,
                                                       "timings_per_token": False})(),
                    chat=False, loop=loop, deadline=float("inf")) for _ in range(2)]
        worker.submit(jobs[0])
        first = [await jobs[0].events.get() for _ in range(2)]
        worker.submit(jobs[1])
        second = [await jobs[1].events.get() for _ in range(1)]
        return first, second

    worker = Worker(FakeEngine, max_queue=2)
    worker.start()
    worker.ready.wait(10)
    try:
        first, second = asyncio.run(run_two())
    finally:
        worker.stop()
    assert first[0] == ("started", None) and first[1][0] == "error"
    assert isinstance(first[1][1], EngineError) and "the round failed" in str(first[1][1])
    assert second == [("started", None)] and worker.state == "stopped"
