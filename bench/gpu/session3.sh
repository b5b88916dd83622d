#!/usr/bin/env bash
# The 2026-12-02 third GPU session in one call: build, the S3Gen GPU tests
# (TF32 on and off), bench/s3gen.py on CUDA, SNAC capacity with 16-frame ticks.
set -uo pipefail
cd "$(dirname "$0")/../.."
bash bench/gpu/run.sh build || exit 1
export PYTHONPATH="/tmp/codecd-site/codecd:/tmp/codecd-site/deps${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/codecd-gpu-out}
for tf32 in on off; do
    echo "=== S3Gen GPU tests, TF32 $tf32" | tee -a "$OUT/report.txt"
    if [ $tf32 = off ]; then export NVIDIA_TF32_OVERRIDE=0; else unset NVIDIA_TF32_OVERRIDE; fi
    CODECD_TEST_GPU=1 timeout 200 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_gpu.py -k s3gen 2>&1 \
        | tee "$OUT/s3gen_gpu_tf32_$tf32.txt" | grep -E "S3Gen|passed|failed|Error" | tee -a "$OUT/report.txt"
done
unset NVIDIA_TF32_OVERRIDE
timeout 150 bash bench/gpu/run.sh s3bench
echo "=== capacity, 16-frame ticks" | tee -a "$OUT/report.txt"
timeout 120 python3 bench/gpu_capacity.py --batches "" --chunk 16 --streams 512,768,1024,1280 --ticks 8 2>&1 \
    | tee "$OUT/gpu_capacity_chunk16.md" | tee -a "$OUT/report.txt"
