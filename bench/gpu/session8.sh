#!/usr/bin/env bash
# GPU call after the copy-free state I/O: build (CUDA graphs off, as shipped),
# every GPU test, the tick profile, SNAC stream capacity around 1,000 streams,
# and capacity through the daemon: one daemon with the clients spread over
# four processes, then several daemons on the one GPU.
source "$(dirname "$0")/prelude.sh"
gpu_tests
stage "profile"
timeout 60 python3 bench/gpu/profile_tick.py --streams 256 --chunks 4 --ticks 5 --top 16 2>&1 \
    | grep -v Warn | tee -a "$OUT/report.txt"
stage "capacity, 4-frame ticks"
timeout 150 python3 bench/gpu_capacity.py --batches "1,16,256" --chunk 4 --streams 896,960,1000,1024,1152 --ticks 30 2>&1 \
    | tee -a "$OUT/capacity.md" | tee -a "$OUT/report.txt"
SERVE=(--serve-arg=--devices=cuda:0 --serve-arg=--max-batch=1024 --serve-arg=--batch-buckets=64,256,1024
       --serve-arg=--max-streams=1100 --serve-arg=--max-connections=1100 --serve-arg=--max-connections-per-ip=1100)
stage "daemon on loopback, cuda:0, one daemon, clients in 4 processes"
timeout 120 python3 bench/serve_load.py --spawn demo --n 256,384,512 --seconds 3 --per-conn 8 --client-procs 4 \
    "${SERVE[@]}" 2>&1 | tee "$OUT/serve_load_1.md" | tee -a "$OUT/report.txt"
stage "daemon on loopback, cuda:0, four daemons, clients in 4 processes"
timeout 150 python3 bench/serve_load.py --spawn demo --daemons 4 --n 512,768,1024 --seconds 3 --per-conn 8 \
    --client-procs 4 "${SERVE[@]}" 2>&1 | tee "$OUT/serve_load_4.md" | tee -a "$OUT/report.txt"
stage "done"
