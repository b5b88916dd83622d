"""Codec families: what the daemon knows about each kind of model, one module per family.

:data:`FAMILIES` is the one table: adding a codec adds its family module and one
entry here (see :mod:`codecd.families.base` for the interface and the checklist).
The daemon's layers look a model's family up by its architecture and ask it;
they never branch on a model kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import Family, LoadedModel, ModelSpec, StreamPlan, StreamRefused
from .layout import get_layout, layout_names, register_layouts
from .dac import DacFamily
from .mimi import MimiFamily
from .neucodec import NeuCodecFamily
from .qwen3 import Qwen3Family
from .s3gen import S3GenFamily
from .snac import SnacFamily
from .wavtokenizer import WavTokenizerFamily
from .xcodec2 import XCodec2Family

__all__ = [
    "FAMILIES", "Family", "LoadedModel", "ModelSpec", "StreamPlan", "StreamRefused",
    "UnknownFamilyError", "PrecisionError", "family_for", "find_family", "model_spec",
    "engine_options", "load_model", "get_layout", "layout_names",
]

#: every family codecd serves
FAMILIES: tuple[Family, ...] = (SnacFamily(), S3GenFamily(), DacFamily(), WavTokenizerFamily(),
                                NeuCodecFamily(), XCodec2Family(), MimiFamily(), Qwen3Family())


def _index(families: tuple[Family, ...]) -> dict[str, Family]:
    """architecture -> family, and every family's layouts registered by name."""
    by_arch: dict[str, Family] = {}
    for fam in families:
        register_layouts(fam.layouts)
        for arch in fam.architectures:
            if by_arch.setdefault(arch, fam) is not fam:
                raise ImportError(f"architecture {arch!r} is claimed by two families")
    return by_arch


_BY_ARCH = _index(FAMILIES)


class UnknownFamilyError(LookupError):
    """A model architecture no family claims."""


class _Generic(Family):
    """How the front treats a model spec of an architecture no family claims (a spec built
    by hand): the generic defaults, per-level codes only. Workers never load such models."""

    name = "generic"
    architectures = ()
    converter = ""

    def load(self, name: str, model: Any, config: Any, device: str) -> LoadedModel:
        raise UnknownFamilyError(f"no codec family serves model {name!r}")


_GENERIC = _Generic()


def find_family(arch: str) -> Family | None:
    """The family that claims ``arch``, or None."""
    return _BY_ARCH.get(arch)


def family_for(arch: str, *, generic: bool = False) -> Family:
    """The family that claims ``arch``; with ``generic``, the generic front-side defaults
    for an architecture no family claims, else UnknownFamilyError."""
    fam = _BY_ARCH.get(arch)
    if fam is not None:
        return fam
    if generic:
        return _GENERIC
    known = ", ".join(sorted(_BY_ARCH))
    raise UnknownFamilyError(f"no codec family serves architecture {arch!r} (families serve: "
                             f"{known})")


def model_spec(name: str, info: Mapping[str, Any]) -> ModelSpec:
    """The session's view of a model from a worker's model info, by its family."""
    return family_for(str(info.get("arch", "")), generic=True).model_spec(name, info)


def engine_options(config: Any) -> dict[str, dict[str, Any]]:
    """Every family's settings from the daemon's configuration, keyed by family name."""
    return {f.name: opts for f in FAMILIES if (opts := f.engine_options(config))}


class PrecisionError(ValueError):
    """A model asked for a precision of products that its family, the device or the CPU
    cannot give: the worker refuses to start rather than serve another precision."""


def load_model(name: str, model: Any, config: Any, device: str) -> LoadedModel:
    """In a worker: the ``codecrt.Model`` ``model`` served as ``name``, loaded by its family, its
    context in the precision the configuration asks of it (:meth:`Family.precision_of`).
    :class:`PrecisionError`, naming the model, the device and the reason, where its family
    has no such products, where the runtime refuses them (a GPU, a CPU without AVX512-BF16,
    ``CODECRT_PORTABLE_OPS``), or where the context made is of another precision."""
    import codecrt

    info = model.info
    fam = family_for(info.arch)
    want = fam.precision_of(name, config)
    where = f"model {name!r} ({info.arch}) on device {device}: precision {want}"
    if want not in fam.precisions:
        able = ", ".join(f.name for f in FAMILIES if want in f.precisions)
        raise PrecisionError(f"{where} refused: the {fam.name} family has no {want} products "
                             f"(they exist for {able} models)")
    try:
        lm = fam.load(name, model, config, device)
    except codecrt.UnsupportedError as e:
        if want == "f32":
            raise
        raise PrecisionError(f"{where} refused by the runtime: {e.message}") from None
    got = lm.ctx.precision
    if got != want:  # a family that forgot to pass it on: never another precision silently
        lm.close()
        raise PrecisionError(f"{where}: the {fam.name} family made a {got} context")
    return lm
