#!/usr/bin/env bash
# The wheels of the PyTorch references that `bash bench/gpu/run.sh vocos` times codecrt against
# (tests/references: outetts' vendored WavTokenizer, neucodec, xcodec2, dac), put in .whl for the
# device machine (Python 3.12, its own CUDA torch, no package index). Run from the repository root
# where pip reaches PyPI. run.sh's deps() installs every .whl/*.whl with --no-deps, and each wheel
# of .whl/if-missing only where the device cannot import that module.
#
# The pins are .ci/install-references' and the versions CI resolves, everything --no-deps (the
# device keeps its own torch): only the modules the four decoders import are added.
#  - outetts' vendored decoder (decoder/__init__ -> pretrained) imports yaml, huggingface_hub,
#    torchaudio and scipy; huggingface-hub 2.x imports httpx2 and its stack.
#  - neucodec / xcodec2: transformers, vector_quantize_pytorch (einx, frozendict), torchtune's RoPE
#    file, local_attention (hyper_connections, torch_einops_utils).
#  - dac: audiotools imports argbind, julius, flatten_dict, ffmpy, importlib_resources, randomname,
#    docstring_parser, rich, soundfile (cffi), scipy, torchaudio, and torch.utils.tensorboard
#    (tensorboard, absl, protobuf) at import time.
# Three packages publish only an sdist (argbind 0.3.9, randomname 0.2.1, xcodec2 0.1.5): each is
# pure Python, so its wheel is built here (py3-none-any, for any Python 3; needs this Python's
# setuptools and wheel). None of the set's Requires-Python excludes 3.12.
# Two modules are the device's own (its image holds both: /work/.library/device/KINDS.md):
#  - scipy (the references only `import scipy`): its wheel, 35 MB, does not fit the 64 MiB that a
#    device call carries, so it is not carried; where it is missing, the check says so.
#  - torchaudio, which must match the device's torch: the wheel in .whl/if-missing is installed
#    only where the device has none, and run.sh strips its native libraries (pure Python then,
#    which covers what the references import, as .ci/install-references does).
# The rest is carried even where the image has a version of its own (transformers, tensorboard,
# rich, ...): these are the versions CI checks the references with.
#
# REFWHEELS_PYTHON (3.12) and REFWHEELS_DEST (.whl) fetch the same pins for another Python into
# another folder (the set is rehearsed on Python 3.11 where no 3.12 torch is at hand).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYV=${REFWHEELS_PYTHON:-3.12}
DEST=${REFWHEELS_DEST:-.whl}
mkdir -p "$DEST/if-missing"
fetch() {
    local to=$1; shift
    # pip expands only the legacy manylinux names to older tags: the device's glibc is at
    # least 2.28 (its torch's wheel tag), so each newer name is listed
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d "$to" "$@"
}
fetch "$DEST" \
    "outetts==0.4.4" \
    "neucodec==0.0.6" "vector-quantize-pytorch==1.17.8" "einx==0.4.3" \
    "frozendict==2.5.1" "torchtune==0.6.1" "local-attention==1.11.2" \
    "hyper-connections==0.4.11" "torch-einops-utils==0.2.0" "einops==0.8.2" \
    "transformers==5.24.0" "huggingface-hub==2.4.0" "safetensors==0.8.0" "tokenizers==0.23.3" \
    "regex==2026.11.19" "tqdm==4.70.1" "pyyaml==6.0.4" "hf-xet==1.8.0" "packaging==26.4" \
    "httpx2==2.16.2" "httpcore2==2.16.2" "anyio==4.16.0" "truststore==0.10.5" "h11==0.16.0" \
    "idna==3.20" "click==8.5.1" "fsspec==2026.9.0" "filelock==4.3.2" "typing-extensions==4.16.0" \
    "descript-audio-codec==1.0.0" "descript-audiotools==0.7.2" "julius==0.2.8" \
    "flatten-dict==0.5.0" "ffmpy==1.0.0" "importlib-resources==7.1.0" "docstring-parser==0.18.0" \
    "tensorboard==2.21.0" "absl-py==2.5.1" "protobuf==7.36.2" \
    "rich==15.0.0" "markdown-it-py==4.3.0" "mdurl==0.1.2" "pygments==2.21.0" \
    "soundfile==0.14.0" "cffi==2.1.1" "pycparser==3.12"
# the sdist-only packages, built without build isolation (setuptools of this Python)
python3 -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" \
    "argbind==0.3.9" "randomname==0.2.1" "xcodec2==0.1.5"
for w in argbind-0.3.9 randomname-0.2.1 xcodec2-0.1.5; do
    compgen -G "$DEST/$w-*py3-none-any.whl" >/dev/null || { echo "$w: no py3-none-any wheel built" >&2; exit 1; }
done
fetch "$DEST/if-missing" "torchaudio==2.11.1"
ls "$DEST" "$DEST/if-missing"
