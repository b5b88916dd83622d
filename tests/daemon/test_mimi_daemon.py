"""Mimi through the daemon: ``codecd serve`` (in-process Server, real websockets on 127.0.0.1)
streams the tiny Mimi model; each stream sends its own number of codebooks, fixed at ``start``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from conftest import codecrt_or_skip

pytest.importorskip("torch")
pytest.importorskip("moshi")
pytest.importorskip("websockets")
ref = pytest.importorskip("references.mimi")
from serverkit import levels_streams, offline_s16, running, s16_worst  # noqa: E402



@pytest.fixture(scope="module")
def mimi_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from codecd.convert import convert

    codecrt_or_skip()
    root = tmp_path_factory.mktemp("mimi_daemon")
    with ref.torch_threads(1):
        model = ref.build_reference(ref.MIMI_TINY, 21)
    ref.save_released_layout(model, root / "tiny", layout="transformers")
    return convert(root / "tiny", root / "tiny.gguf", progress=False)


@pytest.mark.slow
def test_twenty_streams_of_different_codebook_counts(mimi_gguf: Path) -> None:
    """20 concurrent streams (1 to 32 codebooks, 3 to 40 frames, JSON and binary frames in random
    pieces) come back as the offline decode of their codes, in s16."""
    import codecrt

    rng = np.random.default_rng(3)
    cases = []
    for i in range(20):
        k = int(rng.choice([1, 8, 32, int(rng.integers(1, 33))]))
        cases.append((f"s{i}", ref.random_codes(ref.MIMI_TINY, int(rng.integers(3, 41)), k, rng)))
    with codecrt.Model(str(mimi_gguf)) as m, codecrt.Context(m, device="cpu") as ctx:
        want = {sid: offline_s16(ctx, codes) for sid, codes in cases}

    async def main() -> dict[str, bytes]:
        async with running(mimi_gguf, max_batch=32) as srv:
            out, _ = await levels_streams(srv.port, cases, rng, bad_codebooks=33,
                                          bad_message="1 to 32")
            return out

    worst, differ = s16_worst(asyncio.run(main()), want)
    print(f"\nMimi via the daemon: 20 streams, {differ} s16 samples differ from offline, by at most {worst}")
    assert worst <= 1, worst
