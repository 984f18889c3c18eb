#!/usr/bin/env bash
# One-command GPU check, for a machine with a GPU and no network:
#
#   BACKEND=cuda benchmarks/gpu_check.sh OUT [SDIST [WHEELS]]
#
#   OUT     directory for gpu-check.json and gpu-check.md (and bench/, venv/)
#   SDIST   the llama-cpp-python sdist (llama_cpp_python-0.3.36.tar.gz) whose vendored llama.cpp is
#           built with the backend; without it pip downloads the sdist (needs the network)
#   WHEELS  a directory of wheels (`pip wheel ".[bench]" -w WHEELS` where there is a network): the
#           project is installed from it into OUT/venv with --no-index; without it the current
#           python's cactus-gguf is used
#
# Environment: BACKEND (cuda: -DGGML_CUDA=ON, the default; vulkan: -DGGML_VULKAN=ON, for AMD /
# Intel GPUs or Mesa's lavapipe), VERIFIER and DRAFT (GGUF paths; default: the default pair from
# ~/.cache/cactus-gguf), PROMPTS (4), N_PREDICT (64), CTX (n_ctx, -c; 2048), REPEATS (timed
# decodes per probed batch size; 5), THREADS (CPU threads, -t; default: all cores), PYTHON
# (python3), CACTUS_GGUF_LAVAPIPE_WARMUP (set to 1 here with BACKEND=vulkan; 0 for none), PEERS
# (1: llama.cpp's own speculation beside the small bench, `bench --peers`, from a llama-server
# built once with the same backend).
# On Mesa's lavapipe (a software Vulkan device) each context must first make a warm-up without
# which the driver crashes (cactus_gguf/llama/lavapipe.py); cactus-gguf makes it only when this
# variable asks, and only for contexts whose layers are on lavapipe: a real GPU makes none.
# Steps (benchmarks/gpu_check.py): build llama.cpp with the backend (cached), --list-devices,
# greedy SpS / Cactus equal to the verifier alone with -ngl 99 -ngld 99, the cost probe (verifier
# 1 ... 17 tokens, draft 1 token), a small bench (none, sps, the default rule; with PEERS=1
# llama-server's speculation beside them). Exit code 1 when a
# greedy answer differs from the verifier alone's.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: BACKEND=cuda benchmarks/gpu_check.sh OUT [SDIST [WHEELS]]}
sdist=${2:-}
wheels=${3:-}
python=${PYTHON:-python3}
mkdir -p "$out"
out=$(cd "$out" && pwd)

if [ -n "$wheels" ]; then
    "$python" -m venv "$out/venv"
    python="$out/venv/bin/python"
    # by name: the checkout as a requirement would be built here, and its build requirements
    # (setuptools) are not among the wheels
    "$python" -m pip install -q --no-index --find-links "$wheels" "cactus-gguf[bench]"
fi

args=(--backend "${BACKEND:-cuda}" -o "$out" --prompts "${PROMPTS:-4}" -n "${N_PREDICT:-64}"
      -c "${CTX:-2048}" --repeats "${REPEATS:-5}")
[ -n "$sdist" ] && args+=(--sdist "$sdist")
[ -n "${THREADS:-}" ] && args+=(-t "$THREADS")
[ -n "${VERIFIER:-}" ] && args+=(-m "$VERIFIER")
[ -n "${DRAFT:-}" ] && args+=(-md "$DRAFT")
[ "${PEERS:-0}" = 1 ] && args+=(--peers)
if [ "${BACKEND:-cuda}" = vulkan ]; then
    export CACTUS_GGUF_LAVAPIPE_WARMUP=${CACTUS_GGUF_LAVAPIPE_WARMUP:-1}
fi
cd "$out"  # the installed package, not the checkout's sources, when WHEELS was given
exec "$python" "$repo/benchmarks/gpu_check.py" "${args[@]}"
