#!/usr/bin/env bash
# GPU call after the BF16 product mode and the fused relative-position
# attention (CPU kernels; the GPU graphs are meant to be unchanged): build as
# shipped, every GPU test (S3Gen ones compare CUDA with the CPU path, whose
# encoder attention changed; BF16 must be refused on CUDA), then S3Gen's
# throughput on the GPU (bf16 is skipped there: a CPU mode).
source "$(dirname "$0")/prelude.sh"
grep -o -m1 -E 'avx512f|avx2' /proc/cpuinfo | head -1 | sed 's/^/host CPU: /' | tee -a "$OUT/report.txt"
gpu_tests
stage "S3Gen on cuda:0, random weights, 10 s after a 3 s prompt"
timeout 300 python3 bench/s3gen.py --random --device cuda:0 --threads 16 --no-reference --repeat 3 2>&1 \
    | tee "$OUT/s3gen.txt" | tee -a "$OUT/report.txt"
stage "done"
