"""llama.cpp's own server tests, unmodified, against ``cactus-gguf serve``.

The tests are ``tools/server/tests`` of the llama.cpp that the installed llama-cpp-python vendors;
they run through benchmarks/llama_server_shim.py, file by file, with a per-test timeout.

    python benchmarks/llama_server_tests.py                  # every test file
    python benchmarks/llama_server_tests.py test_basic.py    # some files
    python benchmarks/llama_server_tests.py --report-only    # the README again from raw/

Steps:

1. the tests: the llama-cpp-python sdist of the installed version, downloaded and extracted by
   cactus_gguf/bench/build.py (:func:`vendored_source`); its ``tools/server/tests`` and
   ``models/templates`` (which some tests name by relative path) are kept in
   ``<cache>/llama-server-tests/<version>/`` (``<cache>``: cactus-gguf's cache,
   ``$CACTUS_GGUF_CACHE`` else ``~/.cache/cactus-gguf``);
2. their packages: a virtual environment in that cache that sees this Python's packages
   (``--system-site-packages``, so cactus-gguf and what is installed already are used as they
   are) plus what requirements.txt lists and this Python lacks, and pytest-timeout;
3. the models: Hugging Face is out of reach, so the shim serves local stand-ins (the JSON file
   it reads: ``models.json`` in the cache): a tiny random-weight llama with ChatML as its chat
   template (llama-server's fallback for these models, which have none) and its noisy copy as
   the draft (tests/support/tiny_gguf.py) for the tinyllamas / stories models, the
   same with FIM tokens for the infill model, and the registry's SmolLM2-135M-Instruct for the
   larger instruct models. A file a test downloads itself (``download_file``) is put where it looks
   first (``tmp/<name>`` beside ``unit/``);
4. ``pytest unit/<file>`` per file with ``LLAMA_SERVER_BIN_PATH`` = the shim, a free ``PORT``,
   ``--timeout`` per test, JUnit XML into ``raw/``; as llama.cpp's tests.sh by default, the tests
   marked slow are left out (``-m "not slow"``; ``--slow`` runs them) and ``SLOW_TESTS`` is unset
   (the tests that read it skip themselves);
5. the report: each test passed, skipped, or not passed; a test that did not pass is *excluded*
   when it needs what this server does not claim (``EXCLUDED_FILES``, ``EXCLUDED``: embeddings,
   rerank, LoRA, multimodal, the model router, server-side MCP / tools, llama-server's
   host-memory prompt cache and debug log, or asserting the text of the model the test
   downloads), else a *failure*, with the reason in ``FAILURES`` (route missing, field
   missing, behaviour, needs a flag). ``results.json`` and ``README.md`` go to ``--out``
   (default benchmarks/results/llama-server-tests).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

SHIM = ROOT / "benchmarks" / "llama_server_shim.py"
OUT = ROOT / "benchmarks" / "results" / "llama-server-tests"
README_FILE = "README.md"

# whole files: what they test is a feature this server does not claim
EXCLUDED_FILES = {
    "test_embedding.py": "embeddings",
    "test_rerank.py": "rerank",
    "test_lora.py": "LoRA",
    "test_vision_api.py": "multimodal",
    "test_router.py": "the model router",
    "test_mcp_servers.py": "server-side MCP tools",
    "test_tools_builtin.py": "server-side tools (tools_builtin)",
    "test_proxy.py": "server-side MCP tools (the web UI's MCP CORS proxy)",
}
# single tests (a name without its [parameters] stands for all of them): (category, why), or
# (category, why, text): only when the failure's message holds that text (a reason measured on
# one version of serve does not stick to a test that now fails otherwise)
TEXT = "asserts the model's text (its words or its tokenizer's counts)"
CACHE_RAM = "the host-memory prompt cache (--cache-ram) and llama-server's debug log"
MULTIMODAL = "multimodal"
EXCLUDED: dict[str, tuple[str, ...]] = {
    "test_basic.py::test_load_split_model": (TEXT, "stories15M's words"),
    "test_chat_completion.py::test_chat_template": (
        TEXT, "the prompt starts with stories260K's BOS as its tokenizer writes it ('<s> ')",
        "<s> "),
    "test_chat_completion.py::test_logprobs": (
        TEXT, "the logprobs tokens joined equal the content only for an answer of whole UTF-8 "
        "characters: the stand-in's random bytes give lone bytes, whose token text llama-server "
        "writes 'byte: \\xNN' as serve does", 'byte: '),
    "test_chat_completion.py::test_logprobs_stream": (
        TEXT, "as test_logprobs, streamed", 'byte: '),
    "test_chat_completion.py::test_chat_completion": (
        TEXT, "stories260K's prompt token counts (n_prompt) and words"),
    "test_chat_completion.py::test_chat_completion_cached_tokens": (
        TEXT, "stories260K's prompt token counts"),
    "test_chat_completion.py::test_chat_completion_stream": (TEXT, "stories260K's words"),
    "test_chat_completion.py::test_chat_completion_with_openai_library": (
        TEXT, "stories260K's words"),
    "test_compat_oai_responses.py::test_responses_with_openai_library": (
        TEXT, "stories260K's words"),
    "test_compat_oai_responses.py::test_responses_stream_with_openai_library": (
        TEXT, "stories260K's words (read at the stream's response.completed)"),
    "test_compat_anthropic.py::test_anthropic_tool_result_with_image": (
        MULTIMODAL, "an image block to a text model (llama-server: 500)"),
    "test_compat_anthropic.py::test_anthropic_vision_format_accepted": (
        MULTIMODAL, "an image block to a text model (llama-server: 500)"),
    "test_compat_anthropic.py::test_anthropic_vision_base64_with_multimodal_model": (
        MULTIMODAL, "tinygemma3 and an image downloaded from Hugging Face"),
    "test_completion.py::test_completion": (
        TEXT, "stories260K's prompt token counts (n_prompt) and words"),
    "test_completion.py::test_completion_stream": (
        TEXT, "stories260K's prompt token counts and words"),
    "test_completion.py::test_completion_with_openai_library": (TEXT, "stories260K's words"),
    "test_completion.py::test_completion_stream_with_openai_library": (
        TEXT, "stories260K's words"),
    "test_completion.py::test_completion_stream_with_openai_library_stops": (
        TEXT, "Phi-3.5-mini's joke (slow test; SmolLM2-135M stands in)"),
    "test_completion.py::test_n_probs_post_sampling": (
        TEXT, "at least 10 candidates left after min-p for stories260K's first token"),
    "test_completion.py::test_completion_prompt_cache": (
        TEXT, "stories260K's prompt token counts ((40 + r) * 5 + 2)"),
    "test_ctx_shift.py::test_ctx_shift_disabled_stream": (
        TEXT, "stories260K never ends \"Once\" within 256 tokens; the stand-in samples its EOS"),
    "test_infill.py::test_infill_without_input_extra": (TEXT, "stories260K-infill's words"),
    "test_infill.py::test_infill_with_input_extra": (TEXT, "stories260K-infill's words"),
    "test_ctx_shift.py::test_ctx_shift_enabled": (
        TEXT, "stories260K's prompt is 226 tokens, within the slot's 256 positions (n_ctx 512 / "
        "-np 2); the stand-in's bytes make it 330: a 400", '400 == 200'),
    "test_ctx_shift.py::test_ctx_shift_disabled_short_prompt": (
        TEXT, "stories260K's token counts: n_predict -1 fills the slot's 256 positions after its "
        "prompt (248 predicted); the stand-in's longer prompt leaves fewer", '== 248'),
    "test_slot_save.py::test_slot_save_restore": (
        TEXT, "stories260K's words (Whiskers, Jack) and token counts (84 saved, 6 processed)",
        "match_regex"),
    "test_slot_save.py::test_slot_erase": (
        TEXT, "stories260K's words (Whiskers) and token counts", "match_regex"),
    "test_slot_save.py::test_slot_restore_legacy_token_list": (
        TEXT, "stories260K's token count (84 saved); then it rewrites llama-server's own token "
        "header in the file, which serve's llama.cpp state file does not have", "== 84"),
    "test_speculative.py::test_with_ctx_shift": (
        TEXT, "its prompt (\"Hello \" * 248) fits n_ctx 256 in stories15M's tokens, not the "
        "stand-in's bytes: a 400", '400'),
    "test_speculative.py::test_slot_ctx_not_exceeded": (
        TEXT, "\"Hello \" * 248 fits n_ctx 256 in stories15M's tokens, not the stand-in's bytes"),
    "test_speculative.py::test_multi_requests_parallel": (TEXT, "stories15M's words"),
    "test_kv_keep_only_active.py::test_clear_and_restore": (
        CACHE_RAM, "it reads llama-server's debug log for its own test tags "
        "(__TEST_TAG_CACHE_IDLE_SLOT*__, \"updating prompt cache\") while a host-memory prompt "
        "cache (--cache-ram) saves idle slots; serve keeps each slot's cache in its KV cache and "
        "has no host-memory copy to log"),
    "test_kv_keep_only_active.py::test_disabled_with_flag": (
        CACHE_RAM, "--cache-ram 0 turns llama-server's host-memory prompt cache off; the test "
        "checks its debug log has no tag of it, which would pass without testing anything"),
    "test_metrics.py::test_metrics_timings_on_prompt_progress": (
        TEXT, "its prompt (\"the quick brown fox ...\" * 8) fits the slot's 256 positions (n_ctx "
        "512 / -np 2) in stories260K's tokens; the stand-in's bytes make it 354: a 400",
        "a slot holds 256"),
    "test_slot_save.py::test_slot_save_restore_text_only_on_multimodal": (MULTIMODAL, "images"),
    "test_slot_save.py::test_slot_save_restore_with_image": (MULTIMODAL, "images"),
    "test_slot_save.py::test_slot_save_restore_with_two_images": (MULTIMODAL, "images"),
    "test_slot_save.py::test_slot_save_restore_with_image_across_restart": (MULTIMODAL, "images"),
    "test_slot_save.py::test_slot_save_restore_image_payload_larger_than_context": (
        MULTIMODAL, "images"),
    "test_slot_save.py::test_slot_restore_media_file_without_mmproj": (MULTIMODAL, "media"),
}
# the backlog: tests that fail on a route, field or behaviour of ours: (kind, why[, text]);
# a failure that no entry matches is reported "unclassified" with its message
ROUTE, FIELD, BEHAVIOUR, FLAG = "route missing", "field missing", "behaviour", "needs flag"
FAILURES: dict[str, tuple[str, ...]] = {
    "test_basic.py::test_server_slots": (
        ROUTE, "GET /slots is 404 (llama-server: 501 without --slots, the slots' state with it)",
        '404'),
    "test_chat_completion.py::test_completion_with_response_format": (
        FIELD, "response_format {\"type\": \"json_object\", \"schema\": ...} (\"schema: Extra "
        "inputs are not permitted\") and {\"type\": \"json_schema\"} without a schema", '400'),
    "test_chat_completion.py::test_invalid_chat_completion_req": (
        BEHAVIOUR, "two assistant messages at the end are served (llama-server: 400 / 500)",
        '200 == 400'),
    "test_chat_completion.py::test_logit_bias": (FIELD, "logit_bias is a 400", 'logit_bias'),
    "test_chat_completion.py::test_chat_completions_multiple_choices": (
        FIELD, "n = 2 is a 400 (\"only n=1 is supported\")", '400'),
    "test_chat_completion.py::test_verbose_debug": (
        FIELD, "\"verbose\": true gives no __verbose object (with the prompt)", '__verbose'),
    "test_compat_anthropic.py::test_anthropic_messages_streaming": (
        FIELD, "message_start's usage.input_tokens is 0 (llama-server: the prompt's tokens)",
        '0 > 0'),
    "test_compat_anthropic.py::test_anthropic_thinking": (
        FIELD, "thinking {\"type\": \"enabled\"} is a 400", '400'),
    "test_completion.py::test_completion_with_tokens_input": (
        FIELD, "batched / mixed prompts on /completion (a list of token lists, "
        "{\"prompt_string\": ...} objects): 400 \"prompt: Input should be a valid string\"", '400'),
    "test_completion.py::test_logit_bias": (FIELD, "logit_bias is a 400", '400'),
    "test_ignore_eos.py::test_ignore_eos_populates_logit_bias": (
        FIELD, "ignore_eos: true is a 400", '400'),
    "test_ignore_eos.py::test_ignore_eos_false_no_logit_bias": (
        FIELD, "no logit_bias in the answer's generation settings", 'logit_bias'),
    "test_metrics.py::test_metrics_disabled": (
        BEHAVIOUR, "/metrics is always served (llama-server: 501 without --metrics)", '200 == 501'),
    "test_metrics.py::test_metrics_prometheus_format": (
        FIELD, "no Process-Start-Time-Unix header on /metrics", 'Process-Start-Time-Unix'),
    "test_metrics.py::test_metrics_prompt_processed_and_cached": (
        FIELD, "no Process-Start-Time-Unix header on /metrics", 'Process-Start-Time-Unix'),
    "test_metrics.py::test_metrics_predicted_total_matches_requests": (
        FIELD, "no Process-Start-Time-Unix header on /metrics", 'Process-Start-Time-Unix'),
    "test_template.py::test_reasoning": (
        BEHAVIOUR, "tools on Command R7B's template, which reads them in its own calling "
        "convention, one serve does not parse: a 400", '400 == 200'),
}
# the shim's "needs FLAG" lines whose flag belongs to an excluded category
SHIM_EXCLUDED = {
    "--embedding": "embeddings", "--embeddings": "embeddings", "--pooling": "embeddings",
    "--reranking": "rerank", "--rerank": "rerank", "--lora": "LoRA",
    "--mmproj-url": "multimodal", "--mmproj": "multimodal", "--media-path": "multimodal",
    "(no model)": "the model router", "--models-dir": "the model router",
    "--models-max": "the model router", "--models-preset": "the model router",
    "--no-models-autoload": "the model router",
    "--tools": "server-side tools (tools_builtin)", "--tools-runtime": "server-side tools",
    "--mcp-servers-config": "server-side MCP tools", "--mcp-servers-json": "server-side MCP tools",
    "--ui-mcp-proxy": "server-side MCP tools",
}


# -- 1. the tests ---------------------------------------------------------------------------------
def _build():
    """cactus-gguf's llama.cpp build helpers (the sdist download and extraction)."""
    try:
        from cactus_gguf.bench import build
    except ImportError:  # before they moved
        from cactus_gguf.llama import build
    return build


def cache() -> Path:
    cache_root, llama_cpp_python_version = _build().cache_root, _build().llama_cpp_python_version

    return cache_root() / "llama-server-tests" / llama_cpp_python_version()


def tests_dir(sdist: Path | None) -> Path:
    """``tools/server/tests`` of the vendored llama.cpp, extracted once into the cache."""
    vendored_source = _build().vendored_source

    root = cache() / "llama.cpp"
    tests = root / "tools" / "server" / "tests"
    if (root / "DONE").exists():
        return tests
    root.parent.mkdir(parents=True, exist_ok=True)
    log = root.parent / "fetch.log"
    print(f"fetching llama-cpp-python's sdist for its server tests (log: {log})", flush=True)
    with tempfile.TemporaryDirectory(prefix="cactus-llama-tests-") as tmp:
        src = vendored_source(Path(tmp), log, sdist)
        shutil.rmtree(root, ignore_errors=True)
        for part in ("tools/server/tests", "models/templates"):
            shutil.copytree(src / part, root / part)
    (root / "DONE").write_text("")
    return tests


# -- 2. the packages ------------------------------------------------------------------------------
def environment(tests: Path) -> tuple[Path, list[str]]:
    """The virtual environment's Python, and a line per requirement it could not install."""
    venv = cache() / "venv"
    python = venv / "bin" / "python"
    notes: list[str] = []
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                       check=True)
    reqs = [r.strip() for r in (tests / "requirements.txt").read_text().splitlines()
            if r.strip() and not r.startswith("#")] + ["pytest-timeout"]
    for req in reqs:
        name = re.split(r"[~=<>!]", req)[0]
        have = subprocess.run([str(python), "-c", "import importlib.metadata as m, sys; "
                               f"print(m.version({name!r}))"], capture_output=True, text=True)
        if have.returncode == 0:
            wanted = req[len(name):]
            if wanted and not _compatible(have.stdout.strip(), wanted):
                notes.append(f"{req}: {have.stdout.strip()} installed (used as it is)")
            continue
        for spec in (req, name):
            r = subprocess.run([str(python), "-m", "pip", "install", "-q", spec],
                               capture_output=True, text=True)
            if r.returncode == 0:
                if spec != req:
                    notes.append(f"{req}: not installable, {name} unpinned installed")
                break
        else:
            notes.append(f"{req}: not installable ({r.stderr.strip().splitlines()[-1:]}); "
                         "tests importing it fail")
    return python, notes


def _compatible(version: str, spec: str) -> bool:
    if spec.startswith("~="):
        want = spec[2:].split(".")
        return version.split(".")[:len(want) - 1] == want[:-1]
    return True


# -- 3. the models --------------------------------------------------------------------------------
# the template llama-server falls back to for a GGUF without one (the tinyllamas / stories models)
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
FIM = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|repo_name|>",
       "<|file_sep|>"]
TINY_REPOS = ["ggml-org/models", "ggml-org/test-model-stories260K", "ggml-org/stories15M_MOE",
              "stories260K.gguf", "stories15M_MOE-F16.gguf", "ggml-org/test-preset-ci",
              "stories15M-q8_0-00001-of-00003.gguf", "stories15M-q4_0.gguf"]
FIM_REPOS = ["ggml-org/test-model-stories260K-infill"]
# files the tests download themselves (utils.download_file looks in its tmp folder first)
DOWNLOADED = {"stories15M-q4_0.gguf": "tiny-draft"}


def snapshot(rev: str) -> tuple[Path, str]:
    """The tracked files of commit ``rev`` in the cache (and the built native library copied in:
    it is not tracked), so that others' edits of the working tree during a long run change
    nothing; returns (the tree, its commit)."""
    sha = subprocess.run(["git", "rev-parse", rev], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    tree = cache() / "trees" / sha[:12]
    if not (tree / "DONE").exists():
        shutil.rmtree(tree, ignore_errors=True)
        tree.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", sha], cwd=ROOT, capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        for lib in (ROOT / "cactus_gguf").rglob("*.so"):
            target = tree / lib.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(lib, target)
        (tree / "DONE").write_text(sha + "\n")
    return tree, sha


def serve_flags(tree: Path) -> list[str]:
    """The flags of ``cactus-gguf serve`` (the tree's)."""
    code = ("import json; from cactus_gguf.cli import main; c = main.commands['serve']; "
            "print(json.dumps(sorted(o for p in c.params for o in (*p.opts, *p.secondary_opts) "
            "if o.startswith('-'))))")
    r = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(tree)}, check=True)
    return json.loads(r.stdout)


def models(tests: Path, tree: Path) -> Path:
    """models.json for the shim (writing the stand-ins once); see the module's text."""
    from support.tiny_gguf import write_llama

    from cactus_gguf.registry import pull_model

    d = cache() / "models"
    d.mkdir(parents=True, exist_ok=True)
    files = {"tiny": d / "tiny.gguf", "tiny-draft": d / "tiny-draft.gguf",
             "fim": d / "tiny-fim.gguf", "fim-draft": d / "tiny-fim-draft.gguf"}
    if not all(f.exists() for f in files.values()):
        write_llama(files["tiny"], seed=11, chat_template=CHATML)
        write_llama(files["tiny-draft"], seed=11, chat_template=CHATML, noise=0.5,
                    noise_seed=12)
        write_llama(files["fim"], seed=11, chat_template=CHATML, extra_control=FIM)
        write_llama(files["fim-draft"], seed=11, chat_template=CHATML, extra_control=FIM,
                    noise=0.5, noise_seed=12)
    smollm = str(pull_model("smollm2-135m-instruct-q4_1"))
    spec = {"tiny": [str(files["tiny"]), str(files["tiny-draft"])],
            "fim": [str(files["fim"]), str(files["fim-draft"])],
            "smollm": [smollm, smollm],
            "repos": {**{r: "tiny" for r in TINY_REPOS}, **{r: "fim" for r in FIM_REPOS}},
            "default": "smollm", "serve_flags": serve_flags(tree)}
    path = d / "models.json"
    path.write_text(json.dumps(spec, indent=1))
    (tests / "tmp").mkdir(exist_ok=True)
    for name, which in DOWNLOADED.items():
        target = tests / "tmp" / name
        if not target.exists():
            shutil.copy(files[which], target)
    return path


# -- 4. the runs ----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_file(python: Path, tests: Path, name: str, models_json: Path, raw: Path,
             timeout: int, slow: bool, tree: Path) -> dict:
    env = {**os.environ,
           "LLAMA_SERVER_BIN_PATH": str(SHIM),
           "CACTUS_SHIM_MODELS": str(models_json),
           "CACTUS_SHIM_PYTHON": sys.executable,
           "CACTUS_SHIM_TREE": str(tree),
           "PORT": str(free_port()),
           "PYTHONPATH": os.pathsep.join([str(SHIM.parent), os.environ.get("PYTHONPATH", "")]),
           "CACTUS_GGUF_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("SLOW_TESTS", None)
    xml = raw / f"{Path(name).stem}.xml"
    log = raw / f"{Path(name).stem}.log"
    cmd = [str(python), "-m", "pytest", f"unit/{name}", "-p", "llama_server_shim",
           "-p", "no:cacheprovider", f"--timeout={timeout}", "-rA", "-v",
           f"--junitxml={xml}", "-o", "junit_logging=all", "-o", "junit_family=xunit1",
           *([] if slow else ["-m", "not slow"])]
    t0 = time.monotonic()
    with open(log, "w") as f:
        subprocess.run(cmd, cwd=tests, env=env, stdout=f, stderr=subprocess.STDOUT)
    return {"file": name, "seconds": round(time.monotonic() - t0, 1)}


# -- 5. the report --------------------------------------------------------------------------------
NEEDS = re.compile(r"llama-server-shim: needs (\S+(?: \S+)?): (.*?) \(cactus-gguf serve")


def outcomes(xml: Path) -> list[dict]:
    """One dict per test case of a JUnit file: id, outcome, message, shim's needs line."""
    out = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = case.get("name")
        res = {"test": name, "outcome": "passed", "message": "", "needs": None,
               "seconds": float(case.get("time") or 0)}
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                res["outcome"] = "skipped" if tag == "skipped" else "failed"
                res["message"] = (el.get("message") or el.text or "").strip()[:400]
                break
        text = "".join(e.text or "" for e in case.iter() if e.tag in ("system-out",
                                                                       "system-err"))
        m = NEEDS.search(text)
        if m and res["outcome"] == "failed":
            res["needs"] = [m.group(1), m.group(2)]
        out.append(res)
    return out


def lookup(table: dict, file: str, test: str, message: str, exact: bool = False):
    """The entry of ``test`` (exact: its own, else its own or its function's) whose text, if it
    has one, is in ``message``; None when there is none."""
    for key in (f"{file}::{test}",) if exact else (f"{file}::{test}",
                                                   f"{file}::{test.split('[')[0]}"):
        hit = table.get(key)
        if hit is not None and (len(hit) < 3 or hit[2] in message):
            return hit
    return None


def classify(file: str, r: dict) -> None:
    """Adds ``status`` (passed / skipped / excluded / failed) and ``reason``."""
    if r["outcome"] in ("passed", "skipped"):
        r["status"], r["reason"] = r["outcome"], r["message"] if r["outcome"] == "skipped" else ""
        return
    if file in EXCLUDED_FILES:
        r["status"], r["reason"] = "excluded", EXCLUDED_FILES[file]
        return
    # an entry for the test itself, then the shim's "needs", then an entry for all parameters
    if (hit := lookup(EXCLUDED, file, r["test"], r["message"], exact=True)) is not None:
        r["status"], r["reason"] = "excluded", f"{hit[0]}: {hit[1]}"
        return
    if r["needs"] and r["needs"][0] in SHIM_EXCLUDED:
        r["status"], r["reason"] = "excluded", SHIM_EXCLUDED[r["needs"][0]]
        return
    if r["needs"]:
        r["status"], r["reason"] = "failed", f"{FLAG}: {r['needs'][0]} ({r['needs'][1]})"
        return
    if (hit := lookup(EXCLUDED, file, r["test"], r["message"])) is not None:
        r["status"], r["reason"] = "excluded", f"{hit[0]}: {hit[1]}"
        return
    r["status"] = "failed"
    if (hit := lookup(FAILURES, file, r["test"], r["message"])) is not None:
        r["reason"] = f"{hit[0]}: {hit[1]}"
    else:
        r["reason"] = "unclassified: " + r["message"].splitlines()[0][:200] if r["message"] \
            else "unclassified"


def report(out: Path, runs: list[dict], notes: list[str], timeout: int) -> dict:
    raw = out / "raw"
    files = []
    for run in runs:
        xml = raw / f"{Path(run['file']).stem}.xml"
        cases = outcomes(xml) if xml.exists() else []
        for c in cases:
            classify(run["file"], c)
        counts = {k: sum(c["status"] == k for c in cases)
                  for k in ("passed", "failed", "excluded", "skipped")}
        files.append({**run, "tests": len(cases), **counts, "cases": cases})
    total = {k: sum(f[k] for f in files) for k in ("tests", "passed", "failed", "excluded",
                                                    "skipped", "seconds")}
    data = {"llama_cpp_python": cache().name,
            "cactus_gguf": sorted({r.get("cactus_gguf", "working tree") for r in runs}),
            "per_test_timeout_s": sorted({r.get("timeout", timeout) for r in runs}),
            "environment_notes": notes, "total": total, "files": files}
    (out / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / README_FILE).write_text(readme(data))
    return data


def readme(data: dict) -> str:
    t = data["total"]
    lines = [
        "# llama.cpp's server tests against `cactus-gguf serve`",
        "",
        f"llama.cpp's own `tools/server/tests` (the llama.cpp that llama-cpp-python "
        f"{data['llama_cpp_python']} vendors), unmodified, run against `cactus-gguf serve` by",
        "",
        "    python benchmarks/llama_server_tests.py",
        "",
        "through benchmarks/llama_server_shim.py (llama-server's command line mapped to serve's), "
        f"serving cactus-gguf at {', '.join(data['cactus_gguf'])} (`--at REV`). Per-test timeout "
        f"{'/'.join(map(str, data['per_test_timeout_s']))} s. As llama.cpp's tests.sh by default, "
        "the tests marked slow are left out (`-m \"not slow\"`: 1-8B models) and `SLOW_TESTS` "
        "is unset (the tests reading it skip themselves).",
        "",
        f"**{t['passed']} passed, {t['failed']} failed, {t['excluded']} excluded, "
        f"{t['skipped']} skipped of {t['tests']}**, in {t['seconds'] / 60:.0f} minutes of wall "
        "time on a shared 2-core machine (file by file).",
        "",
        "How it runs (the details: the two scripts' module texts):",
        "",
        "- models: Hugging Face is out of reach here, so each model a test names is a local "
        "stand-in: the tinyllamas / stories models a tiny random-weight llama (ChatML template, "
        "llama-server's fallback for them; byte-level vocabulary), the infill model the same with "
        "FIM tokens, larger instruct models SmolLM2-135M-Instruct; each served with a draft "
        "(the tiny model's noisy copy; SmolLM2 itself), so speculation is on in every test;",
        "- flags: a llama-server flag serve has under the same name is passed on, a few are "
        "renamed (`--ctx-size` -> `-c`, `--spec-draft-n-max` -> `-k`, ...), those that change "
        "nothing visible are dropped (`--cont-batching`, `--ubatch-size`: speed settings), and "
        "one without a counterpart makes the shim exit with "
        "`needs FLAG` (the test fails at its server's start: \"needs flag\" below);",
        "- `ServerPreset.load_all` (the session fixture that starts every preset once to fill "
        "the download cache) is a no-op: nothing to download.",
        "",
        "A test that did not pass is *excluded* when it needs what this server does not claim "
        "(embeddings, rerank, LoRA, multimodal, the model router, server-side MCP tools / tools, "
        "llama-server's host-memory prompt cache and its debug log) or asserts the text of the "
        "model it downloads (here a stand-in answers); every other one that did not pass "
        "is a *failure*: the backlog below.",
        "",
        "| file | tests | passed | failed | excluded | skipped | seconds |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for f in data["files"]:
        lines.append(f"| {f['file']} | {f['tests']} | {f['passed']} | {f['failed']} | "
                     f"{f['excluded']} | {f['skipped']} | {f['seconds']:.0f} |")
    lines.append(f"| **all** | {t['tests']} | {t['passed']} | {t['failed']} | {t['excluded']} | "
                 f"{t['skipped']} | {t['seconds']:.0f} |")
    kinds: dict[str, int] = {}
    for f in data["files"]:
        for c in f["cases"]:
            if c["status"] in ("failed", "excluded"):
                key = f"{c['status']}: {c['reason'].split(':')[0]}"
                kinds[key] = kinds.get(key, 0) + 1
    lines += ["", "| why a test did not pass | tests |", "|---|---:|"]
    lines += [f"| {k} | {n} |" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1])]
    for status, title in (("failed", "Failures (the backlog)"), ("excluded", "Excluded")):
        lines += ["", f"## {title}", "", "| test | reason |", "|---|---|"]
        for f in data["files"]:
            for c in f["cases"]:
                if c["status"] == status:
                    test = c["test"].replace("|", "\\|")
                    lines.append(f"| {f['file']}::{test} | {c['reason'].replace('|', '/')} |")
    skipped = [(f["file"], c) for f in data["files"] for c in f["cases"]
               if c["status"] == "skipped"]
    if skipped:
        lines += ["", "## Skipped (by the tests themselves)", "", "| test | why |", "|---|---|"]
        for file, c in skipped:
            why = c["reason"].splitlines()[0][:160] if c["reason"] else ""
            test = c["test"].replace("|", "\\|")
            lines.append(f"| {file}::{test} | {why.replace('|', '/')} |")
    if data["environment_notes"]:
        lines += ["", "## The tests' packages", ""]
        lines += [f"- {n}" for n in data["environment_notes"]]
    lines += ["", "Raw: `raw/<file>.xml` (JUnit, with each test's output: the shim's serve "
              "command line, the server's log, the failure); `results.json` (every test, its "
              "status and reason); `raw/runs.json` (each file's time, timeout, commit). pytest's "
              "console output goes to `raw/<file>.log` (not committed).", "",
              "A test failing at its server's start is filed under the first flag the shim found "
              "without a counterpart (a test may need more than one).", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="test files (unit/NAME.py); default: all")
    ap.add_argument("--timeout", type=int, default=180, help="seconds per test")
    ap.add_argument("--slow", action="store_true",
                    help="run the tests marked slow too (llama.cpp's tests.sh leaves them out: "
                    "1-8B models, stood in here by SmolLM2-135M)")
    ap.add_argument("--at", metavar="REV",
                    help="serve cactus-gguf as committed at REV (a snapshot in the cache), not "
                    "the working tree (which others may be editing during a long run)")
    ap.add_argument("--sdist", type=Path, help="a llama-cpp-python sdist to take the tests from")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite results.json and README.md from raw/ (no test runs)")
    a = ap.parse_args()
    raw = a.out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    runs_file = raw / "runs.json"
    previous = json.loads(runs_file.read_text()) if runs_file.exists() else {"runs": [],
                                                                            "notes": []}
    runs = {r["file"]: r for r in previous["runs"]}
    notes = previous["notes"]
    if not a.report_only:
        tests = tests_dir(a.sdist)
        python, notes = environment(tests)
        tree, commit = (snapshot(a.at) if a.at else (ROOT, "working tree"))
        if a.at:
            print(f"serving cactus-gguf at {commit} (from {tree})", flush=True)
        models_json = models(tests, tree)
        names = a.files or sorted(p.name for p in (tests / "unit").glob("test_*.py"))
        for name in names:
            name = Path(name).name
            print(f"{name} ...", end=" ", flush=True)
            runs[name] = {**run_file(python, tests, name, models_json, raw, a.timeout, a.slow,
                                          tree),
                          "timeout": a.timeout, "slow": a.slow, "cactus_gguf": commit}
            print(f"{runs[name]['seconds']:.0f} s", flush=True)
            runs_file.write_text(json.dumps({"runs": sorted(runs.values(),
                                                            key=lambda r: r["file"]),
                                             "notes": notes}, indent=1) + "\n")
    data = report(a.out, sorted(runs.values(), key=lambda r: r["file"]), notes, a.timeout)
    for f in data["files"]:
        print(f"{f['file']:32} {f['passed']:3} passed {f['failed']:3} failed "
              f"{f['excluded']:3} excluded {f['skipped']:3} skipped")
    t = data["total"]
    print(f"all: {t['passed']} passed, {t['failed']} failed, {t['excluded']} excluded, "
          f"{t['skipped']} skipped of {t['tests']} ({t['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
