"""``codecd doctor``: what a bug report needs, in one printout.

Versions (codecd, the codecrt runtime, Python and the packages codecd uses), the
ggml devices this build registers and which one each device request resolves to,
PortAudio's host APIs and output devices (or why there are none), and the
configuration ``codecd serve`` would run with (secrets redacted). Each section
reports its own failure and the others still print: a doctor must not die of the
illness it is asked about.

The runtime has no call that lists ggml's backends, so the devices are probed: a
context is opened on a tiny random model for each device request; a refusal names
the devices the build has (``this build has: ...``, from ggml's device registry).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import platform
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["add_doctor", "report", "versions", "devices", "portaudio", "config_in_effect"]

logger = logging.getLogger(__name__)

#: device requests probed (``auto`` first: the one the daemon picks by default)
PROBES = ("auto", "cpu", "cuda", "metal", "vulkan")
#: the smallest SNAC the runtime accepts, for probing devices
_TINY: dict[str, Any] = {
    "sampling_rate": 24000, "latent_dim": 8, "decoder_dim": 16, "decoder_rates": [2, 2],
    "attn_window_size": 0, "codebook_size": 16, "codebook_dim": 2, "vq_strides": [4, 2, 1],
    "noise": False, "depthwise": True,
}
_PACKAGES = ("numpy", "cffi", "websockets", "soxr", "gguf", "prometheus-client", "sounddevice")


def versions() -> list[str]:
    from . import __version__

    lines = [f"codecd {__version__}", f"python {sys.version.split()[0]} ({sys.executable})",
             f"platform {platform.platform()} ({platform.machine()})"]
    try:
        import codecrt

        lines.append(f"codecrt {codecrt.version()} ({Path(codecrt.__file__).parent})")
    except ImportError as e:
        lines.append(f"codecrt: not importable ({e})")
    for pkg in _PACKAGES:
        try:
            lines.append(f"{pkg} {importlib.metadata.version(pkg)}")
        except importlib.metadata.PackageNotFoundError:
            lines.append(f"{pkg}: not installed")
    return lines


def devices() -> list[str]:
    """One line per device request: the device it resolves to, or the runtime's refusal."""
    try:
        import codecrt
    except ImportError as e:
        return [f"codecrt not importable: {e}"]
    from .convert.random_snac import write_random_snac

    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="codecd-doctor-") as tmp:
        path = write_random_snac(Path(tmp) / "tiny.gguf", _TINY, name="doctor_probe")
        with codecrt.Model(str(path)) as model:
            for req in PROBES:
                try:
                    with codecrt.Context(model, device=req, n_threads=1) as ctx:
                        st = ctx.stats
                        lines.append(f"{req:7s} -> {ctx.device} (backends: {', '.join(st.backends)})")
                except codecrt.CodecrtError as e:
                    lines.append(f"{req:7s} -> not available: {e}")
    return lines


def portaudio() -> list[str]:
    """PortAudio's version, host APIs and output devices, or what is missing."""
    from .playback import PlaybackError, check_output_device, import_sounddevice

    try:
        sd = import_sounddevice()
    except PlaybackError as e:
        return [str(e)]
    lines = [f"{sd.get_portaudio_version()[1]}"]
    for h in sd.query_hostapis():
        lines.append(f"host API {h['name']}: {len(h['devices'])} device(s)")
    for i, d in enumerate(sd.query_devices()):
        if d["max_output_channels"] > 0:
            lines.append(f"output {i}: {d['name']} ({d['max_output_channels']} ch, "
                         f"{d['default_samplerate']:.0f} Hz)")
    try:
        lines.append(f"default output: {check_output_device(None)}")
    except PlaybackError as e:
        lines.append(str(e))
    return lines


def config_in_effect(config: str | None = None) -> list[str]:
    from .config import ConfigError, format_config, load_config

    try:
        cfg = load_config(config)
    except ConfigError as e:
        try:
            cfg = load_config(config, validate=False)
        except ConfigError:
            return [f"invalid: {e}"]
        return [f"invalid, codecd serve would refuse it: {e}",
                *format_config(cfg).rstrip("\n").splitlines()]
    return format_config(cfg).rstrip("\n").splitlines()


def report(config: str | None = None) -> str:
    sections: list[tuple[str, Callable[[], list[str]]]] = [
        ("versions", versions),
        ("devices (ggml, probed)", devices),
        ("PortAudio (codecd play)", portaudio),
        ("config in effect (codecd serve; defaults < file < CODECD_* env)",
         lambda: config_in_effect(config)),
    ]
    out: list[str] = []
    for title, fn in sections:
        out.append(f"== {title}")
        try:
            out += [f"  {x}" for x in fn()]
        except Exception as e:  # noqa: BLE001 - report it, go on with the next section
            logger.debug("doctor section %s failed", title, exc_info=True)
            out.append(f"  failed: {type(e).__name__}: {e}")
    return "\n".join(out) + "\n"


def add_doctor(sub: Any) -> None:
    p = sub.add_parser("doctor", help="print versions, devices, PortAudio and the config in "
                                      "effect (for bug reports)")
    p.add_argument("--config", "-c", metavar="FILE", default=None,
                   help="TOML config file (env CODECD_CONFIG)")
    p.set_defaults(func=_cmd_doctor)


def _cmd_doctor(args: argparse.Namespace) -> int:
    sys.stdout.write(report(args.config))
    return 0
