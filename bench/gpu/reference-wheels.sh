#!/usr/bin/env bash
# The wheels of the PyTorch references that `bash bench/gpu/run.sh vocos` times codecrt against
# (tests/references: outetts' vendored WavTokenizer, neucodec, xcodec2, dac), put in .whl for the
# device machine, which reaches no package index. Run from the repository root where pip reaches
# one. The pins and the module list are .ci/install-references' (every package --no-deps: the
# device keeps its own CUDA torch); einops and transformers' pure-Python stack are added for the
# modules those packages import. The vocos stage's first lines say which references import there.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform any -d .whl \
    "descript-audio-codec==1.0.0" "descript-audiotools==0.7.2" "argbind==0.3.9" \
    "julius==0.2.8" "flatten-dict==0.5.0" "ffmpy==1.0.0" "importlib-resources==7.1.0" \
    "randomname==0.2.1" "docstring-parser==0.18.0" "tensorboard==2.21.0" "absl-py==2.5.1" \
    "outetts==0.4.4" \
    "neucodec==0.0.6" "xcodec2==0.1.5" "vector-quantize-pytorch==1.17.8" "einx==0.4.3" \
    "frozendict==2.5.1" "torchtune==0.6.1" "local-attention==1.11.2" \
    "hyper-connections==0.4.11" "torch-einops-utils==0.2.0" einops \
    "transformers==5.24.0" huggingface-hub safetensors tokenizers regex tqdm pyyaml
ls .whl
