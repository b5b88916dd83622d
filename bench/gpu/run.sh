#!/usr/bin/env bash
# GPU run on the device machine (no package registry there): build codecd with
# CUDA from the carried ggml sdist, install the carried wheels it lacks, run the
# opt-in GPU tests and the GPU suites of `python -m bench`, and write a report
# under $OUT ($OUT/report.txt, plus one file per stage).
#
#   carry: .whl (cp312 wheels: cffi pycparser gguf snac soxr websockets, uvloop (the `fast`
#          extra: the fronts' loop, as shipped; without it they run on asyncio's), and the
#          PyTorch references' from bench/gpu/reference-wheels.sh), .ggml (the sdist). Fetch
#          the runtime ones where pip reaches PyPI: pip download --only-binary=:all: --no-deps
#          --python-version 3.12 --platform manylinux2014_x86_64 -d .whl PACKAGE==VERSION
#   bash bench/gpu/run.sh STAGE...     (default: all = build test bench)
# $CODECD_SITE [/tmp/codecd-site] and $CODECD_WHEELS [.whl] move the install and the wheels
# (a rehearsal of deps and the references stage off the device).
#
# Stages, in the order given; each suite's arguments come from an environment
# variable (its defaults in brackets):
#   build    CUDA build for sm_90 into /tmp/codecd-site ($OUT/build.log); $BUILD_CMAKE_EXTRA is
#            appended to CMAKE_ARGS (-DGGML_CUDA_FA=OFF shortens a short lease's build and changes
#            nothing that runs: ggml's flash attention is used only on the CPU, by S3Gen's
#            estimator where the CPU lacks AVX-512; on CUDA its attention is two products
#            around a softmax)
#   test     every opt-in GPU test, TF32 on then off (tests/native/test_gpu.py)
#   bench    python -m bench gpu $BENCH_ARGS          SNAC stream capacity [the suite's]
#   offline  python -m bench offline $OFFLINE_ARGS    offline SNAC, codecrt per layout against PyTorch,
#            TF32 on then off (issue 19) [--batches 1,16,256,1024 --item-seconds 2 --long-seconds 60]
#   offprof  python -m bench.gpu.profile_decode --kind snac-24khz --torch $OFFPROF_ARGS, TF32 off: the CUDA
#            kernels of one offline SNAC decode, codecrt then PyTorch on the same codes (issue 19's
#            1.5x) [--batch 256 --seconds 2 --repeat 3 --top 16]
#   profile  python -m bench profile $PROFILE_ARGS    CUDA kernels of one tick
#                                                     [--streams 256 --chunks 4 --ticks 5 --top 16]
#   serve    python -m bench serve --spawn demo $SERVE_ARGS, daemons on cuda:0 with
#            1,024-stream batches and 1,100 connections [--n 256,384,512 --seconds 3
#            --per-conn 8 --client-procs 4]; $SERVE_EXTRA is appended (e.g. --daemons 4)
#   fronts   python -m bench fronts --spawn demo $FRONTS_ARGS: ONE daemon on cuda:0 with F front
#            processes (issue 17) [--fronts 1,4,8 --n 256,512,768,1000,1200 --seconds 3
#            --per-conn 8 --client-procs 8]; $FRONTS_EXTRA is appended; the daemon's batch limit and
#            warmed buckets from $FRONTS_MAX_BATCH [1024] and $FRONTS_BUCKETS [64,256,1024], its stream and
#            connection limits from $FRONTS_LIMIT [1300]; the
#            runtime alone runs after the rows on the same device and the daemon/runtime ratio is printed
#   mimifronts  python -m bench fronts --spawn mimi --model mimi $MIMIFRONTS_ARGS: Mimi streams (8
#            codebooks, one 80 ms frame a message) through ONE daemon on cuda:0 (issue 20), batch
#            limit 1024, warmed buckets 64,256,1024, 1,300 streams and connections
#            [--fronts 4 --n 256,512,768,1000 --seconds 3 --per-conn 8 --client-procs 8
#            --server-cpus 0-7 --runtime-ticks 20]; the runtime alone (N streams, one frame each
#            per tick on one context) runs after the rows and the daemon/runtime ratio is printed
#   worker   python -m bench worker --spawn demo --device cuda:0 $WORKER_ARGS: the engine worker's
#            host work per stream per tick by phase against the runtime alone, one process
#            [--n 1000,2400 --ticks 20 --per-record 5 --fronts 6]
#   recovery python -m bench fronts --spawn demo --fronts 4 --n 8 --kill-worker 3 on cuda:0 with the
#            DEFAULT batch buckets: SIGKILL the worker 3 times, seconds to a new stream's audio
#            $RECOVERY_EXTRA is appended
#   s3bench  python -m bench s3gen --random --device cuda:0 --threads 16 $S3GEN_ARGS [--repeat 2]
#   s3ref    python -m bench s3gen --device cuda:0 --threads 16 --reference-device cuda:0 --precisions f32
#            $S3REF_ARGS: codecrt and the chatterbox-tts reference (tests/s3ref.py: seeded random
#            weights, converted to the GGUF codecrt runs), both on cuda:0, original and Turbo: offline
#            flow and HiFT wall time, x real time, the codecrt/reference speed ratio and mel/PCM rel L2
#            against the reference, into $OUT/s3gen_reference.md (issue 19) [--models orig,turbo
#            --seconds 10 --repeat 2]; the reference's wheels are carried in .whl
#            (bash bench/gpu/reference-wheels.sh, REFWHEELS_SET=s3gen for that set alone)
#   s3cap    python -m bench s3gen $S3CAP_ARGS: S3Gen real-time stream capacity, original and Turbo, N
#            FlowStreams stepped by step_flows, together and in 4 staggered phases, time to first audio,
#            after the offline rows (issue 19) [--random --device cuda:0 --threads 16 --no-reference
#            --precisions f32 --capacity 1,10,30,60,100,150 --models orig,turbo --max-row-s 30]
#   s3prof   python -m bench profile --codec s3gen-turbo, then s3gen-orig: the CUDA kernels of one S3Gen
#            tick (every stream's next 1 s chunk) against its wall and CPU time $S3PROF_ARGS
#            [--streams 10 --ticks 2 --top 16]
#   check    python -m bench check, TF32 off, with ggml's CUDA fusion on and off
#   sweep    python -m bench sweep $SWEEP_ARGS        every graph kind up to 300 s [the suite's]
#   mimi     Mimi GPU tests (TF32 on, off; MIMI_TESTS=0 skips them) and python -m bench mimi --device cuda:0 --no-moshi
#            $MIMI_ARGS [--streams 256,512,1000,1500 --seconds 3]
#   soak     python bench/soak.py --spawn demo on cuda:0 $SOAK_ARGS [--minutes 8 --kill-every 2
#            --report-every 30 --finishers 64 --slow 4] (issue 18's GPU run)
#   references  which PyTorch references (WavTokenizer, NeuCodec, XCodec2, DAC) build and decode
#            here: bench/gpu/reference_check.py, one OK / "no PyTorch reference (why)" line each;
#            their wheels are carried in .whl (bash bench/gpu/reference-wheels.sh, run where pip
#            reaches PyPI)
#   vocos    WavTokenizer/NeuCodec/XCodec2 and DAC GPU tests (TF32 on, off); the references stage;
#            codecrt beside the PyTorch references on cuda:0: python -m bench vocos (offline,
#            batches $VOCOS_BATCH [1,16,64]) and python -m bench windowed --torch (S streams with
#            batched windows, S in $VOCOS_STREAMS [16,64,256])
#   qwen3    Qwen3-TTS 12 Hz tokenizer GPU tests (TF32 on, off: tests/codecs/test_qwen3_gpu.py;
#            QWEN3_TESTS=0 skips them) and
#            python -m bench qwen3 --device cuda:0 $QWEN3_ARGS [--streams 1,64,256,512 --seconds 3]
#   convcheck  the DAC 24 kHz check that fails now and then with cr_conv1d's shifted products
#            (CODECRT_CONV=taps; docs/benchmarks.md): test_dac_gpu.py::test_cuda_matches_cpu[24khz],
#            TF32 off, $CONVCHECK_RUNS [3] times each with the products, with them and
#            GGML_CUDA_PDL=0 (no programmatic dependent launch) and with im2col, one line per run
#            (mode taps-nofusion: the products with GGML_CUDA_DISABLE_FUSION=1; taps-cublaslog: the
#            products with cuBLAS's call log and cuBLASLt's heuristics log, $OUT/cublas_N.log and
#            cublaslt_N.log, to see which product leaves SGEMM in a failing run; mode cols: the
#            columns op, CODECRT_CONV=cols); $CONVCHECK_TEST picks another check, for example
#            "tests/codecs/test_dac_gpu.py::test_long_decode_in_pieces_on_gpu[24khz]" (the columns
#            op's 7.1e-4 of 2026-12-08; a failing run prints each second's error and the span);
#            then once under compute-sanitizer --tool initcheck and once --tool racecheck with
#            the products, where the toolkit has it (errors only, into convcheck_TOOL.txt; each
#            run's whole output in convcheck_MODE_N.txt); $CONVCHECK_MODES [taps taps-nopdl im2col]
#            and $CONVCHECK_TOOLS [initcheck racecheck] pick (racecheck alone takes 6+ minutes:
#            CONVCHECK_MODES= CONVCHECK_TOOLS=racecheck; memcheck finds reads out of bounds), the
#            tools' conv $CONVCHECK_SANCONV [taps]; modes cols-sync (CUDA_LAUNCH_BLOCKING=1: no two
#            kernels at once, so no race between streams), cols-nographs (GGML_CUDA_DISABLE_GRAPHS=1:
#            no captured CUDA graph replayed) and cols-precise (CODECRT_PRECISE_SIN=1: sinf in the Snakes)
#   unitops  the residual unit's CUDA ops (native/src/cuda/cuda_ops.cu, opt-in: CODECRT_FUSED_UNIT=1;
#            docs/runtime.md): their GPU test, TF32 off (kernels against their CPU functions and the
#            composed ops, offline and streamed), then composed (0) against the ops (1), each side in
#            turn: SNAC stream capacity (python -m bench gpu --batches 1 --chunk 4 --streams
#            $UNITOPS_N [1000,1400,1800,2200] --ticks 20), one tick's kernels (python -m bench profile
#            --streams 256 --chunks 4), offline against PyTorch, TF32 off (python -m bench offline
#            --layouts time --batches $UNITOPS_BATCHES [1,16,256,1024] --long-seconds 60 --repeat 2);
#            $UNITOPS_PARTS [test capacity profile offline] picks the parts (a short lease runs them
#            in pieces)
#   inputs   graph inputs where ggml's scheduler puts them (CODECRT_GRAPH_INPUTS=host)
#            against the device's buffer (=device, the default; native/src/graph.c, cr_inputs_to_device): the
#            splits and launch of $INPUTS_N [1000] streams' ticks (GGML_SCHED_DEBUG=1 python -m
#            bench.gpu.splits), SNAC capacity at $INPUTS_STREAMS [1600,2000] streams each way,
#            then the GPU test file TF32 off with the inputs on the device
#   cadence  one daemon ($CADENCE_FRONTS [6] fronts (4 are too few past 2,000 streams: benchmarks.md, session 55), a list runs each, as fronts; --max-batch $CADENCE_MAX [3000], buckets 64,256,MAX,
#            stream and connection limits MAX + 100)
#            at $CADENCE_N [1300,1600] SNAC streams four ways (or five: gap, below),
#            each with its tick trace (CODECD_TICK_TRACE, all in $OUT/traces.tgz): the shipped
#            cadence (and the runtime alone), with --tick-slack-ms $CADENCE_SLACK [0] (the
#            shipped 5 ms is how long a tick waits past the period for streams whose codes are
#            late), with --first-audio now (a new stream's chunks ticked at once, as many as end
#            before the aligned tick, until its first audio), with --first-audio cadence (way
#            cadence, not by default: no express tick at all) and with ticks every half period
#            (--tick-align-ms 42.67: about half the streams a tick, half the wait for a first
#            audio); docs/benchmarks.md, one tick a period. Not by default, the way gap: now with
#            --first-audio-gap-ms $CADENCE_GAP [155] (the express tick waits until the gap after
#            its first audio fits), or gapMS for a bound of MS ms (gap140). $CADENCE_WAYS picks ways (default shipped slack now half; one
#            device call holds a build and four), $CADENCE_REPEAT [1] runs each N that many times;
#            streams of $CADENCE_SECONDS [3] s of audio that start within one period, or over
#            $CADENCE_RAMP seconds (arrivals at a busy daemon rather than one burst). Not by default,
#            the way catchup: --tick-catch-up 2 (codes that miss their round are stepped in a small
#            tick of their own once in, where the shipped default, 0, has them wait a period), and
#            the way ramp (or rampS): the shipped daemon with starts spread over 3 (or S) s, so that
#            one call measures both kinds of arrival (CADENCE_WAYS="shipped ramp")
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/codecd-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
SITE=${CODECD_SITE:-/tmp/codecd-site}
WHL=${CODECD_WHEELS:-.whl}
# serve: one socket per stream, several daemons
ulimit -n 65536 2>/dev/null || true
stage() { printf '\n=== %s (%s)\n' "$*" "$(date -u +%FT%TZ)" | tee -a "$OUT/report.txt"; }

# pip from the carried wheels only, into $SITE/deps
install_carried() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE/deps" "$@"
}

deps() {
    local w mod
    install_carried "$WHL"/*.whl
    # .whl/if-missing (torchaudio): only where the device's Python cannot import the module; the
    # device's own matches its torch
    for w in "$WHL"/if-missing/*.whl; do
        [ -e "$w" ] || continue
        mod=$(basename "$w"); mod=${mod%%-*}
        python3 -c "import $mod" 2>/dev/null && continue
        echo "deps: the device has no $mod: $(basename "$w") installed"
        install_carried "$w"
        # torchaudio's native libraries are built for one torch; without them it falls back to
        # pure Python, which covers what the references import (as .ci/install-references does)
        [ "$mod" = torchaudio ] && rm -f "$SITE/deps/torchaudio/lib/"*.so
    done
    return 0
}

build() {
    stage "build (CUDA, sm_90)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$OUT/report.txt"
    # pip --target keeps an earlier build's files and only warns: a second build on a warm
    # machine would otherwise run the first one's library
    rm -rf "$SITE/codecd"
    CMAKE_ARGS="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 ${BUILD_CMAKE_EXTRA:-}" \
    CODECD_GGML_SDIST="$PWD/.ggml/ggml_python-0.0.45.tar.gz" CODECD_CACHE_DIR=/tmp/codecd-cache \
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
        python3 -m pip install --no-build-isolation --no-deps --no-index --no-cache-dir \
        --target "$SITE/codecd" . > "$OUT/build.log" 2>&1
    local rc=$?
    tail -3 "$OUT/build.log" | tee -a "$OUT/report.txt"
    [ $rc = 0 ] || tail -40 "$OUT/build.log"
    return $rc
}

env_site() { export PYTHONPATH="$SITE/codecd:$SITE/deps${PYTHONPATH:+:$PYTHONPATH}"; }

tests() {
    # twice: as shipped (cuBLAS TF32 for F32 products) and with TF32 off (F32-exact)
    for tf32 in on off; do
        stage "GPU tests, TF32 $tf32: CODECD_TEST_GPU=1 pytest -m gpu tests/native/test_gpu.py"
        if [ $tf32 = off ]; then export NVIDIA_TF32_OVERRIDE=0; else unset NVIDIA_TF32_OVERRIDE; fi
        CODECD_TEST_GPU=1 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/native/test_gpu.py 2>&1 \
            | tee "$OUT/gpu_tests_tf32_$tf32.txt" \
            | grep -E "passed|failed|error|CUDA vs CPU|10k decodes|streamed vs|Error|S3Gen" \
            | tee -a "$OUT/report.txt"
    done
    unset NVIDIA_TF32_OVERRIDE
}

bench() {
    stage "capacity: python3 -m bench gpu ${BENCH_ARGS:-}"
    # shellcheck disable=SC2086
    python3 -m bench gpu ${BENCH_ARGS:-} 2>&1 | tee "$OUT/gpu_capacity.md" | tee -a "$OUT/report.txt"
}

offline() {
    # twice: TF32 on for both runtimes (ggml's default), then off for both
    for tf32 in on off; do
        stage "offline, TF32 $tf32: python3 -m bench offline ${OFFLINE_ARGS:-}"
        if [ $tf32 = off ]; then export NVIDIA_TF32_OVERRIDE=0; else unset NVIDIA_TF32_OVERRIDE; fi
        # shellcheck disable=SC2086
        python3 -m bench offline ${OFFLINE_ARGS:-} 2>&1 | tee "$OUT/offline_tf32_$tf32.md" | tee -a "$OUT/report.txt"
    done
    unset NVIDIA_TF32_OVERRIDE
}

offprof() {
    local args=${OFFPROF_ARGS:---batch 256 --seconds 2 --repeat 3 --top 16}
    stage "offline profile, TF32 off: python3 -m bench.gpu.profile_decode --kind snac-24khz --torch $args"
    # shellcheck disable=SC2086
    NVIDIA_TF32_OVERRIDE=0 python3 -m bench.gpu.profile_decode --kind snac-24khz --torch $args 2>&1 \
        | grep -v Warn | tee "$OUT/offprof.md" | tee -a "$OUT/report.txt"
}

profile() {
    local args=${PROFILE_ARGS:---streams 256 --chunks 4 --ticks 5 --top 16}
    stage "profile: python3 -m bench profile $args"
    # shellcheck disable=SC2086
    python3 -m bench profile $args 2>&1 | grep -v Warn | tee "$OUT/profile.md" | tee -a "$OUT/report.txt"
}

serve() {
    local args=${SERVE_ARGS:---n 256,384,512 --seconds 3 --per-conn 8 --client-procs 4}
    local daemon=(--serve-arg=--devices=cuda:0 --serve-arg=--max-batch=1024
                  --serve-arg=--batch-buckets=64,256,1024 --serve-arg=--max-streams=1100
                  --serve-arg=--max-connections=1100 --serve-arg=--max-connections-per-ip=1100)
    stage "daemon on loopback: python3 -m bench serve --spawn demo $args ${SERVE_EXTRA:-} ${daemon[*]}"
    # shellcheck disable=SC2086
    python3 -m bench serve --spawn demo $args ${SERVE_EXTRA:-} "${daemon[@]}" 2>&1 \
        | tee "$OUT/serve_load.md" | tee -a "$OUT/report.txt"
}

fronts() {
    local args=${FRONTS_ARGS:---fronts 1,4,8 --n 256,512,768,1000,1200 --seconds 3 --per-conn 8 --client-procs 8}
    local lim=${FRONTS_LIMIT:-1300}
    local daemon=(--serve-arg=--devices=cuda:0 --serve-arg=--max-batch=${FRONTS_MAX_BATCH:-1024}
                  --serve-arg=--batch-buckets=${FRONTS_BUCKETS:-64,256,1024} --serve-arg=--max-streams=$lim
                  --serve-arg=--max-connections=$lim --serve-arg=--max-connections-per-ip=$lim)
    stage "one daemon, F fronts: python3 -m bench fronts --spawn demo $args ${FRONTS_EXTRA:-} ${daemon[*]}"
    # shellcheck disable=SC2086
    python3 -m bench fronts --spawn demo $args ${FRONTS_EXTRA:-} "${daemon[@]}" 2>&1 \
        | tee "$OUT/fronts.md" | tee -a "$OUT/report.txt"
}

mimifronts() {
    local args=${MIMIFRONTS_ARGS:---fronts 4 --n 256,512,768,1000 --seconds 3 --per-conn 8 --client-procs 8 --server-cpus 0-7 --runtime-ticks 20}
    local daemon=(--serve-arg=--devices=cuda:0 --serve-arg=--max-batch=1024
                  --serve-arg=--batch-buckets=64,256,1024 --serve-arg=--max-streams=1300
                  --serve-arg=--max-connections=1300 --serve-arg=--max-connections-per-ip=1300)
    stage "Mimi through one daemon: python3 -m bench fronts --spawn mimi --model mimi $args ${daemon[*]}"
    # shellcheck disable=SC2086
    python3 -m bench fronts --spawn mimi --model mimi $args "${daemon[@]}" 2>&1 \
        | tee "$OUT/mimifronts.md" | tee -a "$OUT/report.txt"
}
worker() {
    local args=${WORKER_ARGS:---n 1000,2400 --ticks 20 --per-record 5 --fronts 6}
    stage "engine worker tick: python3 -m bench worker --spawn demo --device cuda:0 $args"
    # shellcheck disable=SC2086
    python3 -m bench worker --spawn demo --device cuda:0 $args 2>&1 \
        | tee "$OUT/worker.md" | tee -a "$OUT/report.txt"
}

recovery() {
    local daemon=(--serve-arg=--devices=cuda:0 --serve-arg=--max-connections-per-ip=1300)
    stage "worker recovery, default buckets: python3 -m bench fronts --spawn demo --fronts 4 --n 8 --seconds 2 --kill-worker 3 --runtime-ticks 0 ${RECOVERY_EXTRA:-} ${daemon[*]}"
    # shellcheck disable=SC2086
    python3 -m bench fronts --spawn demo --fronts 4 --n 8 --seconds 2 --kill-worker 3 \
        --runtime-ticks 0 ${RECOVERY_EXTRA:-} "${daemon[@]}" 2>&1 \
        | tee "$OUT/recovery.md" | tee -a "$OUT/report.txt"
}

s3bench() {
    local args=${S3GEN_ARGS:---repeat 2}
    stage "S3Gen: python3 -m bench s3gen --random --device cuda:0 --threads 16 $args"
    # shellcheck disable=SC2086
    python3 -m bench s3gen --random --device cuda:0 --threads 16 $args 2>&1 | tee "$OUT/s3gen_bench.md" \
        | tee -a "$OUT/report.txt"
}

s3ref() {
    local args=${S3REF_ARGS:---models orig,turbo --seconds 10 --repeat 2}
    local cmd="python3 -m bench s3gen --device cuda:0 --threads 16 --reference-device cuda:0 --precisions f32 $args"
    stage "S3Gen against the PyTorch reference on the GPU: $cmd"
    # shellcheck disable=SC2086
    $cmd 2>&1 | grep -v -E "it/s]|Inference\.\.\.$" | tee "$OUT/s3gen_reference.md" | tee -a "$OUT/report.txt"
}

s3cap() {
    local args=${S3CAP_ARGS:---random --device cuda:0 --threads 16 --no-reference --precisions f32 --capacity 1,10,30,60,100,150 --models orig,turbo --max-row-s 30}
    stage "S3Gen stream capacity: python3 -m bench s3gen $args"
    # shellcheck disable=SC2086
    python3 -m bench s3gen $args 2>&1 | tee "$OUT/s3gen_capacity.md" | tee -a "$OUT/report.txt"
}

check() {
    for fusion in 0 1; do
        stage "stream check, TF32 off, GGML_CUDA_DISABLE_FUSION=$fusion"
        NVIDIA_TF32_OVERRIDE=0 GGML_CUDA_DISABLE_FUSION=$fusion python3 -m bench check 2>&1 \
            | tee -a "$OUT/report.txt"
    done
}

vocos() {
    # WavTokenizer, NeuCodec, XCodec2, DAC 24/44 kHz: full-size random models (no torch needed), CUDA against the CPU
    for tf32 in on off; do
        stage "vocos GPU tests, TF32 $tf32: CODECD_TEST_GPU=1 pytest -m gpu tests/codecs/test_vocos_gpu.py tests/codecs/test_dac_gpu.py"
        if [ $tf32 = off ]; then export NVIDIA_TF32_OVERRIDE=0; else unset NVIDIA_TF32_OVERRIDE; fi
        CODECD_TEST_GPU=1 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/codecs/test_vocos_gpu.py \
            tests/codecs/test_dac_gpu.py 2>&1 \
            | tee "$OUT/vocos_gpu_tests_tf32_$tf32.txt" \
            | grep -E "passed|failed|error|CUDA vs CPU|on CUDA|Error" | tee -a "$OUT/report.txt"
    done
    unset NVIDIA_TF32_OVERRIDE
    # codecrt beside PyTorch in the same process: a reference that does not work here leaves
    # its rows codecrt-only, saying why
    references
    local batches=${VOCOS_BATCH:-1,16,64} streams=${VOCOS_STREAMS:-16,64,256}
    stage "vocos offline decode: python3 -m bench vocos --device cuda:0 --threads 16 --seconds 10 --batch $batches"
    python3 -m bench vocos --device cuda:0 --threads 16 --seconds 10 --batch "$batches" 2>&1 \
        | tee "$OUT/vocos_bench.md" | tee -a "$OUT/report.txt"
    for n in ${streams//,/ }; do
        stage "vocos windowed streams: python3 -m bench windowed --device cuda:0 --seconds 10 --streams $n --torch"
        python3 -m bench windowed --device cuda:0 --threads 16 --seconds 10 --streams "$n" --torch 2>&1 \
            | tee "$OUT/windowed_bench_$n.md" | grep -E "streams|^\| codec|^\|---|device" \
            | tee -a "$OUT/report.txt"
    done
}

references() {
    # into report.txt only: the vocos stage already leaves 8 files, as many as a device call returns
    stage "PyTorch references (tests/references): python3 bench/gpu/reference_check.py"
    python3 bench/gpu/reference_check.py 2>&1 | tee -a "$OUT/report.txt"
}

mimi() {
    # the released size with random weights (numpy only: no moshi or torch needed there);
    # MIMI_TESTS=0 skips the tests (a short device lease: the bench alone)
    [ "${MIMI_TESTS:-1}" = 0 ] || for tf32 in on off; do
        stage "Mimi GPU tests, TF32 $tf32: CODECD_TEST_GPU=1 pytest -m gpu tests/codecs/test_mimi_gpu.py"
        if [ $tf32 = off ]; then export NVIDIA_TF32_OVERRIDE=0; else unset NVIDIA_TF32_OVERRIDE; fi
        CODECD_TEST_GPU=1 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/codecs/test_mimi_gpu.py 2>&1 \
            | tee "$OUT/mimi_gpu_tests_tf32_$tf32.txt" \
            | grep -E "passed|failed|error|CUDA|Error" | tee -a "$OUT/report.txt"
    done
    unset NVIDIA_TF32_OVERRIDE
    local args=${MIMI_ARGS:---streams 256,512,1000,1500 --seconds 3}
    stage "Mimi capacity: python3 -m bench mimi --device cuda:0 --no-moshi $args"
    # shellcheck disable=SC2086
    python3 -m bench mimi --device cuda:0 --no-moshi $args 2>&1 | tee "$OUT/mimi_bench.md" \
        | tee -a "$OUT/report.txt"
}

soak() {
    local args=${SOAK_ARGS:---minutes 8 --kill-every 2 --report-every 30 --finishers 64 --slow 4}
    stage "soak: python3 bench/soak.py --spawn demo --serve-arg=--devices=cuda:0 --serve-arg=--max-connections-per-ip=256 $args"
    # shellcheck disable=SC2086
    # 256 connections per address: the default 32 would refuse most of the 71 client loops
    python3 bench/soak.py --spawn demo --serve-arg=--devices=cuda:0 --serve-arg=--max-connections-per-ip=256 \
        $args --log "$OUT/soak_server.log" 2>&1 \
        | tee "$OUT/soak.md" | tee -a "$OUT/report.txt"
}

qwen3() {
    # the released-size decoder with random weights (no torch needed), CUDA against the CPU;
    # QWEN3_TESTS=0 skips the tests
    [ "${QWEN3_TESTS:-1}" = 0 ] || for tf32 in on off; do
        stage "qwen3 GPU tests, TF32 $tf32: CODECD_TEST_GPU=1 pytest -m gpu tests/codecs/test_qwen3_gpu.py"
        if [ $tf32 = off ]; then export NVIDIA_TF32_OVERRIDE=0; else unset NVIDIA_TF32_OVERRIDE; fi
        CODECD_TEST_GPU=1 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/codecs/test_qwen3_gpu.py 2>&1 \
            | tee "$OUT/qwen3_gpu_tests_tf32_$tf32.txt" \
            | grep -E "passed|failed|error|CUDA vs CPU|on CUDA|Error" | tee -a "$OUT/report.txt"
    done
    unset NVIDIA_TF32_OVERRIDE
    local args=${QWEN3_ARGS:---streams 1,64,256,512 --seconds 3}
    stage "qwen3 streams: python3 -m bench qwen3 --device cuda:0 --threads 16 $args"
    # shellcheck disable=SC2086
    python3 -m bench qwen3 --device cuda:0 --threads 16 $args 2>&1 \
        | tee "$OUT/qwen3_bench.md" | tee -a "$OUT/report.txt"
}

unitops() {
    local f what parts=" ${UNITOPS_PARTS:-test capacity profile offline} "
    if [[ $parts == *" test "* ]]; then
        stage "unit ops: GPU test, TF32 off: pytest -m gpu tests/native/test_gpu.py -k unit_kernels"
        NVIDIA_TF32_OVERRIDE=0 CODECD_TEST_GPU=1 python3 -m pytest -q -s -p no:cacheprovider -m gpu \
            tests/native/test_gpu.py -k unit_kernels 2>&1 | tee "$OUT/unitops_test.txt" \
            | grep -E "unit ops|passed|failed|Error" | tee -a "$OUT/report.txt"
    fi
    for f in 0 1; do
        stage "unit ops, CODECRT_FUSED_UNIT=$f:$parts"
        for what in capacity profile offline; do
            [[ $parts == *" $what "* ]] && printf '\n## CODECRT_FUSED_UNIT=%s\n' "$f" >> "$OUT/unitops_$what.md"
        done
        [[ $parts == *" capacity "* ]] && CODECRT_FUSED_UNIT=$f python3 -m bench gpu --batches 1 --chunk 4 \
            --streams "${UNITOPS_N:-1000,1400,1800,2200}" --ticks 20 2>&1 | tee -a "$OUT/unitops_capacity.md"
        [[ $parts == *" profile "* ]] && CODECRT_FUSED_UNIT=$f python3 -m bench profile --streams 256 --chunks 4 \
            --ticks 5 --top 16 2>&1 | grep -v Warn | tee -a "$OUT/unitops_profile.md"
        [[ $parts == *" offline "* ]] && NVIDIA_TF32_OVERRIDE=0 CODECRT_FUSED_UNIT=$f python3 -m bench offline \
            --layouts time --batches "${UNITOPS_BATCHES:-1,16,256,1024}" --long-seconds 60 --repeat 2 2>&1 \
            | tee -a "$OUT/unitops_offline.md"
    done | tee -a "$OUT/report.txt"
}

inputs() {
    local w
    for w in host device; do
        stage "graph inputs, CODECRT_GRAPH_INPUTS=$w: splits and launch of ${INPUTS_N:-1000} streams' ticks"
        CODECRT_GRAPH_INPUTS=$w GGML_SCHED_DEBUG=1 python3 -m bench.gpu.splits --streams "${INPUTS_N:-1000}" \
            --ticks 5 > "$OUT/inputs_splits_$w.txt" 2>&1
        { grep -E '^tick' "$OUT/inputs_splits_$w.txt"; echo "split lines: $(grep -c 'SPLIT #' "$OUT/inputs_splits_$w.txt")"; } \
            | tee -a "$OUT/report.txt"
        stage "graph inputs, CODECRT_GRAPH_INPUTS=$w: capacity"
        CODECRT_GRAPH_INPUTS=$w python3 -m bench gpu --batches= --chunk 4 --streams "${INPUTS_STREAMS:-1600,2000}" \
            --ticks 20 2>&1 | tee -a "$OUT/inputs_capacity.md" | tee -a "$OUT/report.txt"
    done
    stage "graph inputs on the device: GPU tests, TF32 off"
    CODECRT_GRAPH_INPUTS=device NVIDIA_TF32_OVERRIDE=0 CODECD_TEST_GPU=1 python3 -m pytest -q -s -p no:cacheprovider \
        -m gpu tests/native/test_gpu.py 2>&1 | tee "$OUT/inputs_tests.txt" \
        | grep -E "passed|failed|Error|unit ops|CUDA vs CPU|S3Gen" | tee -a "$OUT/report.txt"
}

s3prof() {
    local m
    for m in s3gen-turbo s3gen-orig; do
        stage "S3Gen tick profile: python3 -m bench profile --codec $m ${S3PROF_ARGS:---streams 10 --ticks 2 --top 16}"
        # shellcheck disable=SC2086
        python3 -m bench profile --codec $m ${S3PROF_ARGS:---streams 10 --ticks 2 --top 16} 2>&1 \
            | grep -v -E "Warn|USDT|profiler" | tee -a "$OUT/s3prof.md" | tee -a "$OUT/report.txt"
    done
}

convcheck() {
    # CONVCHECK_TEST picks the check (the columns op's failure of 2026-12-08 was
    # test_long_decode_in_pieces_on_gpu[24khz]; mode cols runs it with CODECRT_CONV=cols)
    local t=${CONVCHECK_TEST:-"tests/codecs/test_dac_gpu.py::test_cuda_matches_cpu[24khz]"}
    local runs=${CONVCHECK_RUNS:-3} i vars
    export NVIDIA_TF32_OVERRIDE=0 CODECD_TEST_GPU=1
    for mode in ${CONVCHECK_MODES-taps taps-nopdl im2col}; do
        stage "convcheck: $t, $mode, $runs runs"
        for i in $(seq "$runs"); do
            # each run's whole output kept; the report gets its parity line, the failing
            # decode's per-sequence errors and the span of its wrong samples, and the verdict
            case $mode in
                taps-nopdl) vars=(GGML_CUDA_PDL=0 CODECRT_CONV=taps) ;;
                taps-nofusion) vars=(GGML_CUDA_DISABLE_FUSION=1 CODECRT_CONV=taps) ;;
                taps-cublaslog) vars=(CODECRT_CONV=taps CUBLAS_LOGINFO_DBG=1
                                      CUBLAS_LOGDEST_DBG="$OUT/cublas_$i.log" CUBLASLT_LOG_LEVEL=4
                                      CUBLASLT_LOG_FILE="$OUT/cublaslt_$i.log") ;;
                cols-sync) vars=(CODECRT_CONV=cols CUDA_LAUNCH_BLOCKING=1) ;;
                cols-nographs) vars=(CODECRT_CONV=cols GGML_CUDA_DISABLE_GRAPHS=1) ;;
                cols-precise) vars=(CODECRT_CONV=cols CODECRT_PRECISE_SIN=1) ;;
                *) vars=(CODECRT_CONV="${mode%%-*}") ;;
            esac
            env "${vars[@]}" python3 -m pytest -q -s -p no:cacheprovider -m gpu "$t" \
                > "$OUT/convcheck_${mode}_$i.txt" 2>&1
            grep -E "^DAC .*(relative L2|per sequence|wrong samples)|^E +[A-Za-z]*Error|[0-9]+ (passed|failed)" \
                "$OUT/convcheck_${mode}_$i.txt" | head -6 | tr '\n' ' ' | sed "s/^/$mode run $i: /" \
                | tee -a "$OUT/report.txt"
            echo | tee -a "$OUT/report.txt"
        done
    done
    local san
    san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    if [ -z "$san" ]; then
        echo "convcheck: no compute-sanitizer in this toolkit" | tee -a "$OUT/report.txt"
    else
        for tool in ${CONVCHECK_TOOLS-initcheck racecheck}; do
            stage "convcheck: $san --tool $tool, CODECRT_CONV=${CONVCHECK_SANCONV:-taps}"
            CODECRT_CONV=${CONVCHECK_SANCONV:-taps} "$san" --tool "$tool" --print-limit 20 python3 -m pytest -q -s \
                -p no:cacheprovider -m gpu "$t" > "$OUT/convcheck_$tool.txt" 2>&1
            grep -E "ERROR SUMMARY|^DAC .*relative L2|[0-9]+ (passed|failed)" "$OUT/convcheck_$tool.txt" \
                | tee -a "$OUT/report.txt"
        done
    fi
    unset NVIDIA_TF32_OVERRIDE CODECD_TEST_GPU
}

cadence() {
    local n=${CADENCE_N:-1300,1600} way extra rt g r fronts=${CADENCE_FRONTS:-6}
    # the batch limit above the loads tried (2,800 SNAC streams hold on an H100's runtime alone)
    local mb=${CADENCE_MAX:-3000}
    local daemon=(--serve-arg=--devices=cuda:0 --serve-arg=--max-batch=$mb
                  --serve-arg=--batch-buckets=64,256,$mb --serve-arg=--max-streams=$((mb + 100))
                  --serve-arg=--max-connections=$((mb + 100)) --serve-arg=--max-connections-per-ip=$((mb + 100)))
    local traces=/tmp/codecd-cadence-traces
    rm -rf "$traces" && mkdir -p "$traces"
    for way in ${CADENCE_WAYS:-shipped slack now half}; do
        r=${CADENCE_RAMP:-0}
        case $way in
            shipped) extra=(); rt=20 ;;
            slack) extra=(--serve-arg=--tick-slack-ms=${CADENCE_SLACK:-0}); rt=0 ;;
            now) extra=(--serve-arg=--first-audio=now); rt=0 ;;
            cadence) extra=(--serve-arg=--first-audio=cadence); rt=0 ;;
            gap|gap[0-9]*) g=${way#gap}; extra=(--serve-arg=--first-audio=now
                                       --serve-arg=--first-audio-gap-ms=${g:-${CADENCE_GAP:-155}}); rt=0 ;;
            half) extra=(--serve-arg=--tick-align-ms=42.67); rt=0 ;;
            catchup) extra=(--serve-arg=--tick-catch-up=2); rt=0 ;;
            ramp|ramp[0-9]*) g=${way#ramp}; r=${g:-3}; extra=(); rt=0 ;;
            *) echo "cadence: no way '$way' (shipped, slack, now, cadence, gap, gapMS, half, catchup, ramp, rampS)" | tee -a "$OUT/report.txt"
               continue ;;
        esac
        stage "cadence, $way: python3 -m bench fronts --spawn demo --fronts $fronts --n $n --ramp $r ${extra[*]:-}"
        CODECD_TICK_TRACE="$traces/trace-$way" python3 -m bench fronts --spawn demo --fronts "$fronts" \
            --n "$n" --repeat "${CADENCE_REPEAT:-1}" --seconds "${CADENCE_SECONDS:-3}" \
            --ramp "$r" --per-conn 8 --client-procs 8 \
            --server-cpus 0-7 --runtime-ticks $rt "${extra[@]}" "${daemon[@]}" 2>&1 \
            | tee "$OUT/cadence-$way.md" | tee -a "$OUT/report.txt"
    done
    tar czf "$OUT/traces.tgz" -C "$traces" .
}

sweep() {
    stage "shape sweep: python3 -m bench sweep ${SWEEP_ARGS:-}"
    # shellcheck disable=SC2086
    python3 -m bench sweep ${SWEEP_ARGS:-} 2>&1 | tee "$OUT/sweep.md" | tee -a "$OUT/report.txt"
}

deps
env_site
[ $# -eq 0 ] && set -- all
for what in "$@"; do
    case "$what" in
        build) build || exit 1 ;;
        test) tests ;;
        bench) bench ;;
        offline) offline ;;
        profile) profile ;;
        offprof) offprof ;;
        serve) serve ;;
        fronts) fronts ;;
        mimifronts) mimifronts ;;
        worker) worker ;;
        recovery) recovery ;;
        s3bench) s3bench ;;
        s3ref) s3ref ;;
        s3cap) s3cap ;;
        s3prof) s3prof ;;
        check) check ;;
        sweep) sweep ;;
        references) references ;;
        vocos) vocos ;;
        mimi) mimi ;;
        soak) soak ;;
        qwen3) qwen3 ;;
        convcheck) convcheck ;;
        unitops) unitops ;;
        inputs) inputs ;;
        cadence) cadence ;;
        all) build && tests; bench ;;
        *) echo "unknown stage $what" >&2; exit 2 ;;
    esac
done
python3 -c "import codecrt; print('codecrt', codecrt.version(), codecrt.__file__)" | tee -a "$OUT/report.txt"
# the fronts' event loop (uvloop when it imports, else asyncio's)
python3 -c "import uvloop; print('fronts on uvloop', uvloop.__version__, uvloop.__file__)" 2>/dev/null \
    | tee -a "$OUT/report.txt" || echo "fronts on asyncio's loop (no uvloop)" | tee -a "$OUT/report.txt"
