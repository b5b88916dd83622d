#!/usr/bin/env bash
# GPU call after the time-fastest residual stream and the one-GEMM products:
# build (CUDA graphs off, as shipped), every GPU test, the tick profile, SNAC
# stream capacity around 1,000 streams, and capacity through the daemon.
source "$(dirname "$0")/prelude.sh"
gpu_tests
stage "profile"
timeout 60 python3 bench/gpu/profile_tick.py --streams 256 --chunks 4 --ticks 5 --top 16 2>&1 \
    | grep -v Warn | tee -a "$OUT/report.txt"
stage "capacity, 4-frame ticks"
timeout 120 python3 bench/gpu_capacity.py --batches "1,1024" --chunk 4 --streams 768,1000,1024,1152 --ticks 20 2>&1 \
    | tee -a "$OUT/capacity.md" | tee -a "$OUT/report.txt"
stage "daemon on loopback, cuda:0"
timeout 150 python3 bench/serve_load.py --spawn demo --n 256,384,512 --seconds 3 --per-conn 8 \
    --serve-arg=--devices=cuda:0 --serve-arg=--max-batch=1024 --serve-arg=--batch-buckets=64,256,1024 \
    --serve-arg=--max-streams=1100 --serve-arg=--max-connections=1100 --serve-arg=--max-connections-per-ip=1100 2>&1 \
    | tee "$OUT/serve_load.md" | tee -a "$OUT/report.txt"
stage "S3Gen batched streams"
timeout 100 python3 bench/s3gen.py --random --device cuda:0 --threads 16 --no-reference --streams 4 2>&1 \
    | tee "$OUT/s3gen.md" | tee -a "$OUT/report.txt"
stage "done"
