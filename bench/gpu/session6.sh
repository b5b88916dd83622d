#!/usr/bin/env bash
# GPU call after the fusable-Snake graphs and CUDA graphs: build, every GPU
# test, the tick profile, SNAC stream capacity (4- and 16-frame ticks, CUDA
# graphs on and off), and capacity through the daemon on loopback.
source "$(dirname "$0")/prelude.sh"
gpu_tests
stage "capacity, 4-frame ticks"
timeout 100 python3 bench/gpu_capacity.py --batches "" --chunk 4 --streams 768,1024 --ticks 12 2>&1 \
    | tee -a "$OUT/capacity.md" | tee -a "$OUT/report.txt"
stage "profile"
timeout 60 python3 bench/gpu/profile_tick.py --streams 256 --chunks 4 --ticks 5 --top 14 2>&1 \
    | grep -v Warn | tee -a "$OUT/report.txt"
stage "capacity, 16-frame ticks"
timeout 100 python3 bench/gpu_capacity.py --batches "" --chunk 16 --streams 1024,1536 --ticks 8 2>&1 \
    | tee -a "$OUT/capacity.md" | tee -a "$OUT/report.txt"
stage "capacity, 4-frame ticks, GGML_CUDA_DISABLE_GRAPHS=1"
GGML_CUDA_DISABLE_GRAPHS=1 timeout 60 python3 bench/gpu_capacity.py --batches "" --chunk 4 --streams 768 --ticks 12 2>&1 \
    | grep -E "^\| 768" | tee -a "$OUT/report.txt"
stage "daemon on loopback, cuda:0"
timeout 170 python3 bench/serve_load.py --spawn demo --n 256,512,1024 --seconds 3 --per-conn 8 \
    --serve-arg=--devices=cuda:0 --serve-arg=--max-batch=1024 --serve-arg=--batch-buckets=64,256,1024 \
    --serve-arg=--max-streams=1100 --serve-arg=--max-connections=1100 --serve-arg=--max-connections-per-ip=1100 2>&1 \
    | tee "$OUT/serve_load.md" | tee -a "$OUT/report.txt"
stage "done"
