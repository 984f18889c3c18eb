"""Issue #6, kind 7: bad input gets a one-line error and a non-zero exit, never a traceback or a
signal; Ctrl-C exits cleanly with 130; AMX CPUs never crash.

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

from support.tiny_gguf import EOS, write_llama
from support.harness import assert_one_line_error, cli_env, run_cli
from support.tiny_gguf import WORDS

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


# ---- bad model files ---------------------------------------------------------------------------------

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


# ---- bad numbers and flags: rejected before any model is touched ------------------------------------

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


# ---- Ctrl-C ---------------------------------------------------------------------------------------

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


def test_a_context_larger_than_memory_is_a_one_line_error_not_an_oom_kill(files):
    t0 = time.perf_counter()
    r = run_cli("run", files["ver"], files["dft"], "-p", "hello", "-c", "1000000000", "-t", "1")
    assert_one_line_error(r, "-c/--ctx-size=1000000000 needs about", "GiB of KV cache",
                          "lower -c/--ctx-size")
    assert r.returncode == 2
    assert time.perf_counter() - t0 < 30


def test_kv_cache_guard_refuses_exactly_above_physical_memory(files, monkeypatch):
    from cactus_gguf.llama import Context, ContextOptions, KvCacheTooLargeError, context

    with Context.load(files["ver"], context_options=ContextOptions(n_ctx=4096, n_threads=1)) as m:
        est = m.model.kv_cache_bytes(m.n_ctx)
    assert est == 4096 * 2 * 2 * 64 * 2  # n_ctx x 2 layers x (K + V) x 64 dims x f16
    opts = ContextOptions(n_ctx=4096, n_threads=1)
    monkeypatch.setattr(context, "physical_memory", lambda: est)
    Context.load(files["ver"], context_options=opts).close()
    monkeypatch.setattr(context, "physical_memory", lambda: est - 1)
    with pytest.raises(KvCacheTooLargeError, match=r"n_ctx=4096 needs about 0\.0 GiB of KV cache"):
        Context.load(files["ver"], context_options=opts)


# ---- AMX (llama.cpp issue #20824) -----------------------------------------------------------------

@pytest.mark.parametrize("cpu,build,expected", [(True, True, False), (True, False, True),
                                                (False, True, True), (False, False, True)])
def test_repacking_is_off_exactly_when_cpu_and_build_have_amx(monkeypatch, cpu, build, expected):
    from cactus_gguf.llama import ModelOptions, model

    monkeypatch.setattr(model, "cpu_has_amx", lambda: cpu)
    monkeypatch.setattr(model, "build_has_amx", lambda: build)
    assert ModelOptions().resolved_repack() is expected
    # an explicit choice wins
    assert ModelOptions(repack=True).resolved_repack() is True
    assert ModelOptions(repack=False).resolved_repack() is False


@pytest.mark.parametrize("flags,expected", [
    ("fpu avx2 avx512f amx_bf16 amx_tile amx_int8 avx512_fp16", True),
    ("fpu avx2 avx512f amx_bf16 amx_tile", False),   # no AMX_INT8
    ("fpu avx2 amx_int8x", False),                   # a whole flag, not a substring
    (None, False),                                   # no flags line (e.g. ARM)
])
def test_cpu_amx_detection_reads_the_cpuinfo_flags(monkeypatch, tmp_path, flags, expected):
    from cactus_gguf.llama import hw

    fake = tmp_path / "cpuinfo"
    fake.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\n"
                    + (f"flags\t\t: {flags}\n" if flags else "Features\t: fp asimd\n"))
    real_open = open
    monkeypatch.setattr(hw, "open",
                        lambda path, *a, **kw: real_open(fake if path == "/proc/cpuinfo" else path,
                                                         *a, **kw), raising=False)
    assert hw.cpu_has_amx() is expected


def test_cpu_amx_detection_survives_an_unreadable_cpuinfo(monkeypatch):
    from cactus_gguf.llama import hw

    def denied(*a, **kw):
        raise PermissionError("denied")

    monkeypatch.setattr(hw, "open", denied, raising=False)
    assert hw.cpu_has_amx() is False


def test_build_amx_detection_reads_the_system_info(monkeypatch):
    import llama_cpp
    from cactus_gguf.llama import hw

    monkeypatch.setattr(llama_cpp, "llama_print_system_info",
                        lambda: b"CPU : AVX2 = 1 | AMX_INT8 = 1 | REPACK = 1 |")
    assert hw.build_has_amx() is True
    monkeypatch.setattr(llama_cpp, "llama_print_system_info",
                        lambda: b"CPU : AVX2 = 1 | AVX512 = 1 | REPACK = 1 |")
    assert hw.build_has_amx() is False


def test_the_resolved_repack_choice_reaches_llama_cpp(files, monkeypatch):
    from llama_cpp import _internals

    from cactus_gguf.llama import Context, ContextOptions, model

    seen = []
    real = _internals.LlamaModel.__init__

    def spy(self, *a, params, **kw):
        seen.append(bool(params.use_extra_bufts))
        real(self, *a, params=params, **kw)

    monkeypatch.setattr(_internals.LlamaModel, "__init__", spy)
    for cpu, build in ((True, True), (False, True)):
        monkeypatch.setattr(model, "cpu_has_amx", lambda: cpu)
        monkeypatch.setattr(model, "build_has_amx", lambda: build)
        Context.load(files["ver"], context_options=ContextOptions(n_ctx=256, n_threads=1)).close()
    assert seen == [False, True]


def test_real_pair_runs_on_this_machine(qwen_pair):
    """The Q4_K_M pair that segfaults with AMX repacking runs (this machine has AMX: the guard
    is what keeps it alive)."""
    from cactus_gguf.llama import build_has_amx, cpu_has_amx

    amx = cpu_has_amx() and build_has_amx()
    print(f"AMX: cpu {cpu_has_amx()}, build {build_has_amx()}; "
          f"repacking {'off' if amx else 'on'}")
    ver, dft = qwen_pair
    r = run_cli("run", ver, dft, "-p", "def add(a, b):", "-n", "8", "-c", "512", "--temp", "0",
                "-k", "4", "-t", "1", timeout=300)
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert "return" in r.stdout
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("cactus-gguf: answer ") and " | 8 tokens in " in last, last


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


# ---- issue 42: small things a new user hit ------------------------------------------------------

def test_a_stop_list_with_a_non_string_names_the_item():
    from cactus_gguf.errors import InputError
    from cactus_gguf.options import Request

    with pytest.raises(InputError, match=r"^stop must be a string or a list of strings, got None "
                                         r"in the list$"):
        Request(stop=["a", None])


def test_float_token_ids_are_refused(tiny_pair):
    from cactus_gguf.errors import InputError
    from support.harness import make_engine

    with make_engine(*tiny_pair) as eng:
        with pytest.raises(InputError, match=r"prompt token ids must be integers, got 1.5"):
            eng.generate([1, 1.5], n_predict=2)
        with pytest.raises(InputError, match=r"got True"):
            eng.generate([1, True], n_predict=2)
        assert eng.generate([1, 259], n_predict=2, seed=0).stats.n_prompt_tokens == 2


def test_a_prompt_file_with_a_byte_order_mark(tmp_path):
    from cactus_gguf.bench.prompts import load_prompts_jsonl

    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"id": "a", "prompt": "hello"}\n')
    [p] = load_prompts_jsonl(path)
    assert (p.id, p.text) == ("a", "hello")


def test_vocab_coverage_is_a_mass_at_most_one():
    from cactus_gguf.stats import GenerationStats

    s = GenerationStats(coverage_sum=3.000000012, n_coverage=3)
    assert s.vocab_coverage == 1.0
    assert GenerationStats().vocab_coverage is None


def test_the_registry_calls_smollm2_a_foreign_draft():
    r = run_cli("models")
    assert r.returncode == 0, r.stderr
    assert "not a valid draft" not in r.stdout and "a foreign draft for the Qwen models" in r.stdout
