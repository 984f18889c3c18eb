"""Signals and prompt rules in the CLI and the engine (issue "Reliability, round 3"): what a new
user broke, each with the test that catches its return (the server items:
tests/test_server_lifecycle.py).

3. concurrent probes lose forward-cost entries   4. SIGTERM loses --json / the bench journal
9. one empty-prompt rule   10. -n -1   11. a UTF-8 BOM in a prompt file   12. wording
13. a warning when steps run far slower than probed (a busy machine)
The CLI items run the real ``python -m cactus_gguf`` in a subprocess.
"""
from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from support.tiny_gguf import EOS, chain, text_tokens, byte_token as T, write_llama
from support.harness import assert_one_line_error, cli_env, make_engine, run_cli

SCRIPT = "quick brown"  # a bigram model spells it (no letter twice), then EOS


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli_signals")
    return {"ver": write_llama(d / "ver.gguf", seed=11, zero_output_rows=[EOS]),
            "dft": write_llama(d / "dft.gguf", seed=11, zero_output_rows=[EOS], noise=0.1,
                               noise_seed=12),
            "nobos": write_llama(d / "nobos.gguf", seed=11, add_bos=False),
            "script": write_llama(d / "script.gguf", seed=45,
                                  bigram=chain([T(ord(">"))] + text_tokens(SCRIPT) + [EOS]))}


def run_json(*args, **kw) -> dict:
    r = run_cli("run", *args, "-t", "1", "--json", **kw)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# ---- 3. concurrent probes keep every forward-cost entry -----------------------------------------

# One `run` in miniature: forward_costs over an engine whose thread count makes its own cache key;
# the probe (measure_forward_costs) is replaced by a pause, so every process has read the table
# before any of them writes it (as six real runs started at once do).
PROBE = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from types import SimpleNamespace as NS
    from cactus_gguf.options import LoadOptions
    from cactus_gguf.speculative import costs

    cache, model, threads = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])

    def probe(engine, tokens, ks, repeats=1, warm=False):
        time.sleep(1.0)
        return {"verifier": {str(k + 1): 1.0 + threads + k for k in [0, *ks]}, "draft": {}}

    costs.measure_forward_costs = probe
    engine = NS(verifier=NS(model=NS(path=model), n_threads=threads, n_ctx=512), draft=None,
                load_options=LoadOptions(), tokenize=lambda text: list(range(40)))
    got, cached = costs.forward_costs(engine, 4, cache)
    assert not cached and got.verify(1) == (1.0 + threads) / 1e3  # ms -> s
""")


def test_parallel_probes_keep_every_cost_entry(files, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    table = cache / "forward-costs.json"
    table.write_text(json.dumps({"an older entry": {"verify": {"1": 0.5}, "draft": 0.1}}))
    procs = [subprocess.Popen([sys.executable, "-c", PROBE, str(cache), str(files["ver"]), str(t)],
                              env=cli_env(), stderr=subprocess.PIPE, text=True)
             for t in range(1, 7)]
    for p in procs:
        assert p.wait(120) == 0, p.stderr.read()
    entries = json.loads(table.read_text())
    assert len(entries) == 7, sorted(entries)  # the six new ones and the older one
    assert sorted(e["verify"]["1"] for e in entries.values()) == \
        [(1.0 + t) / 1e3 for t in range(1, 7)] + [0.5]
    assert sorted(p.name for p in cache.iterdir()) == ["forward-costs.json",
                                                      "forward-costs.json.lock"]  # no temp left


# ---- 4. SIGTERM is handled as Ctrl-C: partial --json, whole journal lines, exit 143 -------------

def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cactus_gguf", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env())


def test_sigterm_on_run_json_prints_the_partial_result_and_exits_143(files):
    # 60,000 tokens into a 65,536-token context: far longer than the test waits
    p = _start("run", files["ver"], files["dft"], "-p", "the cat", "-n", "60000", "-c", "65536",
               "-t", "1", "-k", "4", "--json")
    time.sleep(4)  # loaded and generating
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 143, (p.returncode, err)
    result = json.loads(out)
    assert result["stop_reason"] == "interrupted"
    assert len(result["tokens"]) == result["n_tokens"] < 60000
    assert err.splitlines()[-1] == "cactus-gguf: terminated" and "Traceback" not in err


def test_sigterm_on_bench_keeps_whole_journal_lines_and_exits_143(files, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"the cat {i}"}) + "\n"
                               for i in range(200)))
    out = tmp_path / "out"
    p = _start("bench", files["ver"], files["dft"], "--prompts", prompts, "--configs", "none",
               "-n", "300", "-t", "1", "-o", out, "--no-plot", "--no-progress")
    journal = out / "runs.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the plan line and a few finished runs
        if journal.exists() and journal.read_text().count("\n") >= 4:
            break
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143, (p.returncode, err)
    lines = journal.read_text().split("\n")
    assert lines[-1] == ""  # ends with a whole line ...
    assert all(json.loads(ln) for ln in lines[:-1])  # ... and every line is JSON
    assert len(lines) - 1 < 201  # it stopped before the end
    assert err.splitlines()[-1] == (f"cactus-gguf: terminated; `--resume {out}` (same options) "
                                    "continues the run")


# ---- issue 42 item 2: a signal inside a long prompt chunk stops that chunk ------------------------

def _signal_in_prefill(args, sig, after: float) -> tuple[subprocess.Popen, str, str]:
    """``run *args -v``, sent ``sig`` ``after`` seconds into its prompt processing (not sent if
    it exited before); (the process, its stdout, its stderr) once it exited. Generous limits: on
    a loaded machine the chunk may take minutes (an abort that does not work fails the caller's
    assertion, not a timeout)."""
    p = _start(*args, "-v")
    for line in p.stderr:  # -v: the engine logs when the prompt's processing begins
        if "processing a prompt of" in line:
            break
    try:
        p.wait(timeout=after)  # (stderr is not read meanwhile: -v writes a few lines only)
    except subprocess.TimeoutExpired:
        p.send_signal(sig)
    out, err = p.communicate(timeout=900)
    return p, out, err


@pytest.mark.parametrize("sig,code,word", [(signal.SIGINT, 130, "interrupted"),
                                           (signal.SIGTERM, 143, "terminated")])
def test_a_signal_inside_a_long_prompt_chunk_stops_it(files, tmp_path, sig, code, word):
    """One chunk of ~7,300 tokens (one llama_decode, about 2 s here, minutes on a loaded
    machine): a Ctrl-C or SIGTERM 0.2 s into it stops the decode at its next graph node
    (llama.cpp's abort callback), where the run waited for the whole chunk before.

    The check: the interrupted run's prompt processing took less than 0.2 s + 0.6 × what the
    whole chunk takes uninterrupted (F), i.e. F > need = (its time − 0.2) / 0.6. The reference
    run proves that without running the whole chunk (which timed out at 120 s on a loaded 2-core
    machine): still processing the prompt ``need`` seconds in, it is interrupted there and
    reports a time <= F (or it finished, and reports F itself)."""
    prompt = tmp_path / "long.txt"
    prompt.write_text(" ".join(["the cat sat on the mat and"] * 280), encoding="utf-8")
    args = ("run", files["ver"], "-f", prompt, "-n", "2", "-c", "8192", "-b", "8192", "-fa", "on",
            "-t", "1", "--method", "none", "--json")
    p, out, err = _signal_in_prefill(args, sig, 0.2)
    assert p.returncode == code, (p.returncode, err)
    assert err.splitlines()[-1] == f"cactus-gguf: {word}"
    assert "Traceback" not in err and "Exception ignored" not in err
    result = json.loads(out)
    assert (result["stop_reason"], result["message"]) == ("interrupted",
                                                          "interrupted during prompt processing")
    assert result["n_tokens"] == 0 and result["n_prompt_tokens"] > 7000
    # stopped inside the chunk (a node of this 2-layer model's attention takes a good part of it)
    need = (result["prefill_seconds"] - 0.2) / 0.6
    if need <= 0:
        return  # stopped within 0.2 s: inside the chunk, whatever the chunk takes
    _, ref_out, ref_err = _signal_in_prefill(args, signal.SIGINT, 1.1 * need + 0.05)
    full = json.loads(ref_out)["prefill_seconds"]  # <= the chunk's uninterrupted time
    assert result["prefill_seconds"] < 0.2 + 0.6 * full, (result["prefill_seconds"], full,
                                                          ref_err)


# ---- 9. one empty-prompt rule: only a prompt without tokens is refused --------------------------

def test_a_space_and_an_empty_prompt_are_prompts_when_the_model_adds_bos(files):
    space = run_json(files["ver"], "--method", "none", "-p", " ", "-n", "3")
    empty = run_json(files["ver"], "--method", "none", "-p", "", "-n", "3")
    assert space["n_prompt_tokens"] >= 2 and space["n_tokens"] == 3  # BOS + the space
    assert empty["n_prompt_tokens"] == 1 and empty["n_tokens"] == 3  # BOS alone
    empty_file = files["ver"].parent / "empty.txt"
    empty_file.write_bytes(b"")
    assert run_json(files["ver"], "--method", "none", "-f", empty_file,
                    "-n", "2")["n_prompt_tokens"] == 1


def test_an_empty_prompt_without_bos_is_refused_everywhere(files):
    r = run_cli("run", files["nobos"], "--method", "none", "-p", "", "-t", "1")
    assert_one_line_error(r, "the prompt is empty and this model adds no BOS token",
                          "give some text")
    assert r.returncode == 1
    from cactus_gguf.errors import InputError

    with make_engine(files["nobos"], method="none") as eng:
        with pytest.raises(InputError, match="no BOS token") as e:
            eng.generate("", n_predict=2)
        assert e.value.param == "prompt"
        assert eng.generate(" ", n_predict=2, seed=1).stats.n_prompt_tokens >= 1
    with make_engine(files["ver"], method="none") as eng:
        assert eng.generate("", n_predict=2, seed=1).stats.n_prompt_tokens == 1
        with pytest.raises(InputError, match="at least one token id"):
            eng.generate([], n_predict=2)


# ---- 10. -n -1: until the end of generation or a full context -----------------------------------

def test_n_minus_one_runs_until_the_context_is_full(files):
    out = run_json(files["ver"], files["dft"], "-p", "the cat", "-n", "-1", "-c", "256",
                   "-k", "4", "-s", "1")
    assert (out["stop_reason"], out["message"]) == ("length", "context full (n_ctx=256)")
    assert 250 <= out["n_prompt_tokens"] + out["n_tokens"] <= 257


def test_n_minus_one_runs_until_eos(files):
    out = run_json(files["script"], files["script"], "-p", ">", "-n", "-1", "--temp", "0",
                   "-k", "4")
    assert (out["stop_reason"], out["text"]) == ("eos", SCRIPT)


def test_other_negative_n_and_zero_are_still_refused(files):
    for n in ("0", "-2"):
        r = run_cli("run", files["ver"], "--method", "none", "-p", "x", "-n", n)
        assert_one_line_error(r, f"-n/--n-predict must be -1 or >= 1 (-1 = no limit), got {n}")


# ---- 11. a UTF-8 byte-order mark in a prompt file is not part of the prompt ---------------------

def test_a_bom_in_a_prompt_file_or_stdin_is_dropped(files, tmp_path):
    plain, bom = tmp_path / "plain.txt", tmp_path / "bom.txt"
    plain.write_text("the cat sat", encoding="utf-8")
    bom.write_bytes(b"\xef\xbb\xbf" + "the cat sat".encode())
    args = (files["ver"], "--method", "none", "-n", "4", "--temp", "0")
    want = run_json(*args, "-f", plain)
    got = run_json(*args, "-f", bom)
    piped = run_cli("run", *args, "-f", "-", "-t", "1", "--json",
                    stdin="\ufeffthe cat sat")
    assert piped.returncode == 0, piped.stderr
    for out in (got, json.loads(piped.stdout)):
        assert out["n_prompt_tokens"] == want["n_prompt_tokens"]
        assert out["tokens"] == want["tokens"]


# ---- 12. wording ---------------------------------------------------------------------------------

def test_nan_is_not_a_number_and_missing_models_name_their_option(files, tmp_path):
    r = run_cli("run", files["ver"], "--method", "none", "-p", "x", "--delta", "nan")
    assert_one_line_error(r, "--delta must be a number >= 0, got nan")
    from cactus_gguf.llama import ModelLoadError
    from cactus_gguf.options import Request

    with pytest.raises(ValueError,
                       match=r"^top_p must be a number in \(0, 1\] \(1 = off\), got nan$"):
        Request(top_p=float("nan"))
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("not a model")
    cases = [((tmp_path / "missing.gguf",), "model"),
             ((files["ver"], tmp_path / "missing.gguf"), "model_draft"),
             ((files["ver"], not_gguf), "model_draft")]
    from cactus_gguf.speculative import Engine

    for models, param in cases:
        with pytest.raises(ModelLoadError) as e:
            Engine(*models)
        assert e.value.param == param, (models, e.value)


# ---- 13. steps far slower than probed: one warning naming the cause and the fix -----------------

def test_steps_far_slower_than_probed_log_one_warning(files, caplog, monkeypatch, tmp_path):
    monkeypatch.setenv("CACTUS_GGUF_CACHE", str(tmp_path))  # a real probe of these models
    with make_engine(files["ver"], files["dft"], k="auto", k_max=4) as eng:
        eng.forward_costs(4)  # probed on a quiet engine
        with caplog.at_level(logging.WARNING, logger="cactus_gguf"):
            eng.generate("the cat", n_predict=16, seed=1)  # steps at their usual speed
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        decode = eng.verifier.decode

        def contended(tokens, n_logits=1, **kw):  # what a busy machine does to a step: it waits
            out = decode(tokens, n_logits, **kw)
            if n_logits > 0:
                time.sleep(0.3)
            return out

        monkeypatch.setattr(eng.verifier, "decode", contended)
        with caplog.at_level(logging.WARNING, logger="cactus_gguf"):
            eng.generate("the dog", n_predict=8, seed=1, k=2)
            eng.generate("the mat", n_predict=8, seed=1, k=2)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]  # once per engine
    message = warnings[0].getMessage()
    assert warnings[0].name == "cactus_gguf.speculative.costs"
    for fragment in ("llama_decode steps take", "x the", "spin-wait", "-t 1 / n_threads=1",
                     "stop the other process"):
        assert fragment in message, message


def test_the_slow_step_rule():
    from cactus_gguf.speculative.costs import SlowStepWatch
    from cactus_gguf.speculative.policy import ForwardCosts

    costs = ForwardCosts({1: 0.01, 5: 0.02}, 0.005)
    w = SlowStepWatch(n_threads=2)
    w.observe(4, 10.0)  # nothing probed: nothing to compare with
    w.expect(costs)
    costs.observe_verify(5, 1.0)  # online corrections do not move what the watch compares with
    for seconds in (0.5, 0.5, 0.1, 0.5, 0.5):  # >= 10x 0.02 s and >= 0.2 s, but not 3 in a row
        w.observe(4, seconds)
    assert not w.warned
    w.observe(4, 0.5)
    assert w.warned
    tiny = SlowStepWatch(n_threads=2)
    tiny.expect(ForwardCosts({1: 1e-4}, 0.0))
    for _ in range(5):
        tiny.observe(0, 0.15)  # 1500x a tiny model's probe, but well under a human-visible stall
    assert not tiny.warned
