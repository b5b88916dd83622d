#!/usr/bin/env bash
# GPU run on the device machine (no package registry there): build codecd with
# CUDA from the carried ggml sdist, install the carried wheels it lacks, run the
# opt-in GPU tests and the capacity benchmark, and write a report under $OUT.
#
#   carry: .whl (cp312 wheels: cffi pycparser gguf snac soxr websockets), .ggml (the sdist)
#   bash bench/gpu/run.sh [build|test|bench|check|s3bench|vocos|all]...
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
    # twice: as shipped (cuBLAS TF32 for F32 products) and with TF32 off (F32-exact)
    for tf32 in on off; do
        stage "GPU tests, TF32 $tf32: CODECD_TEST_GPU=1 pytest -m gpu tests/test_gpu.py"
        if [ $tf32 = off ]; then export NVIDIA_TF32_OVERRIDE=0; else unset NVIDIA_TF32_OVERRIDE; fi
        CODECD_TEST_GPU=1 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_gpu.py 2>&1 \
            | tee "$OUT/gpu_tests_tf32_$tf32.txt" \
            | grep -E "passed|failed|error|CUDA vs CPU|10k decodes|streamed vs|Error|S3Gen" \
            | tee -a "$OUT/report.txt"
    done
    unset NVIDIA_TF32_OVERRIDE
}

bench() {
    stage "capacity: python3 bench/gpu_capacity.py ${BENCH_ARGS:-}"
    # shellcheck disable=SC2086
    python3 bench/gpu_capacity.py ${BENCH_ARGS:-} 2>&1 | tee "$OUT/gpu_capacity.md" | tee -a "$OUT/report.txt"
}

s3bench() {
    stage "S3Gen: python3 bench/s3gen.py --random --device cuda:0 --threads 16"
    python3 bench/s3gen.py --random --device cuda:0 --threads 16 --repeat 2 2>&1 | tee "$OUT/s3gen_bench.md" \
        | tee -a "$OUT/report.txt"
}

check() {
    for fusion in 0 1; do
        stage "stream check, TF32 off, GGML_CUDA_DISABLE_FUSION=$fusion"
        NVIDIA_TF32_OVERRIDE=0 GGML_CUDA_DISABLE_FUSION=$fusion python3 bench/gpu/stream_check.py 2>&1 \
            | tee -a "$OUT/report.txt"
    done
}

vocos() {
    # WavTokenizer, NeuCodec, XCodec2: full-size random models (no torch needed), CUDA against the CPU
    for tf32 in on off; do
        stage "vocos GPU tests, TF32 $tf32: CODECD_TEST_GPU=1 pytest -m gpu tests/test_vocos_gpu.py"
        if [ $tf32 = off ]; then export NVIDIA_TF32_OVERRIDE=0; else unset NVIDIA_TF32_OVERRIDE; fi
        CODECD_TEST_GPU=1 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_vocos_gpu.py 2>&1 \
            | tee "$OUT/vocos_gpu_tests_tf32_$tf32.txt" \
            | grep -E "passed|failed|error|CUDA vs CPU|on CUDA|Error" | tee -a "$OUT/report.txt"
    done
    unset NVIDIA_TF32_OVERRIDE
    stage "vocos offline decode: python3 bench/vocos.py --device cuda:0 --threads 16 --batch 1,16,64"
    # the PyTorch columns appear where the reference packages are installed
    python3 bench/vocos.py --device cuda:0 --threads 16 --seconds 10 --batch 1,16,64 2>&1 \
        | tee "$OUT/vocos_bench.md" | tee -a "$OUT/report.txt"
}

deps
env_site
[ $# -eq 0 ] && set -- all
for what in "$@"; do
    case "$what" in
        build) build ;;
        test) tests ;;
        bench) bench ;;
        check) check ;;
        s3bench) s3bench ;;
        vocos) vocos ;;
        all) build && tests; bench ;;
        *) echo "unknown stage $what" >&2; exit 2 ;;
    esac
done
python3 -c "import codecrt; print('codecrt', codecrt.version(), codecrt.__file__)" | tee -a "$OUT/report.txt"
