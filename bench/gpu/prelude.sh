# Sourced by the bench/gpu/session*.sh calls: build codecd with CUDA on the
# device machine (bench/gpu/run.sh build), point Python at the build and the
# carried wheels, and define the report helpers.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-/tmp/codecd-gpu-out}
ulimit -n 65536
bash bench/gpu/run.sh build || { tail -40 "$OUT/build.log"; exit 1; }
export PYTHONPATH="/tmp/codecd-site/codecd:/tmp/codecd-site/deps${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

# a titled section of $OUT/report.txt
stage() { printf '\n=== %s (%s)\n' "$*" "$(date -u +%T)" | tee -a "$OUT/report.txt"; }

# every opt-in GPU test (TF32 on, ggml's default); the key lines go to the report
gpu_tests() {
    stage "GPU tests (TF32 on)"
    CODECD_TEST_GPU=1 timeout 150 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_gpu.py 2>&1 \
        | tee "$OUT/gpu_tests.txt" | grep -E "S3Gen|SNAC|passed|failed|Error|10k" | tee -a "$OUT/report.txt"
}
