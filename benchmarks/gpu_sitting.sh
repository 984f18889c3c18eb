#!/usr/bin/env bash
# The GPU sitting: one command for an H100 / H200 lent through the workplace's `device` tool (no
# network, no package registry; 64 MiB of tree, 10 minutes a command, 15 minutes of device time).
#
#   benchmarks/gpu_sitting.sh OUT          # BACKEND=cuda (default) or cpu (the rehearsal here)
#
# Needs `python benchmarks/gpu_tree.py` run first where there is a network: it writes .gpu/ (ignored
# by git; carried): the trimmed llama-cpp-python 0.3.36 source (2.6 MiB .tar.xz of 22.5 MiB), the
# wheels the device image lacks, and the default pair's description (tokenizer, shapes, types).
#
# The exact device call (tool `run`; nothing else to install there):
#
#   command:   bash benchmarks/gpu_sitting.sh "$OUT"
#   carry:     [".gpu"]
#   timeout_s: 590
#
# If the call overruns (the CUDA build's time is unmeasured: docs/benchmarks.md "The GPU sitting"),
# the same command again on the still-warm machine resumes: what finished stays under WORK
# (/tmp/gpu-sitting: the build's DONE file, the models' pair.json, each bench run's files) and is
# skipped, an unfinished bench run continues (`bench --resume`).
#
# Steps, each timed into OUT/steps.jsonl (the log: OUT/sitting.log):
#   1. build: llama.cpp from the trimmed tree, one CMake build (Ninja, all cores): libllama and
#      libggml* (shared; CUDA for the GPU's own architecture only, from nvidia-smi), llama-server
#      (for `bench --peers`, llama.cpp's draft-simple speculation) and llama-quantize (the models).
#   2. install: into WORK/site (PYTHONPATH): the carried wheels (first, so that the synthetic
#      pair's F16 files are written while llama.cpp compiles), llama-cpp-python's Python package
#      over those libraries (its llama.cpp build is the one of step 1, as CMAKE_ARGS="-DGGML_CUDA=on"
#      pip install would make it), and this checkout (setup.py build_py + build_ext: the package,
#      its model registry and its native helper).
#   3. models: the synthetic pair (benchmarks/synthetic_pair.py): the real pair's architecture,
#      shapes, tokenizer and quantization (Qwen2.5-Coder 1.5B / 0.5B, Q4_K_M), random weights
#      arranged so that both models continue any token with a fixed successor and the draft agrees
#      with the verifier on a chosen share of tokens. The real pair (1.6 GB) cannot travel.
#   4. bench (benchmarks/gpu_sitting.py): `cactus-gguf bench`, every layer offloaded, 6 HumanEval
#      and 6 chat prompts: the verifier alone, the default rule and SpS at -k 4 and -k auto,
#      llama-server draft-simple at k = 4 (--peers), then the verifier alone and the default rule
#      again with --backend-sampling on; OUT/bench.md and OUT/bench.json.
#
# Environment: BACKEND (cuda | cpu), WORK (/tmp/gpu-sitting), JOBS (all cores), CUDA_ARCH (from
# nvidia-smi, else 90), CUDA_FA (ON; OFF compiles ggml-cuda without its flash-attention kernels, a
# shorter build whose attention runs without them: the last resort if the build cannot fit),
# STEPS (build,install,models,bench), and for the bench (gpu_sitting.py):
# N_PREDICT (128), PROMPTS (6 per set), AGREE (0.9: the share of tokens on which the draft
# predicts the verifier's successor), SIZE (real: the Qwen2.5-Coder shapes; tiny: a 2-layer pair
# for a quick rehearsal), THREADS (all cores), BUDGET (560: seconds from the start after which no
# bench run starts and a running one is stopped, to be resumed), RUNS (all four bench runs).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: benchmarks/gpu_sitting.sh OUT}
mkdir -p "$out"
out=$(cd "$out" && pwd)
backend=${BACKEND:-cuda}
work=${WORK:-/tmp/gpu-sitting}
jobs=${JOBS:-$(nproc)}
steps=",${STEPS:-build,install,models,bench},"
version=0.3.36
src=$work/llama_cpp_python-$version
build=$work/build-$backend
site=$work/site
python=${PYTHON:-python3}
mkdir -p "$work"
export PYTHONUNBUFFERED=1  # the log stays whole when the call is stopped at its limit
exec > >(tee -a "$out/sitting.log") 2>&1
t_start=$(date +%s)

# one line per step into OUT/steps.jsonl: name, seconds, and whether it ran or was already done
step_done() {  # NAME SECONDS STATUS
    printf '{"step": "%s", "seconds": %s, "status": "%s"}\n' "$1" "$2" "$3" >>"$out/steps.jsonl"
    echo "== $1: $3 in $2 s (total $(( $(date +%s) - t_start )) s)"
}

children_cpu() {  # CPU seconds (user + sys) of the finished children of this script, from /proc
    awk -v hz="$(getconf CLK_TCK)" '{print int(($16 + $17) / hz)}' "/proc/$$/stat"
}

echo "== gpu_sitting: backend $backend, $jobs jobs, work $work, $(date -u +%FT%TZ)"
uname -m; nproc; "$python" --version
if [ "$backend" = cuda ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv || true
    nvcc --version | tail -2 || true
fi
cmake --version | head -1; ninja --version || echo "no ninja: make"

# 0. the wheels, then the synthetic pair's F16 files in the background while llama.cpp compiles
# (they need gguf and numpy, not the build; the models step quantizes them) -----------------------
f16_pid=
if [[ $steps == *,install,* ]]; then
    rm -rf "$site"
    mkdir -p "$site"
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
        "$repo"/.gpu/whl/*.whl
fi
if [[ $steps == *,models,* ]] && [ ! -f "$work/models/pair.json" ]; then
    PYTHONPATH=$site "$python" "$repo/benchmarks/synthetic_pair.py" \
        "$repo/.gpu/qwen2.5-coder-pair.json.xz" "$work/models" --agree "${AGREE:-0.9}" \
        --size "${SIZE:-real}" >"$work/f16.log" 2>&1 &
    f16_pid=$!
    echo "== models: writing the F16 pair in the background (pid $f16_pid)"
fi

# 1. build ----------------------------------------------------------------------------------------
if [[ $steps == *,build,* ]]; then
    t0=$(date +%s)
    if [ -f "$build/DONE" ]; then
        step_done build 0 "already built"
    else
        rm -rf "$src"
        tar -xJf "$repo/.gpu/llama-cpp-python-$version.tar.xz" -C "$work"
        flags=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
               -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON
               -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF
               -DLLAMA_USE_PREBUILT_UI=OFF
               '-DCMAKE_BUILD_RPATH=$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON
               '-DCMAKE_INSTALL_RPATH=$ORIGIN' -DCMAKE_INSTALL_RPATH_USE_LINK_PATH=ON)
        # (the last: the CUDA toolkit's libraries found at run time through the RPATH, as
        # llama-cpp-python's own build sets it)
        if [ "$backend" = cuda ]; then
            # the GPU's own architecture only, machine code alone (9.0 on H100 / H200 -> 90-real):
            # ggml-cuda's default list compiles its ~145 CUDA units for several architectures
            arch=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null \
                                | head -1 | tr -d ' .')}
            flags+=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=${arch:-90}-real" -DGGML_CUDA_NCCL=OFF
                    "-DGGML_CUDA_FA=${CUDA_FA:-ON}")
        fi
        generator=(-G Ninja)
        command -v ninja >/dev/null || generator=()  # CMake's default (make) then
        cmake -S "$src/vendor/llama.cpp" -B "$build" "${generator[@]}" "${flags[@]}" \
            >"$work/configure.log" 2>&1 \
            || { tail -40 "$work/configure.log"; cp "$work/configure.log" "$out/"; exit 2; }
        t1=$(date +%s)
        echo "== configured in $(( t1 - t0 )) s; building llama ggml llama-server llama-quantize"
        # the compile's CPU seconds (children's user + sys, from /proc): what a machine with more
        # cores divides; the wall time on a shared 2-core machine is no measure
        cpu0=$(children_cpu)
        if ! cmake --build "$build" --target llama ggml llama-server llama-quantize -j "$jobs" \
                >"$work/build.log" 2>&1; then
            tail -60 "$work/build.log"; tail -400 "$work/build.log" >"$out/build-tail.log"; exit 2
        fi
        cpu=$(( $(children_cpu) - cpu0 ))
        echo "== build: $(grep -c '^\[' "$work/build.log") steps, $cpu CPU seconds (user + sys), $jobs jobs"
        printf '{"step": "build-cpu-seconds", "seconds": %s, "jobs": %s}\n' "$cpu" "$jobs" \
            >>"$out/steps.jsonl"
        date +%s >"$build/DONE"
        step_done build $(( $(date +%s) - t0 )) built
    fi
    ls "$build/bin"
fi

# 2. install --------------------------------------------------------------------------------------
if [[ $steps == *,install,* ]]; then
    t0=$(date +%s)
    # llama-cpp-python: its Python package over the libraries of step 1, with the metadata that
    # importlib.metadata.version("llama-cpp-python") reads
    cp -r "$src/llama_cpp" "$site/llama_cpp"
    mkdir -p "$site/llama_cpp/lib" "$site/llama_cpp_python-$version.dist-info"
    cp -P "$build"/bin/*.so* "$site/llama_cpp/lib/"
    printf 'Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: %s\n' "$version" \
        >"$site/llama_cpp_python-$version.dist-info/METADATA"
    # this checkout: setup.py's own steps copy the package with the model registry (build_py) and
    # compile the native helper into it (build_ext), as `pip install .` does, without needing pip's
    # wheel builder; the metadata importlib.metadata reads
    (cd "$repo" && "$python" setup.py -q build_py --build-lib "$site" \
        build_ext --build-lib "$site" --build-temp "$work/native-build") >"$work/install.log" 2>&1 \
        || { tail -30 "$work/install.log"; exit 2; }
    ver=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/pyproject.toml")
    mkdir -p "$site/cactus_gguf-$ver.dist-info"
    printf 'Metadata-Version: 2.1\nName: cactus-gguf\nVersion: %s\n' "$ver" \
        >"$site/cactus_gguf-$ver.dist-info/METADATA"
    step_done install $(( $(date +%s) - t0 )) installed
fi
export PYTHONPATH=$site PATH=$build/bin:$PATH
if [ "$backend" = cuda ] && command -v nvcc >/dev/null; then  # belt and braces beside the RPATH
    cuda_root=$(dirname "$(dirname "$(command -v nvcc)")")
    export LD_LIBRARY_PATH=$cuda_root/lib64:$cuda_root/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# the installed copy, not the checkout's sources (the checkout has no native helper built)
cd "$work"

# 3 and 4. models and bench ------------------------------------------------------------------------
if [ -n "$f16_pid" ]; then
    t0=$(date +%s)
    wait "$f16_pid" || { cat "$work/f16.log"; exit 2; }
    cat "$work/f16.log"
    step_done models-f16-wait $(( $(date +%s) - t0 )) "waited for the F16 pair"
fi
if [[ $steps == *,models,* ]] || [[ $steps == *,bench,* ]]; then
    BACKEND=$backend STEPS=$steps WORK=$work T_START=$t_start \
        "$python" "$repo/benchmarks/gpu_sitting.py" -o "$out" --quantize "$build/bin/llama-quantize"
fi
echo "== gpu_sitting: done in $(( $(date +%s) - t_start )) s"
