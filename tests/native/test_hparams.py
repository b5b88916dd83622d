"""Every integer hyperparameter of a small model of each family set to 0, to 3 and to the
largest value its type holds: the load refuses it with a ModelError, or the model loads and a
small decode returns audio or a typed error. Never a crash (the Mimi reader divided by a
compress of 0, and crashed in the first decode of a model with 0 semantic codebooks). Each family's
mutations run in one child process, which prints each before trying it, so a crash names it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import codecrt_or_skip

pytest.importorskip("gguf")
TESTS = Path(__file__).resolve().parents[1]

WRITERS = {
    "snac": "from smallmodel import write_small_snac as w; w(PATH)",
    "dac": "from codecd.convert.random_dac import write_random_dac as w; w('tiny', PATH)",
    "mimi": "from codecd.convert.random_mimi import write_random_mimi as w; w(PATH, config='tiny')",
    "qwen3": "from codecd.convert.random_qwen3 import write_random_qwen3 as w; w(PATH, config='tiny')",
    "wavtokenizer": ("from codecd.convert.random_vocos import write_random_vocos as w; "
                     "w('wavtokenizer-75', PATH, small=True)"),
    "neucodec": ("from codecd.convert.random_vocos import write_random_vocos as w; "
                 "w('neucodec', PATH, small=True)"),
    "xcodec2": ("from codecd.convert.random_vocos import write_random_vocos as w; "
                "w('xcodec2', PATH, small=True)"),
}

MUTATE = textwrap.dedent("""
    import shutil, sys
    import numpy as np, gguf, codecrt
    sys.path.insert(0, {tests!r})
    import reference
    PATH = {path!r}
    {writer}
    src = gguf.GGUFReader(PATH)
    muts = []  # (key, index of the value's part, value)
    for key, f in src.fields.items():
        if key.startswith("GGUF.") or key.startswith("general.") or not f.types:
            continue
        t = f.types[-1]
        if t == gguf.GGUFValueType.INT32:
            values = (0, 3, 2**31 - 1)
        elif t == gguf.GGUFValueType.UINT32:
            values = (0, 3, 2**32 - 1)
        else:
            continue
        parts = f.data if f.types[0] == gguf.GGUFValueType.ARRAY else f.data[:1]
        muts += [(key, di, v) for di in parts[:3] for v in values]
    del src
    work = PATH + ".mut.gguf"
    loaded = refused = 0
    for key, di, v in muts:
        print(key, di, v, flush=True)  # a crash leaves this line last
        shutil.copy(PATH, work)
        r = gguf.GGUFReader(work, "r+")
        r.fields[key].parts[di][0] = v
        del r
        try:
            with codecrt.Model(work) as m, codecrt.Context(m, device="cpu", n_threads=1,
                                                            max_frames=256) as c:
                info = m.info
                n = max(info.frame_multiple, max(info.level_strides)) * 2
                y = c.decode(reference.random_codes(info, n, None, np.random.default_rng(0)))
                assert y.dtype == np.float32, y.dtype
            loaded += 1
        except codecrt.CodecrtError:
            refused += 1
    print("done", len(muts), "mutations:", loaded, "decoded,", refused, "refused")
""")


@pytest.mark.parametrize("family", list(WRITERS))
def test_hyperparameter_mutations_never_crash(family: str, tmp_path: Path) -> None:
    codecrt_or_skip()
    script = MUTATE.format(tests=str(TESTS), path=str(tmp_path / f"{family}.gguf"),
                           writer=WRITERS[family])
    import os

    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    last = r.stdout.strip().splitlines()[-1:] or ["(nothing)"]
    assert r.returncode == 0, f"rc {r.returncode} at mutation {last[0]!r}: {r.stderr[-1500:]}"
    assert last[0].startswith("done"), last
    print(family, last[0])
