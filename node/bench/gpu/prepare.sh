#!/usr/bin/env bash
# Prepares, in the repository root, what node/bench/gpu/check.sh needs on a GPU machine with
# no internet (each folder is ignored through .git/info/exclude and carried to that machine):
#   .whl/      the wheels of node/bench/gpu/wheels.txt for CPython 3.12 on manylinux x86_64
#   .sdist/    llama-cpp-python's sdist (the version the models extra pins) without what a
#              CUDA build does not read (docs, tests, vocab files, other GPU backends, .git),
#              since the whole of it is larger than what may travel
#   .gpumodel/ the default model's GGUF header and tensor layout (node/bench/gpu/shaped_model.py):
#              its weights (~90 MiB) do not fit either
# Usage: bash node/bench/gpu/prepare.sh [PYTHON]   (PYTHON: one with the models extra installed)
set -euo pipefail
PY=${1:-.venv/bin/python}
cd "$(git rev-parse --show-toplevel)"
for d in /.whl/ /.sdist/ /.gpumodel/; do
    grep -qxF "$d" "$(git rev-parse --git-common-dir)/info/exclude" 2>/dev/null \
        || echo "$d" >> "$(git rev-parse --git-common-dir)/info/exclude"
done
rm -rf .whl .sdist .gpumodel && mkdir -p .whl .sdist .gpumodel
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform manylinux1_x86_64)
SOURCE_ONLY="python-baseconv varint"
grep -v '^#' node/bench/gpu/wheels.txt | while read -r req; do
    [ -n "$req" ] || continue
    if [[ " $SOURCE_ONLY " == *" ${req%%==*} "* ]]; then
        "$PY" -m pip wheel -q --no-deps -w .whl "$req"
    else
        "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp "${PLATFORMS[@]}" -d .whl "$req"
    fi
done
LLAMA=$(sed -n 's/^ *llama-cpp-python==\([0-9.]*\).*/\1/p' setup.cfg)
"$PY" -m pip download -q --no-deps --no-binary=:all: -d .sdist "llama-cpp-python==$LLAMA"
work=$(mktemp -d)
tar xzf ".sdist/llama_cpp_python-$LLAMA.tar.gz" -C "$work"
src="$work/llama_cpp_python-$LLAMA" && v="$src/vendor/llama.cpp" && g="$v/ggml/src"
rm -rf "$src"/{.git,.github,docs,tests,examples,docker} "$v"/{.git,.github,.devops,docs,benches,media,tests,tools/ui}
rm -rf "$g"/ggml-{cann,et,hexagon,metal,opencl,openvino,sycl,virtgpu,vulkan,webgpu,zdnn,zendnn}
find "$v/models" -name '*.gguf*' -delete
rm ".sdist/llama_cpp_python-$LLAMA.tar.gz"
tar czf ".sdist/llama_cpp_python-$LLAMA.tar.gz" -C "$work" "llama_cpp_python-$LLAMA"
rm -rf "$work"
"$PY" -c "
from models.registry import resolve
from node.bench.gpu.shaped_model import save_header
save_header(resolve(None).path, '.gpumodel/smollm2.header', '.gpumodel/smollm2.layout.json')"
du -sh .whl .sdist .gpumodel
