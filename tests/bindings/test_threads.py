"""One context shared by threads, as its docstring allows: a stream closed by one thread while
another passes it to a batch call (push_many, pull_many, a step) is a StateError ("the stream
is closed"), never a freed stream handed to the runtime (a crash, or a refusal that read freed
memory). Each race runs in a child process, so that a crash is a
failed test, not a dead worker."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import codecrt_or_skip

RACE = textwrap.dedent("""
    import sys, threading
    import numpy as np
    import codecrt
    sys.path.insert(0, {tests!r})
    from smallmodel import write_small_snac

    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    m = codecrt.Model(write_small_snac({path!r}))
    c = codecrt.Context(m, device="cpu", n_threads=1)
    out = np.empty(4096, np.float32)
    nl = np.array([3], np.uint32)
    ln = np.array([1, 2, 4], np.uint32)
    codes = np.zeros(7, np.int32)
    calls = {{
        "push_many": lambda s: codecrt.push_many([s], nl, ln, codes),
        "pull_many": lambda s: codecrt.pull_many([s], out),
        "step": lambda s: c.step([s]),
    }}
    call = calls[sys.argv[1]]
    cur = [c.stream()]
    stop = False
    refused = 0
    other = []

    def user():
        global refused
        while not stop:
            try:
                call(cur[0])
            except codecrt.StateError:  # "the stream is closed": the only right refusal
                refused += 1
            except codecrt.CodecrtError as e:  # e.g. a freed stream read as another's
                other.append(f"{{type(e).__name__}}: {{e}}")

    t = threading.Thread(target=user)
    t.start()
    for _ in range(20000):
        s = cur[0]
        cur[0] = c.stream()
        s.close()
    stop = True
    t.join()
    print("refused", refused, "other", len(other), *other[:3])
    sys.exit(1 if other else 0)
""")


@pytest.mark.parametrize("call", ["push_many", "pull_many", "step"])
def test_a_stream_closed_by_another_thread(call: str, tmp_path: Path) -> None:
    codecrt_or_skip()
    script = RACE.format(tests=str(Path(__file__).resolve().parents[1]),
                         path=str(tmp_path / "small.gguf"))
    r = subprocess.run([sys.executable, "-c", script, call], capture_output=True, text=True,
                       timeout=120, env={"OMP_NUM_THREADS": "1", **__import__("os").environ})
    assert r.returncode == 0, (r.returncode, r.stdout[-1000:], r.stderr[-2000:])
    assert r.stdout.startswith("refused"), r.stdout
