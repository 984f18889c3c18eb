"""The CLI's one-line errors and Ctrl-C: bad input gets a one-line error and a non-zero exit,
never a traceback or a signal; Ctrl-C exits cleanly with 130. (The CLI's other tests:
tests/test_cli_io.py, its output; tests/test_cli_signals_and_prompts.py, SIGTERM and prompt
rules.)

Every error case runs the real ``python -m cactus_gguf run ...`` in a subprocess and requires: exit
code 1, stderr exactly one line starting with "cactus-gguf: error:", no "Traceback" anywhere.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from support.harness import assert_one_line_error, cli_env, run_cli
from support.tiny_gguf import EOS, WORDS, write_llama

MISSING = "/nonexistent/dir/model.gguf"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    ver = write_llama(d / "ver.gguf", seed=11, zero_output_rows=[EOS])
    dft = write_llama(d / "dft.gguf", seed=11, zero_output_rows=[EOS], noise=0.1, noise_seed=12)
    data = ver.read_bytes()
    out = {"ver": ver, "dft": dft}
    for n in (4, 24, 2000, len(data) // 2, len(data) - 1):
        out[f"trunc{n}"] = d / f"trunc{n}.gguf"
        out[f"trunc{n}"].write_bytes(data[:n])
    out["truncated"] = [out[f"trunc{n}"] for n in (4, 24, 2000, len(data) // 2, len(data) - 1)]
    (d / "text.gguf").write_text("this is not a model\n")
    out["not_gguf"] = d / "text.gguf"
    (d / "empty.gguf").write_bytes(b"")
    out["empty"] = d / "empty.gguf"
    (d / "dir.gguf").mkdir()
    out["dir"] = d / "dir.gguf"
    out["arch"] = write_llama(d / "arch.gguf", seed=5, arch="nonexistent-arch")
    words = list(WORDS)
    words[3] = "▁bird"
    out["other_vocab"] = write_llama(d / "other.gguf", seed=5, words=words)
    (d / "latin1.txt").write_bytes("café au lait".encode("latin-1"))
    out["latin1"] = d / "latin1.txt"
    (d / "long.txt").write_text("the cat sat on the mat " * 40)
    out["long_prompt"] = d / "long.txt"
    (d / "prompts").mkdir()
    out["prompt_dir"] = d / "prompts"
    return out


# ---- bad model files ----------------------------------------------------------------------------

MODEL_CASES = [
    ("missing", "no such file"),
    ("dir", "not a file"),
    ("not_gguf", "is not a GGUF file"),
    ("empty", "is not a GGUF file"),
    ("arch", "unknown model architecture: 'nonexistent-arch'"),
]


@pytest.mark.parametrize("which", ["verifier", "draft"])
@pytest.mark.parametrize("case,fragment", MODEL_CASES)
def test_bad_model_file_is_a_one_line_error(files, case, fragment, which):
    bad = MISSING if case == "missing" else files[case]
    args = (bad, files["dft"]) if which == "verifier" else (files["ver"], bad)
    r = run_cli("run", *args, "-p", "hello", "-n", "4", "-t", "1")
    assert_one_line_error(r, fragment)


def test_truncated_gguf_files_are_one_line_errors(files):
    for path in files["truncated"]:
        r = run_cli("run", path, files["dft"], "-p", "hello", "-n", "4", "-t", "1")
        line = assert_one_line_error(r, str(path))
        assert ("truncated or corrupt GGUF" in line or "not within the file bounds" in line
                or "not a GGUF file" in line), line


def test_different_vocabularies_are_served_and_refused_under_same(files):
    r = run_cli("run", files["ver"], files["other_vocab"], "-p", "hello", "-n", "4", "-t", "1")
    assert r.returncode == 0 and "draft vocabulary: intersect" in r.stderr, r.stderr
    r = run_cli("run", files["ver"], files["other_vocab"], "-p", "hello", "-n", "4", "-t", "1",
                "--draft-vocab", "same")
    assert_one_line_error(r, "--draft-vocab same, but draft",
                          "token id 262 is '▁cat' in the verifier and '▁bird' in the draft")


# ---- bad numbers and flags: rejected before any model is touched --------------------------------

PARAM_CASES = [  # every message names the flag (cactus_gguf/options/ says how)
    (["-k", "-1"], "-k/--draft-max must be >= 0 (0 = no speculation), got -1"),
    (["-k", "-3"], "-k/--draft-max must be >= 0"),
    (["--delta", "-1"], "--delta must be >= 0, got -1"),
    (["--delta", "nan"], "--delta must be a number >= 0, got nan"),
    (["--temp", "nan"], "--temp must be a number (<= 0 = greedy, inf = uniform over the kept "
                        "tokens), got nan"),
    (["--top-p", "0"], "--top-p must be in (0, 1] (1 = off), got 0"),
    (["--top-p", "1.5"], "--top-p must be in (0, 1]"),
    (["--top-p", "nan"], "--top-p must be a number in (0, 1]"),
    (["--top-k", "-1"], "--top-k must be in [0, 2**31) (0 = off), got -1"),
    (["--min-p", "2"], "--min-p must be in [0, 1] (0 = off), got 2"),
    (["-c", "8"], "-c/--ctx-size must be 0 or >= 16 (0 = the model's own), got 8"),
    (["-c", "-1"], "-c/--ctx-size must be 0 or >= 16"),
    (["-b", "0"], "-b/--batch-size must be >= 1, got 0"),
    (["-t", "0"], "-t/--threads must be in [1, 512], got 0"),
    (["-t", "100000"], "-t/--threads must be in [1, 512]"),
    (["-k", "8", "-b", "8"], "-k/--draft-max=8 must be below -b/--batch-size=8"),
    (["-k", "100000"], "-k/--draft-max=100000 must be below -b/--batch-size=512"),
    (["-n", "0"], "-n/--n-predict must be -1 or >= 1"),
    (["-s", str(2**64)], "-s/--seed must be < 2**64"),
    (["-ngl", "-2"], "-ngl/--n-gpu-layers must be >= -1 (-1 = all), got -2"),
    (["--draft-min", "9", "-k", "4"], "--draft-min must be in [0, -k/--draft-max=4], got 9"),
    (["--draft-p-min", "2"], "--draft-p-min must be in [0, 1]"),
    (["--typical-epsilon", "-1"], "--typical-epsilon must be >= 0"),
    (["--accept-top-k", "0"], "--accept-top-k must be in [1, 2**31), got 0"),
    (["--ngram-min", "0"], "--ngram-min must be >= 1"),
    (["--ngram-min", "4"], "n-gram sizes must satisfy --ngram-min <= --ngram-max, got 4 > 3"),
    (["-k", "abc"], "Invalid value for '-k' / '--draft-max': 'abc' is not auto or a valid "
                    "integer"),
    (["-k", "auto", "--k-max", "0"], "--k-max must be >= 1, got 0"),
    (["--temp", "warm"], "is not a valid float"),
    (["--method", "eagle"], "Invalid value for '--method'"),
    (["--bogus"], "No such option '--bogus'"),
]


@pytest.mark.parametrize("args,fragment", PARAM_CASES, ids=[" ".join(a) for a, _ in PARAM_CASES])
def test_bad_parameter_is_a_one_line_error_before_any_model_loads(args, fragment):
    # the model paths do not exist: a parameter error must come first
    r = run_cli("run", MISSING, MISSING, "-p", "hello", *args)
    assert_one_line_error(r, fragment)


PROMPT_CASES = [
    ([], "no prompt: give one with -p/--prompt TEXT or -f/--file FILE"),
    (["-f", "latin1"], "is not UTF-8 text (bad byte at offset 3)"),
    (["-f", "/nonexistent/prompt.txt"], "prompt file not found"),
    (["-f", "prompt_dir"], "is a directory"),
    (["-p", "hi", "-f", "latin1"], "give the prompt with -p/--prompt or -f/--file, not both"),
]


@pytest.mark.parametrize("args,fragment", PROMPT_CASES, ids=[" ".join(a) or "none"
                                                             for a, _ in PROMPT_CASES])
def test_bad_prompt_is_a_one_line_error(files, args, fragment):
    args = [str(files[a]) if a in files else a for a in args]
    r = run_cli("run", files["ver"], files["dft"], *args)
    assert_one_line_error(r, fragment)


def test_prompt_longer_than_the_context_is_a_one_line_error(files):
    r = run_cli("run", files["ver"], files["dft"], "-f", files["long_prompt"], "-c", "256",
                "-t", "1")
    assert_one_line_error(r, "tokens and -c/--ctx-size is 256: raise -c/--ctx-size above")
    assert r.returncode == 2  # valid, but does not fit: a capacity error


def test_invalid_parameters_never_construct_a_model(files, monkeypatch):
    """In-process: loading or resolving a model fails the test; every bad parameter is reported
    with exit code 1 first."""
    from click.testing import CliRunner

    from cactus_gguf import cli, registry
    from cactus_gguf.llama import Model

    def boom(*a, **kw):
        raise AssertionError("a model was touched before the parameters were validated")

    monkeypatch.setattr(Model, "__init__", boom)
    monkeypatch.setattr(registry, "resolve_model", boom)
    runner = CliRunner()
    for args, fragment in PARAM_CASES:
        r = runner.invoke(cli.main, ["run", str(files["ver"]), str(files["dft"]), "-p", "hi", *args])
        assert r.exit_code == 1, (args, r.output)
        assert fragment in r.output and "a model was touched" not in r.output, (args, r.output)


def test_negative_temperature_means_greedy_like_llama_cpp(files):
    """Choice: temperature <= 0 is greedy (llama.cpp's convention), not an error."""
    outs = [run_cli("run", files["ver"], files["dft"], "-p", "the cat", "-n", "12", "--temp", t,
                    "-s", s, "-t", "1") for t, s in (("-1", "1"), ("0", "2"), ("-0.5", "3"))]
    for r in outs:
        assert r.returncode == 0, r.stderr
    assert outs[0].stdout == outs[1].stdout == outs[2].stdout


def test_prompt_with_undecodable_bytes_is_refused_before_loading():
    # bytes that are not UTF-8 reach Python as lone surrogates (PEP 383)
    r = subprocess.run([sys.executable, "-m", "cactus_gguf", "run", MISSING, MISSING, "-p",
                        os.fsdecode(b"abc\xff\xfe")], capture_output=True, text=True, timeout=120,
                       env=cli_env())
    assert_one_line_error(r, "the prompt is not valid UTF-8 (bad byte at position 3)")


def test_models_given_twice_are_refused():
    r = run_cli("run", "-m", MISSING, MISSING, MISSING, "-p", "hello")
    assert_one_line_error(r, "too many model arguments")


def test_unusable_model_cache_is_a_one_line_error(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    env = dict(cli_env(), CACTUS_GGUF_CACHE=str(blocker))
    r = subprocess.run([sys.executable, "-m", "cactus_gguf", "pull", "smollm2-135m-instruct-q4_1"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert_one_line_error(r, "cannot write to the model cache", "set CACTUS_GGUF_CACHE")


# ---- Ctrl-C -------------------------------------------------------------------------------------

def test_ctrl_c_during_generation_exits_130_keeping_the_text(files):
    proc = subprocess.Popen(
        [sys.executable, "-m", "cactus_gguf", "run", str(files["ver"]), str(files["dft"]),
         "-p", "the cat sat on", "-n", "1000000", "-c", "65536", "-t", "1", "--temp", "0.8",
         "-s", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env())
    got = bytearray()
    enough = threading.Event()

    def reader():
        while chunk := os.read(proc.stdout.fileno(), 4096):
            got.extend(chunk)
            if len(got) >= 300:
                enough.set()
        enough.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    assert enough.wait(120), "no output"
    assert proc.poll() is None, "generation ended before the interrupt"
    seen = bytes(got)
    proc.send_signal(signal.SIGINT)
    try:
        rc = proc.wait(60)
    finally:
        proc.kill()
    t.join(10)
    stderr = proc.stderr.read().decode("utf-8", "replace")
    assert rc == 130, (rc, stderr)
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert stderr.strip().splitlines() == ["cactus-gguf: interrupted"], stderr
    out = bytes(got)
    assert out.startswith(seen) and len(seen) >= 300  # what was printed stays printed
    assert out.endswith(b"\n")


def test_ctrl_c_inside_the_llama_log_callback_is_deferred_not_lost(monkeypatch):
    """A KeyboardInterrupt raised inside a ctypes callback cannot cross llama.cpp's C frames:
    ctypes prints "Exception ignored" and drops it (the Ctrl-C was lost and a model load or a long
    generation went on). The CLI's SIGINT handler re-posts it instead."""
    from cactus_gguf import cli
    from cactus_gguf.llama import log

    old = signal.signal(signal.SIGINT, cli._sigint)
    try:
        monkeypatch.setattr(log._llama_log, "log",
                            lambda *a: cli._sigint(signal.SIGINT, sys._getframe()))
        log._log_message(4, b"a llama.cpp error line", None)  # Ctrl-C lands in the callback
        t0 = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            for _ in range(200):  # ... and is delivered in Python code shortly after
                time.sleep(0.01)
        assert time.perf_counter() - t0 < 1.0
        # outside the callback: Python's default behaviour
        with pytest.raises(KeyboardInterrupt):
            cli._sigint(signal.SIGINT, sys._getframe())
    finally:
        signal.signal(signal.SIGINT, old)


def test_the_handler_is_installed_only_over_python_default(files):
    """The library installs no SIGINT handler (loading a model leaves it as it was); the CLI's
    bridge goes only where SIGINT had Python's default handler, never over an application's."""
    code = ("import signal, sys\n"
            "from cactus_gguf import cli\n"
            "from cactus_gguf.llama import Context, ContextOptions\n"
            "own = sys.argv[2] == 'own'\n"
            "mine = lambda *a: None\n"
            "if own: signal.signal(signal.SIGINT, mine)\n"
            "before = signal.getsignal(signal.SIGINT)\n"
            "Context.load(sys.argv[1], context_options=ContextOptions(n_ctx=256, n_threads=1)).close()\n"
            "untouched = signal.getsignal(signal.SIGINT) is before\n"
            "cli.install_sigint_bridge()\n"
            "h = signal.getsignal(signal.SIGINT)\n"
            "print(untouched and h is (mine if own else cli._sigint))\n")
    for mode in ("default", "own"):
        r = subprocess.run([sys.executable, "-c", code, str(files["ver"]), mode],
                           capture_output=True, text=True, env=cli_env(), timeout=60)
        assert r.stdout.strip() == "True", (mode, r.stdout, r.stderr)


# ---- a context larger than memory ---------------------------------------------------------------

def test_a_context_larger_than_memory_is_a_one_line_error_not_an_oom_kill(files):
    t0 = time.perf_counter()
    r = run_cli("run", files["ver"], files["dft"], "-p", "hello", "-c", "1000000000", "-t", "1")
    assert_one_line_error(r, "-c/--ctx-size=1000000000 needs about", "GiB of KV cache",
                          "lower -c/--ctx-size")
    assert r.returncode == 2
    assert time.perf_counter() - t0 < 30
