#!/usr/bin/env bash
# GPU call: build, where a streaming tick's time goes (kernel profile), the
# S3Gen GPU tests (seed check with every kind recreated), the SNAC GPU tests.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/codecd-gpu-out}
bash bench/gpu/run.sh build || { tail -40 "$OUT/build.log"; exit 1; }
export PYTHONPATH="/tmp/codecd-site/codecd:/tmp/codecd-site/deps${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
echo "=== profile (TF32 on)" | tee -a "$OUT/report.txt"
timeout 150 python3 bench/gpu/profile_tick.py --streams 256 --chunks 4,16 --ticks 5 2>&1 \
    | tee "$OUT/profile.md" | tee -a "$OUT/report.txt"
echo "=== GPU tests (TF32 on)" | tee -a "$OUT/report.txt"
CODECD_TEST_GPU=1 timeout 200 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_gpu.py 2>&1 \
    | tee "$OUT/gpu_tests.txt" | grep -E "S3Gen|SNAC|passed|failed|Error|10k" | tee -a "$OUT/report.txt"
