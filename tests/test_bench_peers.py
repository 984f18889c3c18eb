"""``bench --peers``: llama.cpp's own speculative decoding (llama-server) beside cactus-gguf.

Without a model: a recorded ``/completion`` response read into calls, tokens and acceptance, the
``/metrics`` parser, the request body and command line, the peer configurations, the summaries and
tables, and the one-line errors. ``test_bench_peers_runs_llama_server_on_the_tiny_pair`` runs
llama-server for real on the tiny GGUFs (marked ``slow``: the first run builds llama-server, about
10 minutes on 2 cores, cached in ``~/.cache/cactus-gguf/llama-server/``; later runs take seconds).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from cactus_gguf import bench
from cactus_gguf.bench import peers
from cactus_gguf.bench.report import peer_rows, per_prompt_rows
from cactus_gguf.cli import main
from cactus_gguf.errors import EngineError, InputError
from cactus_gguf.bench import build
from cactus_gguf.bench.build import llama_server_found
from cactus_gguf.options import LoadOptions, Request

RECORDED = Path(__file__).parent / "golden" / "llama_server_completion.json"

# /metrics of llama-server after one request (recorded on the tiny pair, k 3), trimmed
METRICS = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 4
# HELP llamacpp:n_decode_total Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 12
llamacpp:spec_decode_num_drafts_total 10
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 0
"""


@pytest.fixture
def recorded() -> dict:
    return json.loads(RECORDED.read_text(encoding="utf-8"))


# -- llama-server's answer read -------------------------------------------------------------------

def test_a_recorded_response_becomes_calls_tokens_and_acceptance(recorded):
    n_decode = recorded["_n_decode_delta"]  # /metrics n_decode_total across the request
    r = peers.record_from_response(recorded, n_batch=512, n_decode=n_decode, wall_seconds=56.0,
                                   cpu_seconds=100.8)
    assert (r["n_tokens"], r["n_end_tokens"], r["n_drafted"], r["n_accepted"]) == (64, 0, 57, 47)
    # llama-server's own count agrees with tokens produced - accepted drafts here (no stop string
    # ended the answer inside a step)
    assert r["n_steps"] == n_decode == 17 and r["tokens_minus_accepted"] == 64 - 47
    assert r["verifier_calls_from"].startswith("llama-server /metrics")
    assert r["acceptance_rate"] == pytest.approx(47 / 57)
    assert r["tokens_per_verifier_call"] == pytest.approx(64 / 17)
    assert r["mean_accepted_length"] == pytest.approx(47 / 17)
    assert r["stop_reason"] == "length" and r["text"] == recorded["content"]
    assert r["n_prompt_tokens"] == 278
    assert r["prefill_seconds"] == pytest.approx(19.406934)
    assert r["decode_seconds"] == pytest.approx(35.943511)
    assert r["answer_seconds"] == pytest.approx(19.406934 + 35.943511)
    assert r["cpu_utilisation"] == pytest.approx(1.8)
    assert r["draft_seconds"] is None and r["kl_sum"] == 0.0  # not measured / exact


def test_the_count_without_metrics_and_a_prompt_in_several_chunks(recorded):
    r = peers.record_from_response(recorded, n_batch=512)
    assert r["n_steps"] == 17 and r["verifier_calls_from"] == "tokens produced - accepted drafts"
    # 278 prompt tokens in chunks of 128: two more decodes that produced no token
    assert peers.record_from_response(recorded, n_batch=128, n_decode=19)["n_steps"] == 17


def test_an_answer_that_ends_at_end_of_generation(recorded):
    r = peers.record_from_response({**recorded, "stop_type": "eos"}, n_batch=512, n_decode=17)
    assert (r["n_tokens"], r["n_end_tokens"], r["stop_reason"]) == (63, 1, "eos")
    assert r["tokens_per_verifier_call"] == pytest.approx(64 / 17)  # the end token counts
    assert peers.record_from_response({**recorded, "stop_type": "word"},
                                      n_batch=512)["stop_reason"] == "stop"


def test_an_answer_without_drafts_and_a_response_without_counts(recorded):
    timings = {k: v for k, v in recorded["timings"].items() if not k.startswith("draft")}
    r = peers.record_from_response({**recorded, "timings": timings}, n_batch=512, n_decode=64)
    assert (r["n_drafted"], r["n_accepted"], r["acceptance_rate"], r["n_steps"]) == (0, 0, 0.0, 64)
    with pytest.raises(EngineError, match="lacks"):
        peers.record_from_response({"content": "x"}, n_batch=512)


def test_metrics_are_parsed():
    m = peers.parse_metrics(METRICS)
    assert m["n_decode_total"] == 12 and m["prompt_tokens_total"] == 4
    assert m["spec_decode_num_drafts_total"] == 10


# -- what llama-server is asked --------------------------------------------------------------------

def test_the_request_has_the_runs_warps_seed_and_stop_strings():
    req = Request(n_predict=32, temperature=0.6, top_k=20, top_p=0.95, min_p=0.0)
    body = peers.request_body([1, 2, 3], req, 7, ["```"])
    assert body["prompt"] == [1, 2, 3] and body["seed"] == 7 and body["stop"] == ["```"]
    assert (body["n_predict"], body["temperature"], body["top_k"], body["top_p"],
            body["min_p"]) == (32, 0.6, 20, 0.95, 0.0)
    assert body["samplers"] == ["top_k", "top_p", "min_p", "temperature"]  # cactus-gguf's order
    assert body["cache_prompt"] is False and "grammar" not in body
    assert peers.request_body([1], req.replace(json_object=True), 0, [])["json_schema"] == {
        "type": "object"}


def test_the_server_command_line_and_the_peer_configurations():
    cfg = peers.peer_configs((4,))[1]
    args = peers.server_args(Path("/bin/llama-server"), Path("v.gguf"), Path("d.gguf"), cfg,
                             LoadOptions(n_ctx=2048, n_batch=256), 8080, 2)
    line = " ".join(args)
    assert "-m v.gguf -md d.gguf --spec-type draft-simple --spec-draft-n-max 4" in line
    assert "--spec-draft-n-min 0 --spec-draft-p-min 0 " in line
    assert "-c 2048 -b 256 -t 2 -tb 2 -td 2 -tbd 2" in line and "--metrics" in args
    assert "--cache-ram 0" in line and "-np 1" in line and args[-2:] == ["--port", "8080"]
    assert [(c["id"], c["p_min"]) for c in peers.peer_configs((4,))] == [
        ("llama-server-pmin0.75-k4", 0.75), ("llama-server-pmin0-k4", 0.0)]
    assert [c["k"] for c in peers.peer_configs((4, "auto"))] == [4, 4]  # auto has no peer
    assert peers.peer_configs((2, 4))[0]["label"] == "llama-server p-min 0.75 k=2"
    with pytest.raises(InputError, match="fixed draft length") as e:
        peers.peer_configs(("auto",))
    assert e.value.param == "peers"


def test_the_plan_adds_the_peers_after_the_configurations(tiny_pair, tmp_path):
    ver, dft = tiny_pair
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "the cat"}\n', encoding="utf-8")
    plan = bench.plan_bench(dict(model=str(ver), model_draft=str(dft), prompts=str(prompts),
                                 configs=("none", "sps"), k=(3,), peers=True))
    assert [c["id"] for c in plan.configs] == ["none", "sps-k3", "llama-server-pmin0.75-k3",
                                               "llama-server-pmin0-k3"]
    assert plan.draft_spec == str(dft)
    with pytest.raises(InputError, match="DRAFT") as e:
        bench.plan_bench(dict(model=str(ver), prompts=str(prompts), configs=("none",),
                              peers=True))
    assert e.value.param == "peers"


# -- the summaries and tables ----------------------------------------------------------------------

def _run(prompt: str, config: str, steps: int, tokens: int, drafted: int, accepted: int,
         peer: bool = False) -> dict:
    return {"prompt": prompt, "config": config, "n_tokens": tokens, "n_steps": steps,
            "n_drafted": drafted, "n_accepted": accepted, "n_evaluated": 0, "kl_sum": 0.0,
            "kl_max": 0.0, "output_kl_sum": 0.0, "prefill_seconds": 1.0, "decode_seconds": 2.0,
            "draft_seconds": None if peer else 0.5, "verify_seconds": None if peer else 1.0,
            "accept_seconds": None if peer else 0.1, "other_seconds": None if peer else 0.4,
            "tokens_per_second": tokens / 2.0, "text": "", "passed": None, "valid": None}


def test_every_configuration_is_compared_per_answer_with_each_peer():
    configs = bench.config_grid(("sps",), (), (4,)) + peers.peer_configs((4,))
    runs = [_run("a", "sps-k4", 10, 40, 40, 30), _run("b", "sps-k4", 20, 60, 60, 40),
            _run("a", "llama-server-pmin0.75-k4", 20, 40, 30, 20, peer=True),
            _run("b", "llama-server-pmin0.75-k4", 30, 60, 40, 30, peer=True),
            _run("a", "llama-server-pmin0-k4", 15, 40, 40, 25, peer=True),
            _run("b", "llama-server-pmin0-k4", 15, 60, 60, 45, peer=True)]
    s = {x["config"]: x for x in bench.summarize(configs, runs)}
    vs = s["sps-k4"]["per_answer_vs_peers"]
    assert vs["llama-server-pmin0.75-k4"]["verifier_calls"] == pytest.approx(30 / 50)
    assert vs["llama-server-pmin0-k4"]["verifier_calls"] == pytest.approx(30 / 30)
    peer = s["llama-server-pmin0-k4"]
    assert peer["per_answer_vs_sps"]["verifier_calls"] == pytest.approx(30 / 30)
    assert set(peer["per_answer_vs_peers"]) == {"llama-server-pmin0.75-k4"}
    assert peer["acceptance_rate"] == pytest.approx(70 / 100)
    assert all(v is None for v in peer["time_share"].values())  # llama-server has no split
    assert s["sps-k4"]["time_share"]["verify"] == pytest.approx(2.0 / 4.0)
    report = {"summary": list(s.values()), "runs": runs}
    rows = peer_rows(report, "-")
    assert rows[0][-2:] == ["calls × llama-server p-min 0.75", "calls × llama-server p-min 0"]
    assert rows[1][:6] == ["sps", "3.00", "15.0", "50.0", "70%", "3.33"]
    assert rows[1][-2:] == ["0.60", "1.00"]
    assert per_prompt_rows(report, "-")[1] == ["a", "10 / 40", "20 / 40", "15 / 40"]


# -- one-line errors -------------------------------------------------------------------------------

def test_no_llama_server_to_find_or_build_is_one_line(tiny_pair, tmp_path):
    ver, dft = tiny_pair
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "the cat"}\n', encoding="utf-8")
    args = ["bench", str(ver), str(dft), "--prompts", str(prompts), "--configs", "none", "-k", "2",
            "-n", "2", "-c", "256", "-t", "1", "--no-progress", "--peers",
            "-o", str(tmp_path / "o")]
    # nothing on PATH: no llama-server, no cmake to build one; an empty cache
    env = {"PATH": str(tmp_path / "empty"), "CACTUS_GGUF_CACHE": str(tmp_path / "cache")}
    r = CliRunner().invoke(main, args, env=env)
    assert r.exit_code == 3, r.output
    errors = [line for line in r.output.splitlines() if line.startswith("cactus-gguf: error")]
    assert len(errors) == 1 and "cmake" in errors[0] and "Traceback" not in r.output
    r = CliRunner().invoke(main, args[:8] + ["auto"] + args[9:], env=env)
    assert r.exit_code == 1 and "--peers needs a fixed draft length" in r.output


def test_a_backend_build_has_its_own_cache_and_never_takes_path_s(tmp_path, monkeypatch):
    """gpu_check's llama-server (``backend_flags``): not the one on PATH (its backend is
    unknown), and cached apart from the CPU build."""
    on_path = tmp_path / "bin"
    on_path.mkdir()
    (on_path / "llama-server").write_text("#!/bin/sh\n")
    (on_path / "llama-server").chmod(0o755)
    monkeypatch.setenv("PATH", str(on_path))
    monkeypatch.setenv("CACTUS_GGUF_CACHE", str(tmp_path / "cache"))
    assert llama_server_found() == on_path / "llama-server"
    assert llama_server_found(("-DGGML_VULKAN=ON",)) is None
    cpu, vulkan = build._server_root(), build._server_root(("-DGGML_VULKAN=ON",))
    assert cpu != vulkan and cpu.parent == vulkan.parent
    (vulkan / "bin").mkdir(parents=True)
    (vulkan / "bin" / "llama-server").write_text("")
    (vulkan / "DONE").write_text("")
    assert llama_server_found(("-DGGML_VULKAN=ON",)) == vulkan / "bin" / "llama-server"


# -- llama-server for real ------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("CACTUS_GGUF_BUILD_LLAMA_SERVER") != "1"
                    and llama_server_found() is None,
                    reason="no llama-server on PATH or built in the cache; building one takes "
                           "10-20 minutes on 2 cores, more than the test run's budget: "
                           "python -m cactus_gguf.bench.build, or CACTUS_GGUF_BUILD_LLAMA_SERVER=1")
def test_bench_peers_runs_llama_server_on_the_tiny_pair(tiny_pair, tmp_path):
    """The tiny pair, greedy: llama.cpp's speculation is exact, so each peer's answer is the
    verifier alone's (cactus-gguf's none), token for token; the counts add up; the report has
    the comparison. Runs where llama-server is there (benchmarks/results/peers was measured with
    it); CACTUS_GGUF_BUILD_LLAMA_SERVER=1 builds it first."""
    from cactus_gguf.bench.build import llama_server

    llama_server()  # found or built (once) before the timed part
    ver, dft = tiny_pair
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "cat", "prompt": "the cat sat on the mat"}\n'
                       '{"id": "hello", "prompt": "hello world"}\n', encoding="utf-8")
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["bench", str(ver), str(dft), "--prompts", str(prompts),
                                  "--configs", "none,sps", "-k", "3", "-n", "12", "--temp", "0",
                                  "-c", "256", "-t", "1", "--forward-repeats", "1", "--no-plot",
                                  "--no-progress", "--peers", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "beside llama-server" in r.output
    report = json.loads((out / "bench.json").read_text(encoding="utf-8"))
    runs = {(x["prompt"], x["config"]): x for x in report["runs"]}
    for prompt in ("cat", "hello"):
        alone = runs[(prompt, "none")]
        for cid in ("llama-server-pmin0.75-k3", "llama-server-pmin0-k3"):
            peer = runs[(prompt, cid)]
            assert peer["text"] == alone["text"] and peer["n_tokens"] == alone["n_tokens"] == 12
            assert peer["n_steps"] == peer["tokens_minus_accepted"]  # both counts agree
            assert peer["n_steps"] == peer["n_tokens"] - peer["n_accepted"]
            assert peer["verifier_calls_from"].startswith("llama-server /metrics")
            assert 0 <= peer["n_accepted"] <= peer["n_drafted"] <= 3 * peer["n_steps"]
            assert peer["seed"] == alone["seed"] and math.isfinite(peer["answer_seconds"])
    facts = report["peers"]
    assert "--spec-type" in facts["args"]["llama-server-pmin0-k3"] and facts["version"]
    md = (out / "bench.md").read_text(encoding="utf-8")
    assert "Beside llama.cpp's own speculation" in md and "| cat |" in md
    assert (out / "llama-server-pmin0-k3.log").exists()
