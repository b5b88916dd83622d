"""Prompt-codes voices (codecd.families.voices): NeuTTS' reference codes as a NeuCodec voice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf")

from codecd.families.voices import (  # noqa: E402
    VoiceError,
    VoiceStore,
    load_voice_file,
    prompt_codes_voice,
    read_voice,
    write_voice,
)


def test_round_trip_and_store(tmp_path: Path) -> None:
    codes = np.array([0, 5, 65535, 7], dtype=np.int64)
    v = prompt_codes_voice("ella", codes, "neucodec", "test")
    p = write_voice(v, tmp_path / "ella.voice.gguf")
    back = read_voice(p)
    assert back.model_arch == "neucodec" and back.prompt_tokens.tolist() == codes.tolist()
    assert back.prompt_tokens.dtype == np.int32 and back.prompt_mel.shape == (0, 80)
    store = VoiceStore(tmp_path / "store")
    store.add("ella2", p)
    assert store.names() == ["ella2"] and store.load("ella2").prompt_tokens.tolist() == codes.tolist()


def test_neutts_reference_pt_is_a_neucodec_voice(tmp_path: Path) -> None:
    """NeuTTS' samples/*.pt hold torch.save(ref_codes): read as a NeuCodec prompt-codes voice."""
    torch = pytest.importorskip("torch")
    torch.save(torch.tensor([3, 1, 4, 1, 5], dtype=torch.int64), tmp_path / "dave.pt")
    v = load_voice_file(tmp_path / "dave.pt")
    assert (v.name, v.model_arch, v.prompt_tokens.tolist()) == ("dave", "neucodec", [3, 1, 4, 1, 5])


def test_bad_prompt_codes() -> None:
    with pytest.raises(VoiceError, match="outside"):
        prompt_codes_voice("x", [65536], "neucodec")
    with pytest.raises(VoiceError, match="outside"):
        prompt_codes_voice("x", [-1], "xcodec2")
    with pytest.raises(VoiceError, match="integers"):
        prompt_codes_voice("x", [1.5], "neucodec")
    with pytest.raises(VoiceError, match="prompt codes"):
        prompt_codes_voice("x", [], "neucodec")
    with pytest.raises(VoiceError, match="not 's3gen'"):
        prompt_codes_voice("x", [1], "s3gen")
