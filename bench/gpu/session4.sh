#!/usr/bin/env bash
# Follow-up GPU call: the S3Gen seed check with scheduler recreation between
# the two decodes, and SNAC capacity with 16-frame ticks.
set -uo pipefail
cd "$(dirname "$0")/../.."
bash bench/gpu/run.sh build || exit 1
export PYTHONPATH="/tmp/codecd-site/codecd:/tmp/codecd-site/deps${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/codecd-gpu-out}
CODECD_TEST_GPU=1 timeout 120 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_gpu.py -k seed_check_largest 2>&1 \
    | tee "$OUT/s3gen_seed_check.txt" | grep -E "S3Gen|passed|failed|Error" | tee -a "$OUT/report.txt"
timeout 150 python3 bench/gpu_capacity.py --batches 1 --item-seconds 0.5 --chunk 16 --streams 512,768,1024,1280 --ticks 8 2>&1 \
    | tee "$OUT/gpu_capacity_chunk16.md" | tee -a "$OUT/report.txt"
