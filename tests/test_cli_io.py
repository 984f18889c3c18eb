"""The CLI process's input and output (issue "Reliability, round 2"): what a new user broke,
each with the test that catches its return.

0. resource tests that fail on allocator noise: tests/test_loading.py (trend tests)
1. two threads on one engine: tests/test_engine.py::test_two_threads_on_one_engine_are_served...
2. interleaved streams: tests/test_engine.py::test_interleaved_streams_and_a_generate_in_between...
5. stop as a string, bytes prompts: tests/test_engine.py::test_stop_as_a_string_is_one_stop...
6. offline mode: tests/test_registry.py::test_offline_never_runs_pip (and the hub / CLI ones)
14. errors name the flag: tests/test_cli.py::PARAM_CASES
The CLI items are here (the real ``python -m cactus_gguf`` in a subprocess).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from support.tiny_gguf import EOS, chain, text_tokens, byte_token as T, write_llama
from support.harness import assert_one_line_error, cli_env, run_cli

UTF8 = "é中😀 ok"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli_io")
    return {"ver": write_llama(d / "ver.gguf", seed=11, zero_output_rows=[EOS]),
            "dft": write_llama(d / "dft.gguf", seed=11, zero_output_rows=[EOS], noise=0.1,
                               noise_seed=12),
            "utf8": write_llama(d / "utf8.gguf", seed=47,
                                bigram=chain([T(ord("h"))] + text_tokens(UTF8) + [EOS]))}


def run(files, *args, **kw):
    return run_cli("run", files["ver"], files["dft"], "-t", "1", "-s", "1", *args, **kw)


# ---- 3. write errors ----------------------------------------------------------------------------

@pytest.mark.parametrize("as_json", [False, True])
def test_a_full_disk_is_a_one_line_error(files, as_json):
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "cactus_gguf", "run", str(files["ver"]),
                            str(files["dft"]), "-p", "the cat", "-n", "16", "-t", "1",
                            *(["--json"] if as_json else [])], stdout=full,
                           stderr=subprocess.PIPE, text=True, env=cli_env(), timeout=120)
    assert_one_line_error(r, "cannot write to standard output: No space left on device")
    assert r.returncode == 1


def test_an_output_encoding_that_cannot_hold_the_text(files):
    env = dict(cli_env(), PYTHONIOENCODING="cp1252")
    args = [sys.executable, "-m", "cactus_gguf", "run", str(files["utf8"]), str(files["utf8"]),
            "-p", "h", "-n", "20", "-t", "1", "--temp", "0"]
    r = subprocess.run(args, capture_output=True, env=env, timeout=120)
    r = subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode("cp1252"),
                                    r.stderr.decode("utf-8"))
    assert_one_line_error(r, "the output encoding cp1252 cannot represent the text",
                          "PYTHONIOENCODING=utf-8")
    assert r.stdout == "é"  # what could be written was
    # --json stays valid JSON: escaped to ASCII where the encoding cannot carry the text
    r = subprocess.run(args + ["--json"], capture_output=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.decode("cp1252"))["text"] == UTF8


# ---- 7. --json says why it stopped ------------------------------------------------------------

def test_json_has_the_message_and_n_ctx(files):
    r = run(files, "-p", "the cat", "-n", "5", "--json")
    out = json.loads(r.stdout)
    assert (out["stop_reason"], out["message"], out["n_ctx"]) == ("length", "n_predict=5 reached",
                                                                  4096)
    r = run(files, "-p", "the cat", "-n", "1000", "-c", "256", "--json")
    out = json.loads(r.stdout)
    assert (out["stop_reason"], out["message"], out["n_ctx"]) == ("length",
                                                                  "context full (n_ctx=256)", 256)


# ---- 8. --json and Ctrl-C ---------------------------------------------------------------------

def test_ctrl_c_with_json_prints_what_was_generated(files):
    proc = subprocess.Popen(
        [sys.executable, "-m", "cactus_gguf", "run", str(files["ver"]), str(files["dft"]), "-p",
         "the cat", "-n", "1000000", "-c", "65536", "-t", "1", "-s", "1", "--json", "-vv"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env())
    started = threading.Event()

    def watch():  # the model is loaded once llama.cpp logs its context
        for line in proc.stderr:
            if b"llama_context" in line or b"KV" in line:
                started.set()

    threading.Thread(target=watch, daemon=True).start()
    assert started.wait(120)
    threading.Event().wait(2.0)  # some generation
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130
    data = json.loads(out)
    assert data["stop_reason"] == "interrupted" and data["n_tokens"] > 0
    assert len(data["tokens"]) == data["n_tokens"]


# ---- 9. a closed standard output --------------------------------------------------------------

def test_a_closed_stdout_fails_like_cat(files):
    r = subprocess.run([sys.executable, "-m", "cactus_gguf", "run", str(files["ver"]),
                        str(files["dft"]), "-p", "the cat", "-n", "4", "-t", "1"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=cli_env(),
                       timeout=120, preexec_fn=lambda: os.close(1))
    assert_one_line_error(r, "standard output is closed")


# ---- 10. -b 1 without drafts, -k 0 -------------------------------------------------------------

def test_batch_of_one_works_without_a_drafter_and_k_zero_means_no_speculation(files):
    r = run(files, "-p", "the cat", "-n", "6", "-b", "1", "--method", "none", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["n_tokens"] == 6
    r = run(files, "-p", "the cat", "-n", "6", "-k", "0", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["method"] == "none" and out["n_drafted"] == 0
    assert out["draft"] is None  # the draft is not even loaded
    r = run(files, "-p", "the cat", "-n", "6", "-k", "0", "-b", "1", "--json")
    assert r.returncode == 0, r.stderr


# ---- 11. the prompt from standard input --------------------------------------------------------

def test_the_prompt_from_standard_input(files):
    a = run(files, "-f", "-", "-n", "6", "--json", stdin="the cat sat on")
    b = run(files, "-p", "the cat sat on", "-n", "6", "--json")
    assert a.returncode == 0, a.stderr
    assert json.loads(a.stdout)["tokens"] == json.loads(b.stdout)["tokens"]
    r = run(files, "-f", "-", "-n", "6", "--json", stdin="")  # empty: BOS alone (issue 29)
    assert r.returncode == 0 and json.loads(r.stdout)["n_prompt_tokens"] == 1, r.stderr


# ---- 4. Ctrl-C while llama-cpp-python builds its wrappers --------------------------------------

def test_ctrl_c_inside_a_critical_section_is_deferred_to_its_end():
    """A Ctrl-C that lands while llama-cpp-python's LlamaModel / LlamaContext / LlamaBatch
    wrappers are being built would leave them half-built ("'LlamaContext' object has no attribute
    '_exit_stack'" from their __del__). The library marks that as a critical section; the CLI's
    handler re-posts an interrupt that lands inside until it ends."""
    import time

    from cactus_gguf import cli
    from cactus_gguf.llama import log

    old = signal.signal(signal.SIGINT, cli._sigint)
    try:
        reached_end = False
        with pytest.raises(KeyboardInterrupt):
            with log.critical():
                os.kill(os.getpid(), signal.SIGINT)
                t0 = time.perf_counter()
                while time.perf_counter() - t0 < 0.2:  # Python code runs: the handler fires here
                    time.sleep(0.005)
                reached_end = True
            for _ in range(100):  # ... and the interrupt comes right after the section
                time.sleep(0.01)
        assert reached_end and not log.in_critical_section()
    finally:
        signal.signal(signal.SIGINT, old)


def test_the_wrappers_are_built_inside_critical_sections(files, monkeypatch):
    from llama_cpp import _internals

    from cactus_gguf.llama import Context, ContextOptions, log

    seen = []
    for cls in (_internals.LlamaModel, _internals.LlamaContext, _internals.LlamaBatch):
        init = cls.__init__

        def spy(self, *a, _init=init, _name=cls.__name__, **kw):
            seen.append((_name, log.in_critical_section()))
            _init(self, *a, **kw)

        monkeypatch.setattr(cls, "__init__", spy)
    Context.load(files["ver"], context_options=ContextOptions(n_ctx=256, n_threads=1)).close()
    assert seen == [("LlamaModel", True), ("LlamaContext", True), ("LlamaBatch", True)]


# ---- 12. statistics that add up ----------------------------------------------------------------

def test_a_one_token_reply_has_consistent_statistics(tmp_path):
    from support.harness import make_engine

    ok = write_llama(tmp_path / "ok.gguf", seed=3, bigram=chain([T(ord("?")), T(ord("O")),
                                                                 T(ord("K")), EOS]))
    with make_engine(ok, ok, k=4, temp=0.0) as eng:
        s = eng.generate([T(ord("?"))], n_predict=20, seed=0).stats
    # drafts O, K, EOS all accepted: one step produced O and K, and EOS ended the output
    assert (s.n_steps, s.n_drafted, s.n_accepted, s.n_tokens, s.n_end_tokens) == (1, 3, 3, 2, 1)
    assert s.n_drafts_used == 3  # the ending end-of-generation draft is used
    assert s.tokens_per_verifier_call == s.mean_accepted_length == 3.0
    assert s.acceptance_rate == 1.0


@pytest.mark.parametrize("stop", [[], ["e"], ["at"]])
def test_every_step_adds_its_accepted_drafts_and_at_most_one_more_token(files, stop):
    from support.harness import make_engine

    with make_engine(files["ver"], files["dft"], k=4, temp=0.9) as eng:
        for seed in range(12):
            s = eng.generate("the cat sat on", n_predict=int(10 + 7 * seed), seed=seed,
                             stop=stop).stats
            produced, used = s.n_tokens + s.n_end_tokens, s.n_drafts_used
            assert used + s.n_steps - 1 <= produced <= used + s.n_steps, seed
            assert used <= s.n_accepted <= s.n_drafted
            assert s.tokens_per_verifier_call == produced / s.n_steps


# ---- 13. when drafting stops, it says so -------------------------------------------------------

def test_a_full_draft_context_is_reported(files):
    from support.harness import ctx, make_engine

    with make_engine(files["ver"], files["dft"], k=4, temp=0.0, context=ctx(512),
                     draft_context=ctx(256)) as eng:
        s = eng.generate("the cat sat on", n_predict=400, seed=0).stats
        assert s.draft_stopped_at is not None and 230 < s.draft_stopped_at < 256
        assert s.draft_stop_reason == "draft context full"
        assert eng.generate("the cat", n_predict=10, seed=0).stats.draft_stopped_at is None
    r = run(files, "-p", "the cat sat on", "-n", "300", "-c", "256", "-k", "4")
    # one context size for both: the verifier fills first, drafting never stops early
    assert "drafting stopped" not in r.stderr


def test_verbose_prints_the_draft_length_decisions(files, monkeypatch, tmp_path):
    monkeypatch.setenv("CACTUS_GGUF_CACHE", str(tmp_path))  # a real probe of these models
    r = run(files, "-p", "the cat", "-n", "24", "-k", "auto", "-c", "256", "-v")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    decided = [ln for ln in lines if ln.startswith("draft length (model): ")]
    assert decided, lines[-20:]
    assert "ms for 1 row" in decided[0] and "tokens/s against" in decided[0], decided[0]
    assert any(ln.startswith("prompt of ") and "reused" in ln for ln in lines)
    assert any(ln.startswith("rule: method cactus delta=1") for ln in lines)
    assert "verifier: 0/3 layers offloaded (CPU)" in lines and "draft vocabulary: same (draft_vocab " \
        "auto)" in lines
    assert not any("llama_context" in ln for ln in lines)  # llama.cpp's log: -vv only
    quiet = run(files, "-p", "the cat", "-n", "4", "-k", "auto", "-c", "256")
    assert "draft length (" not in quiet.stderr
    louder = run(files, "-p", "the cat", "-n", "4", "-k", "auto", "-c", "256", "-vv")
    assert "draft length (" in louder.stderr and "llama_context" in louder.stderr


# ---- issue 42 item 12: what the summary and `vocab` print ----------------------------------------

def test_the_summary_gives_the_vocabulary_coverage_only_when_something_was_drafted():
    from cactus_gguf.cli.run import summary
    from cactus_gguf.options import Request
    from cactus_gguf.stats import GenerationResult, GenerationStats

    stats = GenerationStats(n_tokens=4, n_steps=4, draft_vocab="intersect")
    stats.add_coverage(0.8)  # measured at each step, drafting or not
    result = GenerationResult(text="abcd", tokens=[1, 2, 3, 4], stop_reason="length",
                              stats=stats, seed=1)
    line = summary(result, Request(k="auto"))
    assert "draft vocabulary: intersect |" in line and "drafted nothing" in line
    assert "shared tokens" not in line  # a ceiling on acceptance: nothing to say with no draft
    stats.n_drafted, stats.n_accepted = 6, 3
    assert "draft vocabulary: intersect, the verifier's mass on the shared tokens 80.0%" in \
        summary(result, Request(k="auto"))


def test_vocab_prints_a_byte_token_escaped_once():
    import numpy as np

    from cactus_gguf.speculative.vocab_map import VocabInfo, build_map, describe

    def info(pieces, types):
        return VocabInfo("x.gguf", "llama", tuple(pieces), np.array(types, np.int32), {}, "", "")

    # the verifier has a byte-fallback token for 0x80 (not UTF-8 alone) and a newline; the draft
    # has neither
    ver = info(["<unk>", "a", "<0x80>", "<0x0A>", "b\\c"], [2, 1, 6, 6, 1])
    dft = info(["<unk>", "a"], [2, 1])
    [line] = [ln for ln in describe(build_map(ver, dft), "v", "d")
              if ln.startswith("verifier only")]
    assert line == "verifier only: 2 '\\x80', 3 '\\n', 4 'b\\c'", line
