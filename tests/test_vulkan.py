"""The GPU code path for real: llama.cpp's Vulkan backend on Mesa's lavapipe (a software Vulkan
device), with ``-ngl`` / ``-ngld`` offloading the layers, KV caches and logits of both models.

Everything runs in subprocesses on llama.cpp built with ``-DGGML_VULKAN=ON`` from the pinned
llama-cpp-python's vendored source (tests/support/llama_build.py: built once, cached in
~/.cache/cactus-gguf/gpu-build; the Debian packages are installed when missing), selected with
``LLAMA_CPP_LIB_PATH``: the CLI (``python -m cactus_gguf``), or one of the ``job_*`` functions
below through :func:`on_device` for what needs the API in-process (histograms, the KV shadow, load
cycles). The build's environment also sets ``CACTUS_GGUF_LAVAPIPE_WARMUP=1``: each context on
lavapipe first makes the warm-up without which the driver crashes (cactus_gguf/llama/lavapipe.py),
which cactus-gguf makes only when asked. Greedy runs compare against the verifier alone on the
*same* backend and placement: the
Vulkan kernels round differently from the CPU's, so CPU tokens are no reference. lavapipe runs on
the CPU and is slow (the real 1.5B verifier decodes ~0.6 tokens/s on 2 cores): the real pair's runs
are short, the long and statistical ones use the tiny pair.
"""
from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support.llama_build import gpu_build
from support.tiny_gguf import EOS
from support.harness import assert_one_line_error, cli_env

pytestmark = pytest.mark.vulkan  # builds llama.cpp with Vulkan, runs it on Mesa's lavapipe
HERE = Path(__file__).resolve().parent
PROMPT = "def fibonacci(n):"
ALL = ("-ngl", "99", "-ngld", "99")


@pytest.fixture(scope="module")
def build():
    return gpu_build("vulkan")


def cli(build, *args, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cactus_gguf", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout,
                          env=build.env(PYTHONPATH=cli_env()["PYTHONPATH"], **(env or {})))


def generate(build, *args, env: dict | None = None) -> dict:
    """``run ... --json`` on the Vulkan build (greedy unless ``--temp`` follows), as a dict."""
    r = cli(build, "run", *args, "-t", "2", "--temp", "0", "--json", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


_DRIVER = """
import json, sys
sys.path[:0] = json.loads(sys.argv[1])
import test_vulkan
print(json.dumps(getattr(test_vulkan, sys.argv[2])(**json.loads(sys.argv[3]))))
"""


def on_device(build, job: str, timeout: float = 900, **kwargs) -> dict:
    """``job(**kwargs)`` (a function of this module) in a fresh interpreter on the Vulkan build;
    its JSON-able result."""
    path = json.dumps([str(HERE), str(HERE.parent)])
    r = subprocess.run([sys.executable, "-c", _DRIVER, path, job, json.dumps(kwargs)],
                       capture_output=True, text=True, timeout=timeout,
                       env=build.env(PYTHONPATH=cli_env()["PYTHONPATH"]))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def placement(result: dict, role: str = "verifier") -> str:
    return result["placement"][role]["summary"]


# ------------------------------------------------------------------------------------------------
# The device, and where the layers go
# ------------------------------------------------------------------------------------------------

def test_list_devices_shows_lavapipe_and_where_each_model_would_go(build):
    r = cli(build, "run", "--list-devices", "-ngl", "10", "-devd", "none")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    print("\n".join(lines))
    assert "Vulkan" in lines[0] and "CPU" in lines[0]  # the backends
    assert any(line.strip().startswith("Vulkan0: llvmpipe") and "MiB" in line for line in lines)
    assert "verifier (-ngl 10: up to 10 layers): Vulkan0" in lines
    assert "draft: CPU only (-devd none)" in lines


# ------------------------------------------------------------------------------------------------
# Greedy: speculation equals the verifier alone, on every placement
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ngl, ngld, where_ver, where_dft", [
    ("99", "99", "3/3 layers on Vulkan0", "3/3 layers on Vulkan0"),
    ("2", "99", "2/3 layers on Vulkan0, 1 on CPU", "3/3 layers on Vulkan0"),   # partial offload
    ("99", "0", "3/3 layers on Vulkan0", "0/3 layers offloaded (CPU)"),       # draft on the CPU
    ("0", "99", "0/3 layers offloaded (CPU)", "3/3 layers on Vulkan0"),       # verifier on the CPU
], ids=["both-gpu", "partial", "draft-cpu", "verifier-cpu"])
def test_tiny_pair_greedy_speculation_equals_the_verifier_alone(build, tiny_pair, ngl, ngld,
                                                                 where_ver, where_dft):
    ver, dft = tiny_pair
    args = (ver, dft, "-p", "the cat sat on", "-n", "64", "-c", "512", "-ngl", ngl, "-ngld", ngld)
    alone = generate(build, *args, "--method", "none")
    assert placement(alone) == where_ver
    for method in ("sps", "cactus"):
        spec = generate(build, *args, "--method", method, "-k", "4")
        assert spec["tokens"] == alone["tokens"], method
        assert (placement(spec), placement(spec, "draft")) == (where_ver, where_dft)
        # the noisy draft is mostly rejected: the device KV cache is rolled back at most steps
        assert spec["n_drafted"] > spec["n_accepted"] + 100, method


def test_a_hybrid_pair_greedy_speculation_equals_the_verifier_alone(build, tmp_path):
    """qwen35 (gated delta-net beside attention) on the device, verifier and draft: the
    verifier's recurrent state rolls back through llama.cpp's snapshots, the draft's through
    checkpoints (state copies to and from the device). Past the snapshot window the verifier
    uses the same checkpoints (tests/test_recurrent_engine.py, k 20, on the CPU)."""
    k = "4"
    from support.tiny_gguf import write_qwen35

    ver = write_qwen35(tmp_path / "ver.gguf", seed=11)
    dft = write_qwen35(tmp_path / "dft.gguf", seed=11, noise=0.1, noise_seed=12)
    args = (ver, dft, "-p", "the cat sat on", "-n", "32", "-c", "512", *ALL)
    alone = generate(build, *args, "--method", "none")
    assert placement(alone).endswith("layers on Vulkan0")
    for method in ("sps", "cactus"):
        spec = generate(build, *args, "--method", method, "-k", k)
        assert spec["tokens"] == alone["tokens"], method
        assert placement(spec, "draft").endswith("layers on Vulkan0")
        assert spec["n_drafted"] > spec["n_accepted"] > 0, method


def test_real_pair_greedy_speculation_equals_the_verifier_alone(build, qwen_pair):
    """All 29 layers of both models on the device: SpS and Cactus give the verifier's tokens."""
    ver, dft = qwen_pair
    args = (ver, dft, "-p", PROMPT, "-n", "16", "-c", "512", *ALL)
    alone = generate(build, *args, "--method", "none")
    assert placement(alone) == "29/29 layers on Vulkan0"
    assert len(alone["tokens"]) == 16
    for method in ("sps", "cactus"):
        spec = generate(build, *args, "--method", method, "-k", "4")
        assert spec["tokens"] == alone["tokens"], method
        assert placement(spec, "draft") == "25/25 layers on Vulkan0"
        assert spec["n_drafted"] > spec["n_accepted"] > 0, method  # rejections: rollbacks


def job_methods_in_turn(ver: str, dft: str, n_predict: int) -> dict:
    """One engine, both models on the device: a whole greedy answer of the verifier alone (one-row
    decodes), then SpS, then Cactus, then the verifier alone again; tokens per method, and each
    context's warm-up (prompt tokens, rows)."""
    from support.harness import make_engine

    with make_engine(ver, dft, k=4, method="sps", temp=0.0) as dec:
        tokens = {}
        for i, method in enumerate(("none", "sps", "cactus", "none")):
            res = dec.generate("the cat sat on", n_predict=n_predict, method=method, seed=0)
            tokens[f"{i}:{method}"] = res.tokens
        where = dec.verifier.model.placement.summary(), dec.draft.model.placement.summary()
        warmup = [[c.warmup.prompt, c.warmup.rows] for c in (dec.verifier, dec.draft)]
    return {"tokens": tokens, "where": where, "warmup": warmup}


def test_verifier_alone_then_speculation_on_one_engine(build, tiny_pair):
    """The verifier alone for a whole answer, then SpS and Cactus on the same engine: on lavapipe
    the multi-row verification after one-row decodes grew flash attention's split-k scratch in the
    middle of a decode and crashed the driver's queue thread (llama/context.py: the warm-up)."""
    out = on_device(build, "job_methods_in_turn", ver=str(tiny_pair[0]), dft=str(tiny_pair[1]),
                    n_predict=64)
    assert out["where"] == ["3/3 layers on Vulkan0"] * 2
    assert out["warmup"] == [[0, 4]] * 2  # tests/test_lavapipe.py: n_ctx 512 needs no prompt
    tokens = out["tokens"]
    alone = tokens["0:none"]
    assert len(alone) == 64
    assert tokens == {"0:none": alone, "1:sps": alone, "2:cactus": alone, "3:none": alone}


def test_a_long_prompt_never_grows_the_scratch_after_the_warm_up(build, tiny_pair, tmp_path):
    """~1100 prompt tokens in a 2048-cell context, then SpS: one-row draft decodes and five-row
    verifications at 1024+ cached cells, where ggml-vulkan splits the cache more and uses larger
    row blocks. Before the warm-up planned for it (llama/lavapipe.py) this grew flash attention's
    split-k scratch and lavapipe died with SIGSEGV (rc 139). ggml's memory log shows one scratch
    request per context, the plan's (tests/test_lavapipe.py), and the tokens are the verifier's."""
    ver, dft = tiny_pair
    prompt = tmp_path / "long.txt"
    prompt.write_text(" ".join(str(i) for i in range(300)))
    args = (ver, dft, "-f", prompt, "-n", "48", "-c", "2048", *ALL)
    alone = generate(build, *args, "--method", "none")
    r = cli(build, "run", *args, "--method", "sps", "-k", "4", "-t", "2", "--temp", "0", "--json",
            env={"GGML_VK_MEMORY_LOGGER": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    spec = json.loads(r.stdout)
    assert spec["n_prompt_tokens"] > 1000 and spec["tokens"] == alone["tokens"]
    requests = [int(line.rsplit(" ", 1)[1].rstrip(")")) for line in r.stderr.splitlines()
                if "ggml_vk_preallocate_buffers(split_k_size:" in line]
    # each context's empty buffer (no device memory), then the plan's one request: verifier, draft
    assert requests == [0, 18432, 0, 18432]  # a 761-token prompt, then 8 rows



# ------------------------------------------------------------------------------------------------
# Sampling: the first emitted token follows the exact law, computed from this backend's logits
# ------------------------------------------------------------------------------------------------

def job_first_token_law(ver: str, dft: str, method: str, delta: float, n_runs: int) -> dict:
    """On the device (every layer: the default -ngl -1): the exact law of the first emitted token
    from the device's warped q and p, and a histogram of ``n_runs`` seeded generations."""
    from cactus_gguf.sampling import SamplingParams, reference
    from support.stats import decoder, first_position_dists, first_token_histogram

    sampling = SamplingParams(temperature=1.0, top_k=8, top_p=1.0, min_p=0.0)
    q, p = first_position_dists(ver, dft, sampling)
    expected = reference.emitted_first_token_distribution(p, q, method, delta=delta)
    with decoder(ver, dft, k=1, method=method, delta=delta) as dec:
        where = dec.verifier.model.placement.summary(), dec.draft.model.placement.summary()
        counts = first_token_histogram(dec, n_runs, len(q))
    return {"counts": counts.tolist(), "expected": expected.tolist(), "q": q.tolist(),
            "where": where}


@pytest.mark.parametrize("method, delta", [("sps", 0.0), ("cactus", 1.0)])
def test_first_emitted_token_follows_the_exact_law_on_the_device(build, tiny_pair, method, delta):
    from support.stats import ALPHA, chisquare_pvalue

    out = on_device(build, "job_first_token_law", ver=str(tiny_pair[0]), dft=str(tiny_pair[1]),
                    method=method, delta=delta, n_runs=3000)
    assert out["where"] == ["3/3 layers on Vulkan0"] * 2
    counts, expected = np.array(out["counts"]), np.array(out["expected"])
    assert chisquare_pvalue(counts, expected) > ALPHA
    if method == "cactus":  # the rule really moves mass towards the draft
        assert chisquare_pvalue(counts, np.array(out["q"]), strict=False) < ALPHA


def job_device_warps(ver: str, dft: str) -> dict:
    """Sampled SpS and Cactus at k 4 and 16, both models on the device, asked for llama.cpp's
    backend top-K (``backend_sampling`` on) and not: tokens per (method, k, mode), the
    steps run on the device's rows, and the warnings logged."""
    import logging

    from cactus_gguf.sampling import NativeSampler
    from support.harness import make_engine

    compact, said = 0, []
    verify = NativeSampler.verify_device

    def counted(s, *a, **kw):
        nonlocal compact
        got = verify(s, *a, **kw)
        compact += got is not None
        return got

    class Said(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())

    logging.getLogger("cactus_gguf.speculative.device").addHandler(Said(logging.WARNING))
    tokens = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(NativeSampler, "verify_device", counted)
        for method in ("sps", "cactus"):
            with make_engine(ver, dft, temp=1.0, top_k=8, top_p=0.95, method=method, k=4) as dec:
                for k, mode in itertools.product((4, 16), ("off", "on")):
                    res = dec.generate("the cat sat on", n_predict=40, seed=k, k=k,
                                       backend_sampling=mode)
                    tokens[f"{method}:{k}:{mode}"] = res.tokens
                where = dec.verifier.model.placement.summary(), dec.draft.model.placement.summary()
    return {"tokens": tokens, "compact": compact, "said": said, "where": where}


def test_warps_on_the_device_keep_the_full_rows_on_vulkan(build, tiny_pair):
    """``--backend-sampling on`` on a Vulkan build (issue 41): this llama.cpp's backend sampler
    aborts the process on Vulkan (llama/device_top_k.py ``vulkan_build``), so the steps keep the
    full rows, say so once, and give the same tokens for the same seed, SpS and Cactus, k 4 and
    16."""
    out = on_device(build, "job_device_warps", ver=str(tiny_pair[0]), dft=str(tiny_pair[1]))
    assert out["where"] == ["3/3 layers on Vulkan0"] * 2
    tokens = out["tokens"]
    for key in [k for k in tokens if k.endswith(":off")]:
        assert tokens[key] == tokens[key[:-3] + "on"] and len(tokens[key]) > 10, key
    assert out["compact"] == 0
    assert len(out["said"]) == 1 and "Vulkan" in out["said"][0]


# ------------------------------------------------------------------------------------------------
# The KV caches on the device: rollbacks over thousands of tokens, prefix reuse across turns
# ------------------------------------------------------------------------------------------------

def job_rollbacks(ver: str, dft: str, n_predict: int) -> dict:
    """A long sampled Cactus run with a noisy draft, both models on the device; llama.cpp's view
    of each cache (seq_pos_min / max) checked after every decode, truncate and clear (KvShadow)."""
    from support.harness import KvShadow, ctx, make_engine

    with pytest.MonkeyPatch.context() as mp:
        shadow = KvShadow.install(mp)
        with make_engine(ver, dft, k=4, method="cactus", temp=0.8,
                         context=ctx(n_ctx=4096)) as dec:
            res = dec.generate("the cat sat on", n_predict=n_predict, seed=4)
            committed = dec.tokenize("the cat sat on") + res.tokens
            held_ver, held_dft = shadow.held(dec.verifier), shadow.held(dec.draft)
            where = dec.verifier.model.placement.summary(), dec.draft.model.placement.summary()
            warmup = [[c.warmup.prompt, c.warmup.rows, c.warmup.complete]
                      for c in (dec.verifier, dec.draft)]
    return {"n_tokens": res.stats.n_tokens, "n_drafted": res.stats.n_drafted, "warmup": warmup,
            "n_accepted": res.stats.n_accepted, "ver_ok": held_ver == committed[:-1],
            "dft_ok": held_dft == committed[:len(held_dft)]
            and len(held_dft) >= len(committed) - 2, "where": where}


def test_thousands_of_tokens_of_rollbacks_keep_exactly_the_committed_prefix(build, tmp_path):
    from support.tiny_gguf import write_llama

    # EOS practically never sampled (a zero output row): the run goes the full length
    ver = write_llama(tmp_path / "long.gguf", seed=21, zero_output_rows=[EOS])
    dft = write_llama(tmp_path / "long_dft.gguf", seed=21, zero_output_rows=[EOS], noise=0.1,
                      noise_seed=22)
    out = on_device(build, "job_rollbacks", ver=str(ver), dft=str(dft), n_predict=2400)
    assert out["where"] == ["3/3 layers on Vulkan0"] * 2
    # 4096 cells in 64-row batches (tests/test_lavapipe.py); without a complete warm-up the split-k
    # scratch grew past 1024 cached cells and lavapipe died with SIGSEGV
    assert out["warmup"] == [[761, 8, True]] * 2
    assert out["n_tokens"] == 2400
    rejected_steps = out["n_drafted"] - out["n_accepted"]
    assert rejected_steps > 300, out  # hundreds of steps rolled the device caches back
    assert out["ver_ok"] and out["dft_ok"], out


def job_chat_turns(ver: str) -> dict:
    """Two chat turns on one engine (the second reuses the first's cached prefix), then the second
    turn again on a fresh engine; greedy, both models on the device."""
    from support.harness import make_engine

    first = [{"role": "user", "content": "the cat"}]
    with make_engine(ver, ver, k=3, method="sps", temp=0.0) as dec:
        a = dec.chat(first, n_predict=24)
        turn2 = first + [{"role": "assistant", "content": a.text},
                         {"role": "user", "content": "sat on"}]
        b = dec.chat(turn2, n_predict=24)
    with make_engine(ver, ver, k=3, method="sps", temp=0.0) as fresh:
        c = fresh.chat(turn2, n_predict=24)
    return {"reused": b.stats.n_prompt_tokens_reused, "prompt": b.stats.n_prompt_tokens,
            "tokens": b.tokens, "fresh_tokens": c.tokens, "fresh_reused":
            c.stats.n_prompt_tokens_reused}


def test_prefix_reuse_across_chat_turns(build, tmp_path):
    from support.tiny_gguf import CHAT_TEMPLATE, write_llama

    ver = write_llama(tmp_path / "chat.gguf", seed=11, chat_template=CHAT_TEMPLATE)
    out = on_device(build, "job_chat_turns", ver=str(ver))
    assert out["fresh_reused"] == 0
    assert 0 < out["reused"] < out["prompt"], out  # the first turn's tokens stayed on the device
    assert out["tokens"] == out["fresh_tokens"]   # and give what a fresh cache gives


# ------------------------------------------------------------------------------------------------
# -k auto: the cost probe on the device, cached apart from the CPU's
# ------------------------------------------------------------------------------------------------

def test_the_cost_probe_and_k_auto_run_on_the_device(build, tiny_pair, tmp_path):
    """The probe times the device's forwards and caches them under a key of their own: the same
    models, build and options with the layers on the CPU probe again (llama.cpp's system info,
    also in the key, is the same for both)."""
    ver, dft = tiny_pair
    env = {"CACTUS_GGUF_CACHE": str(tmp_path)}
    args = (ver, dft, "-p", "the cat sat on", "-n", "24", "-c", "512", "-k", "auto")
    on_gpu = generate(build, *args, *ALL, env=env)
    table = json.loads((tmp_path / "forward-costs.json").read_text())
    assert len(table) == 1 and placement(on_gpu) == "3/3 layers on Vulkan0"
    again = generate(build, *args, *ALL, env=env)  # a cache hit: same tokens, no new entry
    assert len(json.loads((tmp_path / "forward-costs.json").read_text())) == 1
    assert again["tokens"] == on_gpu["tokens"] and on_gpu["k"] == "auto"
    on_cpu = generate(build, *args, "-ngl", "0", "-ngld", "0", "-dev", "none", "-devd", "none",
                      env=env)
    assert placement(on_cpu) == "0/3 layers offloaded (CPU)"
    entries = json.loads((tmp_path / "forward-costs.json").read_text())
    assert len(entries) == 2, entries
    for entry in entries.values():  # verifier batches 1, 2, k_max / 2 + 1, k_max + 1; draft 1
        assert sorted(map(int, entry["verify"])) == [1, 2, 9, 17] and entry["draft"] > 0


# ------------------------------------------------------------------------------------------------
# Resources: load / free cycles, a KV cache the device cannot hold
# ------------------------------------------------------------------------------------------------

def job_load_free_cycles(ver: str, dft: str, n: int) -> dict:
    from cactus_gguf.llama import ContextOptions
    from support.harness import load_free_cycles

    rss, secs, maps = load_free_cycles(ver, dft, n, ContextOptions(n_ctx=4096, n_threads=1))
    return {"rss": rss, "secs": secs, "maps": maps}


def test_load_free_cycles_on_the_device_keep_memory_flat(build, tiny_pair, record_property):
    """Device buffers on lavapipe are host memory, so a leaked buffer, context or KV cache shows
    in the process's anonymous resident memory."""
    from support.harness import memory_slope
    from support.harness import MAX_SLOPE, WARMUP

    out = on_device(build, "job_load_free_cycles", ver=str(tiny_pair[0]), dft=str(tiny_pair[1]),
                    n=16)
    rss = out["rss"]
    slope = memory_slope(rss[WARMUP:])
    record_property("cycles_vulkan", f"RSS {rss[WARMUP - 1]:.1f} -> {rss[-1]:.1f} MiB, trend "
                    f"{slope:+.3f} MiB/cycle, {np.mean(out['secs']):.2f} s/cycle")
    assert out["maps"] == [0] * 16
    assert slope < MAX_SLOPE / 4, rss


def test_a_kv_cache_larger_than_the_device_is_a_one_line_error(build, tiny_pair):
    """lavapipe reports 2 GiB of device memory (and would allocate past it, in host memory): a
    KV cache of ~2.4 GiB is refused before llama.cpp allocates it, naming -c and the device."""
    ver, _ = tiny_pair
    r = cli(build, "run", ver, "-p", "hi", "-n", "2", "-k", "0", "-ngl", "99", "-c", "5000000")
    line = assert_one_line_error(r, "-c/--ctx-size=5000000", "Vulkan0", "GiB free",
                                 "lower -c/--ctx-size")
    assert r.returncode == 2, line
