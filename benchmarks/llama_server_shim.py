#!/usr/bin/env python3
"""The ``llama-server`` that llama.cpp's server tests start, made of ``cactus-gguf serve``.

It reads llama-server's command line and replaces itself with ``python -m cactus_gguf serve`` and
the equivalent flags (benchmarks/llama_server_tests.py points ``LLAMA_SERVER_BIN_PATH`` at it).

Each llama-server flag is one of these kinds:

- the same: serve has a flag of that name (the list ``serve_flags`` of the models file, which the
  runner reads from serve's own command): passed on as it is;
- mapped: serve has the same setting under its own name (``--ctx-size`` -> ``-c``, ``--alias``
  -> ``-a``, ``--spec-draft-n-max`` -> ``-k``, ...);
- dropped: it changes nothing a test can see on this server (``--jinja``, ``--offline``), or it
  tunes only speed (``--ubatch-size``, ``--cont-batching``);
- missing: serve has no counterpart. The shim then prints
  ``llama-server-shim: needs <flag>: <why>`` and exits with status 3 before anything loads,
  so the test fails at its server's start and the runner files it under "needs flag".

Defaults that differ: llama-server allows browser pages from any origin unless
``--cors-origins`` says otherwise, where serve sends no CORS headers unless ``--cors-origin`` is
given (a safer default, kept on purpose: docs/server.md). The shim translates what llama-server
would do, so a command line without ``--cors-origins`` becomes ``--cors-origin '*'``, which serve
answers with llama-server's headers (the page's origin echoed, credentials allowed, its method
list, any header: cactus_gguf/server/cors.py).

Acceptance: llama-server's speculation accepts a draft token when the verifier's own sample
is that token (the draft never touches the verifier's random numbers), which is serve's
``--method greedy``; the shim serves every test with it, so a seed gives the tokens of the
verifier alone, as llama-server's tests expect (test_speculative's with-and-without-draft).

Google Vertex AI's environment (``AIP_MODE=PREDICTION``, ``AIP_HTTP_PORT``, ...) reaches serve
as it is: serve reads it as llama-server does.

Models: Hugging Face is out of reach, so each ``--hf-repo`` / ``--hf-file`` / ``--model-url``
is replaced by a local stand-in named in the JSON file ``$CACTUS_SHIM_MODELS`` (written by the
runner): ``{"tiny": [verifier, draft], "smollm": [verifier, draft], "fim": [...],
"repos": {"<repo or file>": "tiny" | ...}, "default": "tiny"}``. Without ``-md`` the
stand-in's own draft is served with it, so every test runs with speculation on. ``--model PATH``
of an existing file is served as it is (with itself as the draft).

When run by pytest as a plugin (``-p llama_server_shim``), :func:`pytest_configure` turns the
tests' ``ServerPreset.load_all`` (a session fixture that starts every preset once only to fill
the model download cache) into a no-op: there is nothing to download, and a preset this server
cannot start (embeddings, rerank, the router) would otherwise fail every test of the session.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

EXIT_NEEDS_FLAG = 3
PREFIX = "llama-server-shim"

# llama-server flag -> ("map", serve flag) | ("drop", why) | ("missing", why). A flag's arity is
# in VALUED (takes a value) or not (a switch).
FLAGS: dict[str, tuple[str, str]] = {
    "--port": ("map", "--port"),
    "--host": ("map", "--host"),
    "--temp": ("map", "--temp"),
    "--seed": ("map", "--seed"),
    "--alias": ("map", "--alias"),
    "--ctx-size": ("map", "-c"),
    "-c": ("map", "-c"),
    "--batch-size": ("map", "-b"),
    "-b": ("map", "-b"),
    "--threads": ("map", "-t"),
    "-t": ("map", "-t"),
    "--n-gpu-layers": ("map", "-ngl"),
    "-ngl": ("map", "-ngl"),
    "-fa": ("map", "-fa"),
    "--flash-attn": ("map", "-fa"),
    "--n-predict": ("map", "-n"),
    "-n": ("map", "-n"),
    "--api-key": ("map", "--api-key"),
    "--spec-draft-n-max": ("map", "-k"),
    "--draft-max": ("map", "-k"),
    "--spec-draft-n-min": ("map", "--draft-min"),
    "--draft-min": ("map", "--draft-min"),
    "--verbose": ("map", "-v"),
    "-v": ("map", "-v"),
    "--backend_sampling": ("map", "--backend-sampling=on"),
    "--backend-sampling": ("map", "--backend-sampling=on"),
    "--offline": ("drop", "models are local stand-ins: nothing is downloaded"),
    "--ubatch-size": ("drop", "a speed setting: serve sizes its own micro-batches"),
    "-ub": ("drop", "a speed setting"),
    "--cont-batching": ("drop", "a speed setting: the slots' steps interleave"),
    "--slots": ("drop", "serve has no switch for it"),
    "--no-slots": ("drop", "serve has no switch for it"),
    "--swa-full": ("drop", "a memory setting of sliding-window models"),
    "--no-ui": ("missing", "turning the chat page at / off"),
    "--jinja": ("drop", "serve renders Jinja templates, and llama.cpp's built-in ones by name"),
    "--no-jinja": ("drop", "serve renders Jinja templates, and llama.cpp's built-in ones by name"),
    "--no-mmproj": ("drop", "no projector is loaded anyway"),
    "--no-cache-idle-slots": ("drop", "one engine: no idle slot to cache"),
    "--no-models-autoload": ("missing", "the model router (llama-server without a model)"),
    "--embedding": ("missing", "embeddings (/embedding, /v1/embeddings): not served"),
    "--embeddings": ("missing", "embeddings: not served"),
    "--reranking": ("missing", "rerank (/rerank): not served"),
    "--rerank": ("missing", "rerank: not served"),
    "--pooling": ("missing", "embedding pooling: embeddings are not served"),
    "--lora": ("missing", "LoRA adapters: not served"),
    "--mmproj-url": ("missing", "multimodal projectors: not served"),
    "--mmproj": ("missing", "multimodal projectors: not served"),
    "--media-path": ("missing", "multimodal media: not served"),
    "--models-dir": ("missing", "the model router"),
    "--models-max": ("missing", "the model router"),
    "--models-preset": ("missing", "the model router"),
    "--tools": ("missing", "server-side tools (tools_builtin): not served"),
    "--tools-runtime": ("missing", "server-side tools: not served"),
    "--mcp-servers-config": ("missing", "server-side MCP tools: not served"),
    "--mcp-servers-json": ("missing", "server-side MCP tools: not served"),
    "--ui-mcp-proxy": ("missing", "the web UI's MCP proxy: not served"),
    "--slot-save-path": ("missing", "slot save / restore (/slots?action=save): no such option"),
    "--context-shift": ("map", "--context-shift"),
    "--grp-attn-n": ("missing", "group attention (self-extend)"),
    "--grp-attn-w": ("missing", "group attention (self-extend)"),
    "-ctk": ("missing", "KV cache type: serve keeps llama.cpp's default f16"),
    "-ctv": ("missing", "KV cache type: serve keeps llama.cpp's default f16"),
    "--cache-type-k": ("missing", "KV cache type"),
    "--cache-type-v": ("missing", "KV cache type"),
    "--spec-type": ("spec", "--drafter"),
    "--spec-synth-len": ("map", "--spec-synth-len"),
    "--spec-synth-rates": ("map", "--spec-synth-rates"),
    "--reasoning-format": ("missing", "reasoning extraction (reasoning_content) options"),
    "--reasoning": ("map", "--reasoning"),
    "-rea": ("map", "-rea"),
    "--reasoning-budget": ("missing", "reasoning budget"),
    "--chat-template": ("map", "--chat-template"),
    "--chat-template-file": ("missing", "a chat template other than the GGUF's"),
    "--cache-ram": ("missing", "a host-memory prompt cache shared by slots (serve has one slot, "
                    "its prefix reuse in the KV cache, and nothing cached off it)"),
    "--cors-origins": ("map", "--cors-origin"),
    "--model": ("model", "-m"),
    "-m": ("model", "-m"),
    "--model-draft": ("model", "-md"),
    "-md": ("model", "-md"),
    "--hf-repo": ("model", "hf-repo"),
    "-hf": ("model", "hf-repo"),
    "-hfr": ("model", "hf-repo"),
    "--hf-file": ("model", "hf-file"),
    "-hff": ("model", "hf-file"),
    "--model-url": ("model", "url"),
    "-mu": ("model", "url"),
}
SWITCHES = {"--offline", "--cont-batching", "--metrics", "--slots", "--no-slots", "--kv-unified",
            "--swa-full", "--no-ui", "--jinja", "--no-jinja", "--no-mmproj",
            "--no-cache-idle-slots", "--no-models-autoload", "--embedding", "--embeddings",
            "--reranking", "--rerank", "--ui-mcp-proxy", "--context-shift", "--verbose", "-v",
            "--backend_sampling", "--backend-sampling"}


def needs(flag: str, why: str) -> None:
    print(f"{PREFIX}: needs {flag}: {why} (cactus-gguf serve has no counterpart)", flush=True)
    sys.exit(EXIT_NEEDS_FLAG)


def stand_ins() -> dict:
    path = os.environ.get("CACTUS_SHIM_MODELS")
    if not path:
        sys.exit(f"{PREFIX}: CACTUS_SHIM_MODELS is not set (run benchmarks/llama_server_tests.py)")
    return json.loads(Path(path).read_text())


def stand_in(models: dict, names: list[str]) -> tuple[str, str]:
    """The (verifier, draft) standing in for a Hugging Face repo / file / URL."""
    repos = models["repos"]
    for name in names:
        base = name.split(":")[0]
        for key in (name, base, base.rsplit("/", 1)[-1]):
            if key in repos:
                v, d = models[repos[key]]
                return v, d
    v, d = models[models["default"]]
    return v, d


def translate(argv: list[str], env: dict[str, str]) -> list[str]:
    """serve's arguments for llama-server's ``argv`` (exits through :func:`needs` for a flag
    without a counterpart)."""
    models = stand_ins()
    same = set(models.get("serve_flags", ()))
    out: list[str] = []
    model = draft = None
    remote: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        value = None
        if "=" in arg and arg.startswith("--"):
            arg, value = arg.split("=", 1)
        if arg in same and FLAGS.get(arg, ("", ""))[0] != "model":
            kind, target = "map", arg
        elif arg not in FLAGS:
            needs(arg, "a llama-server flag this shim does not know")
        else:
            kind, target = FLAGS[arg]
        if arg not in SWITCHES and value is None:
            if i + 1 >= len(argv):
                sys.exit(f"{PREFIX}: {arg} needs a value")
            value = argv[i + 1]
            i += 1
        i += 1
        if kind == "missing":
            needs(arg, target)
        elif kind == "drop":
            continue
        elif kind == "map":
            if "=" in target:
                out.append(target)
            elif arg in SWITCHES:
                out.append(target)
            elif target == "--cors-origin":
                for origin in value.split(","):
                    out += [target, origin.strip()]
            else:
                out += [target, value]
        elif kind == "spec":  # llama-server's draft types -> serve's --drafter
            if value == "draft-simple":
                continue  # a draft model: serve's default drafter
            if value.startswith("ngram"):
                out += [target, "ngram"]
            else:
                needs(f"--spec-type {value}", "a draft type serve does not have")
        elif target == "-m":
            model = value
        elif target == "-md":
            draft = value
        else:  # hf-repo, hf-file, url
            remote.append(value)
    if "--cors-origin" not in out:  # llama-server's default: any origin (the text above)
        out += ["--cors-origin", "*"]
    out += ["--method", "greedy"]  # llama-server's acceptance rule (the text above)
    if model is None and not remote:
        needs("(no model)", "the model router: llama-server started without a model")
    if model is not None and Path(model).is_file():
        verifier, own_draft = model, model
    else:
        verifier, own_draft = stand_in(models, remote + ([model] if model else []))
    if draft is not None:
        draft = draft if Path(draft).is_file() else stand_in(models, [draft])[1]
    return ["-m", verifier, "-md", draft or own_draft, *out]


def main() -> None:
    args = translate(sys.argv[1:], dict(os.environ))
    python = os.environ.get("CACTUS_SHIM_PYTHON", sys.executable)
    env = dict(os.environ)
    tree = env.get("CACTUS_SHIM_TREE")  # the cactus-gguf source tree to serve from
    if tree:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (tree, env.get("PYTHONPATH")) if p)
    cmd = [python, "-m", "cactus_gguf", "serve", *args]
    print(f"{PREFIX}: {' '.join(cmd)}", flush=True)
    os.execve(python, cmd, env)  # the tests' SIGTERM reaches serve itself


def pytest_configure(config) -> None:  # as a pytest plugin: see the module's text
    utils = sys.modules.get("utils")
    if utils is not None and hasattr(utils, "ServerPreset"):
        utils.ServerPreset.load_all = staticmethod(lambda: None)


if __name__ == "__main__":
    main()
