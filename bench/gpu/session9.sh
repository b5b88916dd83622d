#!/usr/bin/env bash
# Final GPU call of 2026-12-03 (states read as whole rows, written back
# without a copy): build as shipped, the SNAC GPU tests, the tick profile,
# SNAC stream capacity around 1,000 streams.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/codecd-gpu-out}
bash bench/gpu/run.sh build || { tail -40 "$OUT/build.log"; exit 1; }
export PYTHONPATH="/tmp/codecd-site/codecd:/tmp/codecd-site/deps${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
stage() { printf '\n=== %s (%s)\n' "$*" "$(date -u +%T)" | tee -a "$OUT/report.txt"; }
stage "capacity, 4-frame ticks"
timeout 100 python3 bench/gpu_capacity.py --batches "1" --chunk 4 --streams 960,1000,1024,1088 --ticks 20 2>&1 \
    | tee -a "$OUT/capacity.md" | tee -a "$OUT/report.txt"
stage "profile"
timeout 45 python3 bench/gpu/profile_tick.py --streams 256 --chunks 4 --ticks 5 --top 16 2>&1 \
    | grep -v Warn | tee -a "$OUT/report.txt"
stage "SNAC GPU tests (TF32 on)"
CODECD_TEST_GPU=1 timeout 90 python3 -m pytest -q -s -p no:cacheprovider -m gpu -k "not s3gen" tests/test_gpu.py 2>&1 \
    | tee "$OUT/gpu_tests.txt" | grep -E "SNAC|passed|failed|Error|10k" | tee -a "$OUT/report.txt"
stage "done"
