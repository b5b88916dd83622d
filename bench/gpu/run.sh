#!/usr/bin/env bash
# GPU run on the device machine (no package registry there): build codecd with
# CUDA from the carried ggml sdist, install the carried wheels it lacks, run the
# opt-in GPU tests and the capacity benchmark, and write a report under $OUT.
#
#   carry: .whl (cp312 wheels: cffi pycparser gguf snac soxr websockets), .ggml (the sdist)
#   bash bench/gpu/run.sh [build|test|bench|all]...
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/codecd-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
SITE=/tmp/codecd-site
stage() { printf '\n=== %s (%s)\n' "$*" "$(date -u +%FT%TZ)" | tee -a "$OUT/report.txt"; }

deps() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE/deps" .whl/*.whl
}

build() {
    stage "build (CUDA, sm_90)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$OUT/report.txt"
    CMAKE_ARGS="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90" \
    CODECD_GGML_SDIST="$PWD/.ggml/ggml_python-0.0.45.tar.gz" CODECD_CACHE_DIR=/tmp/codecd-cache \
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
        python3 -m pip install --no-build-isolation --no-deps --no-index --no-cache-dir \
        --target "$SITE/codecd" . > "$OUT/build.log" 2>&1
    local rc=$?
    tail -3 "$OUT/build.log" | tee -a "$OUT/report.txt"
    return $rc
}

env_site() { export PYTHONPATH="$SITE/codecd:$SITE/deps${PYTHONPATH:+:$PYTHONPATH}"; }

tests() {
    stage "GPU tests: CODECD_TEST_GPU=1 pytest -m gpu tests/test_gpu.py"
    CODECD_TEST_GPU=1 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_gpu.py 2>&1 \
        | tee "$OUT/gpu_tests.txt" | grep -E "passed|failed|error|CUDA vs CPU|10k decodes|Error" \
        | tee -a "$OUT/report.txt"
}

bench() {
    stage "capacity: python3 bench/gpu_capacity.py"
    python3 bench/gpu_capacity.py "$@" 2>&1 | tee "$OUT/gpu_capacity.md" | tee -a "$OUT/report.txt"
}

deps
env_site
[ $# -eq 0 ] && set -- all
for what in "$@"; do
    case "$what" in
        build) build ;;
        test) tests ;;
        bench) bench ;;
        all) build && tests; bench ;;
        *) echo "unknown stage $what" >&2; exit 2 ;;
    esac
done
python3 -c "import codecrt; print('codecrt', codecrt.version(), codecrt.__file__)" | tee -a "$OUT/report.txt"
