"""The Chatterbox S3Gen reference (PyPI chatterbox-tts, CPU torch) with seeded random weights.

Parity tests build the upstream model, perturb every decode-path parameter
with seeded noise (so LayerNorm gains, biases and Snake alphas are not at
their init values of 1 and 0, where a wrong broadcast would go unnoticed),
export it through our converter and compare stage by stage. Skips cleanly
when the reference is not installed (it is a test extra, installed with
--no-deps: see .ci/run).
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

#: decode-path prefixes; the tokenizer and speaker encoder are not ported
DECODE_PREFIXES = ("flow.", "mel2wav.")


def import_reference() -> tuple[Any, Any]:
    torch = pytest.importorskip("torch")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from chatterbox.models.s3gen import S3Gen
    except Exception as e:  # ImportError, or a dependency failing at import
        pytest.skip(f"chatterbox-tts reference not importable: {type(e).__name__}: {e}")
    return torch, S3Gen


def reference(meanflow: bool = False, seed: int = 0) -> Any:
    """S3Gen(meanflow) in eval mode with seeded, perturbed decode-path parameters (built once
    per process: ``reference(False)``, ``reference(False, 0)`` and ``gguf(False)`` share it)."""
    return _reference(bool(meanflow), int(seed))


#: one key per model (lru_cache keys ``f(x)`` and ``f(x, 0)`` apart): the two models of
#: the tests (original and Turbo, seed 0) stay, about 4 s of CPU each to build again
@functools.lru_cache(maxsize=2)
def _reference(meanflow: bool, seed: int) -> Any:
    torch, S3Gen = import_reference()
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = S3Gen(meanflow=meanflow).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.startswith(DECODE_PREFIXES):
                continue
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("original0"):  # weight-norm gain: keep it positive
                p.mul_(1.0 + 0.1 * noise)
            elif p.dim() <= 1 or "pos_bias" in name:  # biases, norm gains, Snake alphas
                p.add_(0.1 * noise)
    return model


def state_dict(model: Any) -> dict[str, Any]:
    return {k: v for k, v in model.state_dict().items() if k.startswith(DECODE_PREFIXES)}


def gguf(meanflow: bool = False, dtype: str = "f32", seed: int = 0) -> Path:
    """The reference's weights converted by codecd's converter (cached per process)."""
    return _gguf(bool(meanflow), dtype, int(seed))


@functools.lru_cache(maxsize=4)
def _gguf(meanflow: bool, dtype: str, seed: int) -> Path:
    from codecd.convert.s3gen import convert_s3gen_state_dict

    root = Path(os.environ.get("CODECD_TEST_TMP", "/tmp")) / f"codecd-s3ref-{os.getpid()}"
    if not root.exists():
        root.mkdir(parents=True)
        atexit.register(shutil.rmtree, root, True)  # ~0.5 GB per model
    path = root / f"s3gen_{'turbo' if meanflow else 'orig'}_{dtype}_{seed}.gguf"
    if not path.exists():
        convert_s3gen_state_dict(state_dict(reference(meanflow, seed)), None, path, dtype)
    return path


def rel_l2(a: Any, b: Any) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


# ------------------------------------------------------------ shared noise

#: noise sites of native/src/s3gen.c
SITE_FLOW, SITE_PHASE, SITE_SINE = 1000, 2000, 2100
HARMONICS, MEL_HOP = 9, 480


def flow_noise(seed: int, n_frames: int) -> np.ndarray:
    """The flow's starting sample z [80, n_frames] (frames counted from the prompt's start)."""
    import codecrt

    return np.stack([codecrt.noise(seed, SITE_FLOW + c, 0, n_frames) for c in range(80)])


def source_noise(seed: int, n_samples: int, offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """SineGen's initial phases [9] (fundamental 0) and Gaussian noise [9, n_samples]."""
    import codecrt

    u = codecrt.noise(seed, SITE_PHASE, 0, HARMONICS, uniform=True)
    phases = (np.float32(2.0) * u - np.float32(1.0)) * np.float32(np.pi)
    phases[0] = 0.0
    noise = np.stack([codecrt.noise(seed, SITE_SINE + h, offset, n_samples) for h in range(HARMONICS)])
    return phases.astype(np.float32), noise


class patched_noise:
    """Within the block, the reference draws our noise instead of torch's.

    ``torch.randn_like`` on the flow's (1, 80, T) gives z[:, :T]; on SineGen's
    (1, 9, N) the sine noise; on SourceModule's unused (1, N, 1), zeros.
    ``torch.randn`` (Turbo's noised mels, (1, 80, 2n)) gives z's last 2n frames;
    ``Uniform.sample`` gives the harmonics' phases. Each on the device of the tensor it
    stands for (the reference may be moved to a GPU: bench/s3gen.py --reference-device).
    """

    def __init__(self, z: np.ndarray | None = None, phases: np.ndarray | None = None,
                 sine: np.ndarray | None = None):
        self.z, self.phases, self.sine = z, phases, sine

    def __enter__(self) -> patched_noise:
        torch, _ = import_reference()
        from torch.distributions.uniform import Uniform

        self._saved = (torch.randn_like, torch.randn, Uniform.sample)
        orig_like, orig_randn, _ = self._saved
        z, phases, sine = self.z, self.phases, self.sine

        def randn_like(t, *a, **k):
            shape = tuple(t.shape)
            if z is not None and len(shape) == 3 and shape[:2] == (1, 80):
                return torch.from_numpy(np.ascontiguousarray(z[:, : shape[2]]))[None].to(t.device, t.dtype)
            if sine is not None and len(shape) == 3 and shape[:2] == (1, HARMONICS):
                return torch.from_numpy(np.ascontiguousarray(sine[:, : shape[2]]))[None].to(t.device, t.dtype)
            if len(shape) == 3 and shape[0] == 1 and shape[2] == 1:
                return torch.zeros_like(t)
            return orig_like(t, *a, **k)

        def randn(*size, **k):
            shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)
            if z is not None and len(shape) == 3 and shape[:2] == (1, 80):
                out = torch.from_numpy(np.ascontiguousarray(z[:, -shape[2]:]))[None]
                return out if k.get("device") is None else out.to(k["device"])
            return orig_randn(*size, **k)

        def sample(self_, sample_shape=()):
            if phases is not None and tuple(sample_shape) == (1, HARMONICS, 1):
                return torch.from_numpy(phases.copy()).reshape(1, HARMONICS, 1)
            return self._saved[2](self_, sample_shape)

        torch.randn_like, torch.randn, Uniform.sample = randn_like, randn, sample
        return self

    def __exit__(self, *exc: object) -> None:
        torch, _ = import_reference()
        from torch.distributions.uniform import Uniform

        torch.randn_like, torch.randn, Uniform.sample = self._saved


def random_voice(seed: int, n_tokens: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return dict(prompt_tokens=rng.integers(0, 6561, n_tokens).astype(np.int32),
                prompt_mel=rng.normal(-4.0, 2.0, (2 * n_tokens, 80)).astype(np.float32),
                speaker=rng.normal(0.0, 1.0, 192).astype(np.float32))


def ref_dict(voice: dict[str, np.ndarray]) -> dict[str, Any]:
    """The voice as the reference's ref_dict (host tensors: S3Gen's forward moves them to its device)."""
    torch, _ = import_reference()
    n = voice["prompt_tokens"].size
    return dict(prompt_token=torch.from_numpy(voice["prompt_tokens"].astype(np.int64))[None],
                prompt_token_len=torch.tensor([n]),
                prompt_feat=torch.from_numpy(voice["prompt_mel"])[None],
                prompt_feat_len=None,
                embedding=torch.from_numpy(voice["speaker"])[None])


def ref_mel(model: Any, tokens: np.ndarray, voice: dict[str, np.ndarray], seed: int, n_steps: int,
            finalize: bool = True) -> np.ndarray:
    """The reference flow (S3Token2Wav.flow_inference) with our noise: mel [80, frames].

    Runs on the model's device (inputs moved there, the mel copied back to the host)."""
    torch, _ = import_reference()
    n_all = voice["prompt_tokens"].size + tokens.size
    z = flow_noise(seed, 2 * n_all)
    with patched_noise(z=z), torch.inference_mode():
        mel = model.flow_inference(torch.from_numpy(tokens.astype(np.int64))[None].to(model.device),
                                   ref_dict=ref_dict(voice), n_cfm_timesteps=n_steps, finalize=finalize)
    return mel[0].float().cpu().numpy()


def ref_wav(model: Any, mel: np.ndarray, seed: int) -> np.ndarray:
    """The reference vocoder (hift_inference, no fade) with our source noise: PCM [frames * 480].

    Runs on the model's device (the mel moved there, the PCM copied back to the host)."""
    torch, _ = import_reference()
    phases, sine = source_noise(seed, mel.shape[1] * MEL_HOP)
    with patched_noise(phases=phases, sine=sine), torch.inference_mode():
        wav, _ = model.hift_inference(torch.from_numpy(np.ascontiguousarray(mel))[None].to(model.device), None)
    return wav[0].float().cpu().numpy()


def fade_in(pcm: np.ndarray, model: Any) -> np.ndarray:
    out = pcm.copy()
    fade = model.trim_fade.cpu().numpy()
    out[: fade.size] *= fade
    return out


def voice(model, seed: int = 1, n: int = 8):
    """A random voice's arrays and the runtime Voice built from them on ``model``."""
    import codecrt

    data = random_voice(seed, n)
    return data, codecrt.Voice(model, **data)


def tokens(seed: int, n: int) -> np.ndarray:
    """n random S3 speech tokens (0..6560)."""
    return np.random.default_rng(seed).integers(0, 6561, n).astype(np.int32)
