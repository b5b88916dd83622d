#!/usr/bin/env bash
# The wheels of the PyTorch references that `bash bench/gpu/run.sh vocos` times codecrt against
# (tests/references: outetts' vendored WavTokenizer, neucodec, xcodec2, dac), and those of the
# Chatterbox S3Gen reference that `bash bench/gpu/run.sh s3ref` times it against (tests/s3ref.py:
# chatterbox-tts), put in .whl for the device machine (Python 3.12, its own CUDA torch, no package
# index). Run from the repository root where pip reaches PyPI. run.sh's deps() installs every
# .whl/*.whl with --no-deps, and each wheel of .whl/if-missing only where the device cannot import
# that module.
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
# The S3Gen set (`import chatterbox.models.s3gen`, which runs chatterbox/__init__: tts, vc and
# mtl_tts, so t3, perth and librosa too), the pins of .ci/install-references, only what the device
# image lacks (/work/.library/device/KINDS.md: it has torch and torchaudio 2.11, numpy, scipy, numba,
# llvmlite, joblib, msgpack, lazy-loader, scikit-learn, onnx, pillow, einops, regex, safetensors,
# requests, transformers, huggingface-hub, pyyaml, tqdm, sentencepiece, attrs): chatterbox-tts,
# s3tokenizer, conformer, diffusers, omegaconf (2.4 needs no antlr4), librosa and what
# librosa.filters imports that the image lacks (decorator; pooch, platformdirs), and resemble-perth,
# which chatterbox.tts imports. All pure Python. resemble-perth's wheel is 34 MB, nearly all of it
# the watermarker's checkpoint (perth/perth_net/pretrained), read only when a watermarker is built,
# never on import: it is repacked without that folder as resemble_perth-1.0.1+noweights (3.3 MB for
# the set). librosa's audio I/O (soundfile, audioread) is loaded lazily and not used; transformers
# imports soxr once librosa is there, which is codecd's own dependency, in .whl's base wheels.
#
# REFWHEELS_SET picks the set: vocos (the four decoders', 36 MB), s3gen (3.3 MB) or all (the
# default); each also puts torchaudio (1.8 MB) in .whl/if-missing.
# REFWHEELS_PYTHON (3.12) and REFWHEELS_DEST (.whl) fetch the same pins for another Python into
# another folder (the set is rehearsed on Python 3.11 where no 3.12 torch is at hand).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYV=${REFWHEELS_PYTHON:-3.12}
DEST=${REFWHEELS_DEST:-.whl}
SET=${REFWHEELS_SET:-all}
case "$SET" in vocos|s3gen|all) ;; *) echo "REFWHEELS_SET: vocos, s3gen or all, not $SET" >&2; exit 2 ;; esac
mkdir -p "$DEST/if-missing"
fetch() {
    local to=$1; shift
    # pip expands only the legacy manylinux names to older tags: the device's glibc is at
    # least 2.28 (its torch's wheel tag), so each newer name is listed
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d "$to" "$@"
}
vocos_set() {
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
}
s3gen_set() {
    fetch "$DEST" \
        "chatterbox-tts==0.1.7" "s3tokenizer==0.3.0" "conformer==0.3.2" "diffusers==0.29.0" \
        "omegaconf==2.4.0" "librosa==0.11.0" "decorator==5.3.2" "pooch==1.9.0" "platformdirs==4.14.9"
    local tmp
    tmp=$(mktemp -d)
    fetch "$tmp" "resemble-perth==1.0.1"
    # the same wheel less perth/perth_net/pretrained/, as version 1.0.1+noweights (its dist-info
    # renamed, METADATA's version and RECORD rewritten to match)
    python3 - "$tmp"/resemble_perth-1.0.1-py3-none-any.whl "$DEST" <<'PY'
import base64, hashlib, sys, zipfile
src, dest = sys.argv[1], sys.argv[2]
old, new = "resemble_perth-1.0.1", "resemble_perth-1.0.1+noweights"
out = f"{dest}/{new}-py3-none-any.whl"
def digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
    record = []
    for info in zin.infolist():
        name = info.filename
        if name.startswith("perth/perth_net/pretrained/") or name == f"{old}.dist-info/RECORD":
            continue
        data = zin.read(name)
        name = name.replace(f"{old}.dist-info/", f"{new}.dist-info/")
        if name == f"{new}.dist-info/METADATA":
            data = data.replace(b"\nVersion: 1.0.1\n", b"\nVersion: 1.0.1+noweights\n", 1)
            assert b"Version: 1.0.1+noweights" in data
        zout.writestr(name, data)
        record.append(f"{name},{digest(data)},{len(data)}")
    record.append(f"{new}.dist-info/RECORD,,")
    zout.writestr(f"{new}.dist-info/RECORD", "\n".join(record) + "\n")
PY
    rm -rf "$tmp"
}
case "$SET" in
    vocos) vocos_set ;;
    s3gen) s3gen_set ;;
    all) vocos_set; s3gen_set ;;
esac
fetch "$DEST/if-missing" "torchaudio==2.11.1"
ls "$DEST" "$DEST/if-missing"
du -sh "$DEST"
