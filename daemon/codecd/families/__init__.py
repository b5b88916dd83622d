"""Codec families: what the daemon knows about each kind of model, in one place per family."""

from __future__ import annotations

from .chatterbox import CHATTERBOX_IDS
from .layout import LEVELS, get_layout, layout_names, register_layouts
from .orpheus import ORPHEUS, ORPHEUS_IDS

__all__ = ["get_layout", "layout_names"]

register_layouts((ORPHEUS_IDS, ORPHEUS, LEVELS, CHATTERBOX_IDS))
