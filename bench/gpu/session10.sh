#!/usr/bin/env bash
# GPU call measuring the whole-row state read (b28cf11, re-landed): build as
# shipped (CUDA graphs off), the SNAC GPU tests, SNAC stream capacity around
# 1,000 streams, the tick profile, then one daemon with its worker's gather
# window at 2 ms (default) and 20 ms, to see how full its ticks are.
source "$(dirname "$0")/prelude.sh"
stage "SNAC GPU tests (TF32 on)"
CODECD_TEST_GPU=1 timeout 120 python3 -m pytest -q -s -p no:cacheprovider -m gpu -k "not s3gen" tests/test_gpu.py 2>&1 \
    | tee "$OUT/gpu_tests.txt" | grep -E "SNAC|passed|failed|Error|10k" | tee -a "$OUT/report.txt"
stage "capacity, 4-frame ticks"
timeout 120 python3 bench/gpu_capacity.py --batches "1" --chunk 4 --streams 960,1000,1024,1088,1152 --ticks 30 2>&1 \
    | tee -a "$OUT/capacity.md" | tee -a "$OUT/report.txt"
stage "profile"
timeout 60 python3 bench/gpu/profile_tick.py --streams 256 --chunks 4 --ticks 5 --top 16 2>&1 \
    | grep -v Warn | tee -a "$OUT/report.txt"
SERVE=(--serve-arg=--devices=cuda:0 --serve-arg=--max-batch=1024 --serve-arg=--batch-buckets=64,256,1024
       --serve-arg=--max-streams=1100 --serve-arg=--max-connections=1100 --serve-arg=--max-connections-per-ip=1100)
for g in 2 20; do
    stage "daemon on loopback, cuda:0, one daemon, gather ${g} ms, clients in 4 processes"
    timeout 90 python3 bench/serve_load.py --spawn demo --n 256,384,512 --seconds 3 --per-conn 8 --client-procs 4 \
        "${SERVE[@]}" --serve-arg=--gather-ms=$g 2>&1 | tee "$OUT/serve_load_g$g.md" | tee -a "$OUT/report.txt"
done
stage "done"
