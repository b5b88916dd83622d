#!/usr/bin/env bash
# GPU call after the fused AVX-512 CPU kernels: build as shipped, every GPU
# test (the S3Gen ones compare CUDA with the CPU path, whose kernels changed),
# then capacity through several daemons on the one GPU with the graphs that
# reached 1,000 streams for the runtime alone (session10).
source "$(dirname "$0")/prelude.sh"
grep -o -m1 -E 'avx512f|avx2' /proc/cpuinfo | head -1 | sed 's/^/host CPU: /' | tee -a "$OUT/report.txt"
gpu_tests
SERVE=(--serve-arg=--devices=cuda:0 --serve-arg=--max-batch=1024 --serve-arg=--batch-buckets=64,256,1024
       --serve-arg=--max-streams=1100 --serve-arg=--max-connections=1100 --serve-arg=--max-connections-per-ip=1100)
for d in 3 4; do
    stage "daemon on loopback, cuda:0, $d daemons, clients in 4 processes"
    timeout 130 python3 bench/serve_load.py --spawn demo --daemons $d --n 768,1000,1152 --seconds 3 --per-conn 8 \
        --client-procs 4 "${SERVE[@]}" 2>&1 | tee "$OUT/serve_load_d$d.md" | tee -a "$OUT/report.txt"
done
stage "done"
