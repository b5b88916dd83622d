#!/usr/bin/env bash
# The wheels of the PyTorch references that `bash bench/gpu/run.sh vocos` times codecrt against
# (tests/references: outetts' vendored WavTokenizer, neucodec, xcodec2, dac), put in .whl for the
# device machine, which reaches no package index. Run from the repository root where pip reaches
# one. The pins and the module list are .ci/install-references' (every package --no-deps: the
# device keeps its own CUDA torch); einops and transformers' pure-Python stack are added for the
# modules those packages import. The vocos stage's first lines say which references import there.
# DAC's reference is not carried: descript-audiotools needs argbind, which PyPI has as an sdist only
# (no wheel to carry; the device cannot build one), so the DAC rows there are codecrt's alone.
# huggingface-hub 2.x imports httpx2 and its stack (the 2026-12-04 device run lacked them: no
# WavTokenizer/NeuCodec reference there).
# xcodec2 0.1.5 publishes nothing installable on Python 3.12 (the device's), so XCodec2 rows are too.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform any -d .whl \
    "outetts==0.4.4" \
    "neucodec==0.0.6" "vector-quantize-pytorch==1.17.8" "einx==0.4.3" \
    "frozendict==2.5.1" "torchtune==0.6.1" "local-attention==1.11.2" \
    "hyper-connections==0.4.11" "torch-einops-utils==0.2.0" einops \
    "transformers==5.24.0" "huggingface-hub==2.4.0" safetensors tokenizers regex tqdm pyyaml \
    "httpx2==2.16.2" "httpcore2==2.16.2" "anyio==4.16.0" "truststore==0.10.5" "h11==0.16.0" idna \
    click fsspec filelock hf-xet typing-extensions packaging
ls .whl
