#!/usr/bin/env bash
# `symphony bench gpu` on a machine with an NVIDIA GPU, Python 3.12 with a CUDA torch and no
# internet. From the repository root, with .whl .sdist .gpumodel beside it
# (node/bench/gpu/prepare.sh makes them):
#     bash node/bench/gpu/check.sh        # $OUT: where the figures and logs go
# 1. installs the wheels into /tmp/site;
# 2. builds llama-cpp-python with CUDA (sm_90) into /tmp/llama in the background;
# 3. writes a GGUF of the default model's shape and size with seeded weights
#    (shaped_model.py: the real weights are too large to send);
# 4. while llama.cpp builds, runs the torch parts: bench-early.json (the build loads every
#    core, so these CPU baselines are not the ones to report);
# 5. once the build is done (or given up after BUILD_S), runs every part it can on the quiet
#    machine: bench.json, the figures to report.
# SKIP_EARLY=1 leaves every core to the build; EXTRA_CMAKE_ARGS adds to llama.cpp's build
# (-DGGML_CUDA_FA=OFF skips the flash-attention kernels, most of its compile time).
# Every step is capped so the whole ends within DEADLINE_S seconds.
set -u
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
DEADLINE_S=${DEADLINE_S:-530}
BUILD_S=${BUILD_S:-330}
T0=$(date +%s)
left() { echo $((DEADLINE_S - ($(date +%s) - T0))); }
log() { echo "[$(($(date +%s) - T0))s] $*" | tee -a "$OUT/check.log"; }
bench() {  # bench OUTFILE SECONDS ARGS...: one run of the bench, capped
    local out=$1 secs=$(($2 > 30 ? $2 : 30))
    shift 2
    log "bench $* (at most ${secs}s)"
    timeout -k 10 "$secs" python3 -c "from node.cli.main import main; main()" bench gpu \
        --json --model "$MODEL" "$@" > "$OUT/$out" 2> "$OUT/${out%.json}.log"
    log "bench $* exited $?"
}

nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1 || log "wheel install failed (pip.log)"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
log "wheels installed"

if ! command -v nvcc > /dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=/usr/local/cuda/bin:$PATH CUDACXX=/usr/local/cuda/bin/nvcc
fi
(
    export CMAKE_BUILD_PARALLEL_LEVEL=16
    export CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF \
-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
-DLLAMA_BUILD_SERVER=OFF ${EXTRA_CMAKE_ARGS:-}"
    timeout -k 10 "$BUILD_S" python3 -m pip install --no-index --no-build-isolation --no-deps \
        --no-cache-dir --target /tmp/llama .sdist/llama_cpp_python-*.tar.gz \
        > "$OUT/llama-build.log" 2>&1
    echo $? > /tmp/llama-build.rc
) &
BUILD=$!

MODEL=/tmp/SmolLM2-135M-Instruct.Q4_1.shaped.gguf
python3 -c "
from node.bench.gpu.shaped_model import synthesize
synthesize('.gpumodel/smollm2.header', '.gpumodel/smollm2.layout.json', '$MODEL')" \
    2>> "$OUT/check.log" || log "the shaped model could not be written"
log "model written"

[ -n "${SKIP_EARLY:-}" ] || bench bench-early.json $(($(left) - 240)) --only torch,verify
wait "$BUILD"
rc=$(cat /tmp/llama-build.rc 2>/dev/null || echo "?")
if [ "$rc" = 0 ]; then
    log "llama.cpp built with CUDA"
    export PYTHONPATH=/tmp/llama:$PYTHONPATH
    parts=llama,torch,verify,chain
else
    log "llama.cpp build failed or ran past ${BUILD_S}s (rc $rc): llama and chain not measured"
    parts=torch,verify
fi
bench bench.json $(($(left) - 5)) --only "$parts"
tail -c 20000 "$OUT/llama-build.log" > "$OUT/llama-build-tail.log" 2>/dev/null
rm -f "$OUT/llama-build.log"
log "done"
cat "$OUT/bench.json"
