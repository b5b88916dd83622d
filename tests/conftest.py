"""Shared fixtures: import paths, the Orpheus layouts module, converted random SNAC models,
the small model of the daemon tests (``codecrt``, ``small``, ``offline``)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
# the source tree's pure-Python packages first; the bindings last, so that an
# installed codecrt (with its built _native module) wins over the source copy
for sub in ("tests", "daemon"):
    if str(ROOT / sub) not in sys.path:
        sys.path.insert(0, str(ROOT / sub))
if str(ROOT / "bindings") not in sys.path:
    sys.path.append(str(ROOT / "bindings"))

import reference  # noqa: E402
from smallmodel import write_small_snac as _write_small_snac  # noqa: E402

try:  # property tests judge inputs, not speed: a loaded CI box must not fail them on time
    from hypothesis import HealthCheck, settings

    settings.register_profile("codecd", deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("codecd")
except ImportError:  # the test extra brings hypothesis; a partial environment skips its tests
    pass


def pytest_collection_modifyitems(config, items):
    """GPU tests are opt-in: they run only with CODECD_TEST_GPU=1 (on the device machine)."""
    import os

    if os.environ.get("CODECD_TEST_GPU") == "1":
        return
    skip = pytest.mark.skip(reason="GPU tests are opt-in: set CODECD_TEST_GPU=1")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


#: the S3Gen codec tests: they share s3ref's per-process reference models and converted
#: files (about 13 s and 0.5 GB each), so one xdist worker runs them all
S3REF_MODULES = "tests/codecs/test_s3gen"

#: the longest work units: seconds of wall time, each run alone on this 2-vCPU machine
#: (``pytest --durations``, 2026-12-04, the machine shared: load 1 to 4). The scheduler hands
#: them out longest first, then the rest in xdist's order, so that the run ends on short
#: modules on both workers, not on one long module while the other worker idles. Order only:
#: a stale figure costs balance, never a test.
LONGEST = {
    "s3ref": 310,
    "tests/codecs/test_qwen3.py": 98,
    "tests/native/test_long_decode.py": 87,
    "tests/native/test_stream.py": 77,
    "tests/codecs/test_mimi.py": 45,
    "tests/native/test_parity.py": 41,
    "tests/codecs/test_neucodec.py": 31,
    "tests/daemon/test_mimi_daemon.py": 27,
    "tests/daemon/test_hostile.py": 27,
    "tests/codecs/test_dac.py": 25,
    "tests/native/test_lifecycle.py": 25,
    "tests/daemon/test_speech.py": 25,
    "tests/families/test_convert.py": 25,
    "tests/daemon/test_server.py": 24,
    "tests/daemon/test_browser.py": 24,
    "tests/daemon/test_playback.py": 21,
    "tests/daemon/test_fronts.py": 19,
    "tests/daemon/test_qwen3_daemon.py": 18,
    "tests/native/test_lowlatency.py": 17,
    "tests/codecs/test_windowed.py": 15,
    "tests/codecs/test_wavtokenizer.py": 15,
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``-n 2 --dist loadfile`` (pytest-xdist, as .ci/run runs it): a worker runs each module
    whole, so that it builds the module's module-scoped models once, and the S3Gen modules
    (S3REF_MODULES) all on one worker; the units of LONGEST go out first, longest first, the
    others after them in xdist's order (most tests first). (xdist's ``loadgroup`` cannot group
    under pytest 9: its group suffix is written to ``item._nodeid``, which pytest 9 no longer
    reads.)"""
    if config.getoption("dist") != "loadfile":
        return None
    from collections import OrderedDict

    from xdist.scheduler import LoadFileScheduling

    def rank(scope: str) -> float:
        return -LONGEST.get(scope, 0)

    class ModuleScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "s3ref" if module.startswith(S3REF_MODULES) else module

        def _assign_work_unit(self, node) -> None:
            # xdist fills its queue in schedule() and then assigns from its front: reorder it
            # (stable: the rest keep xdist's order) before the first unit leaves
            if not getattr(self, "_longest_first", False):
                self.workqueue = OrderedDict(sorted(self.workqueue.items(), key=lambda kv: rank(kv[0])))
                self._longest_first = True
            super()._assign_work_unit(node)

    return ModuleScheduling(config, log)


def load_layouts():
    """The Orpheus layout functions and the layout errors (``codecd.families.orpheus``; pure
    numpy, importable without the native module)."""
    return importlib.import_module("codecd.families.orpheus")


@pytest.fixture(scope="session")
def layouts():
    return load_layouts()


def codecrt_or_skip():
    """The codecrt bindings with a real runtime, or skip (not importable, or a stub build)."""
    try:
        codecrt = importlib.import_module("codecrt")
    except ImportError as e:
        pytest.skip(f"codecrt native module not importable: {e}")
    if "stub" in codecrt.version():
        pytest.skip(f"codecrt is a stub build ({codecrt.version()})")
    return codecrt


def _cpu_flags() -> list[str]:
    """This CPU's flags (/proc/cpuinfo), or none off x86-64 or where they cannot be read."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        return []
    try:
        return next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return []


def fused_cpu_products() -> bool:
    """Whether the runtime's CPU contexts compute their products in the fused kernels, whose
    summation order is the same at any row count, so that a stream's samples equal the offline
    decode's bit for bit: an x86-64 CPU with AVX-512 (native/src/ops/ops_avx512_*.c) or with
    AVX2 and FMA (ops_avx2_products.c, the same sums), CODECRT_PORTABLE_OPS unset. Elsewhere
    ggml's products take them, whose order follows the shapes; measured on an AVX2 EPYC
    (2026-12-07) before the AVX2 products: the small random SNAC's streamed samples up to
    7.6e-5 from the offline ones (its random weights amplify rounding), the full-size demo
    SNAC's s16 one LSB apart at 3 % of its samples, DAC's 4.5e-8 apart."""
    import os

    if os.environ.get("CODECRT_PORTABLE_OPS", "0") not in ("", "0"):
        return False
    flags = _cpu_flags()
    return "avx512f" in flags or ("avx2" in flags and "fma" in flags)


def assert_stream_equals_offline(got: np.ndarray, want: np.ndarray, what: Any = "") -> None:
    """A stream's samples against the offline decode's: bit-identical where the fused CPU
    products run (:func:`fused_cpu_products`), else to f32 rounding as the random models
    amplify it: float samples within 5e-4 (serverkit.assert_same_audio's bound), int16 within
    one LSB."""
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, what)
    if fused_cpu_products():
        assert np.array_equal(got, want), what
    elif got.dtype == np.int16:
        d = int(np.abs(got.astype(np.int32) - want).max()) if got.size else 0
        assert d <= 1, (d, what)
    else:
        err = float(np.abs(got.astype(np.float64) - want).max()) if got.size else 0.0
        assert err < 5e-4, (err, what)


def cpu_has_bf16() -> bool:
    """Whether this CPU has the AVX-512 BF16 instructions the runtime's BF16 kernels use."""
    flags = _cpu_flags()
    return all(f in flags for f in ("avx512f", "avx512bw", "avx512vl", "avx512_bf16"))


def bf16_or_skip(codecrt, gguf) -> None:
    """Skip unless a CPU context of the model at ``gguf`` takes precision="bf16" (AVX512-BF16 CPUs,
    the fused kernels on: not CODECRT_PORTABLE_OPS)."""
    with codecrt.Model(str(gguf)) as m:
        try:
            codecrt.Context(m, device="cpu", precision="bf16").close()
        except codecrt.CodecrtError as e:
            pytest.skip(f"precision bf16 unavailable: {e}")


SEEDS = {"24khz": 11, "32khz": 22, "44khz": 33, "tiny": 44}


class SnacCase:
    """A random reference model of one config, saved in the released layout and converted (f32)."""

    def __init__(self, name: str, root: Path):
        from codecd.convert import convert

        self.name = name
        self.config = dict(reference.CONFIGS[name])
        self.seed = SEEDS[name]
        self.model = reference.build_reference_snac(self.config, self.seed)
        self.folder = reference.save_released_layout(self.model, self.config, root / f"snac_{name}")
        self.gguf = convert(self.folder, root / f"snac_{name}.gguf", progress=False)
        self._read = None

    @property
    def read(self):
        if self._read is None:
            self._read = reference.read_gguf(self.gguf)
        return self._read


@pytest.fixture(scope="session")
def snac_cases(tmp_path_factory):
    """name -> SnacCase, built on first use (needs torch and snac)."""
    pytest.importorskip("torch")
    pytest.importorskip("snac")
    pytest.importorskip("gguf")
    root = tmp_path_factory.mktemp("snac")
    cache: dict[str, SnacCase] = {}

    def get(name: str) -> SnacCase:
        if name not in cache:
            cache[name] = SnacCase(name, root)
        return cache[name]

    return get


# ------------------------------------------------------------- the small model
# (module scope: each test module gets its own model file and offline context)


@pytest.fixture(scope="module")
def codecrt() -> Any:
    return codecrt_or_skip()


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, codecrt: Any) -> Path:
    return _write_small_snac(tmp_path_factory.mktemp("server") / "small.gguf", seed=5)


@pytest.fixture(scope="module")
def offline(codecrt: Any, small: Path) -> Any:
    model = codecrt.Model(small)
    ctx = codecrt.Context(model, device="cpu", n_threads=1, max_frames=1 << 14)

    def decode(levels: list[np.ndarray]) -> np.ndarray:
        return ctx.decode(levels).copy()

    yield decode
    ctx.close()
    model.close()


def rss_kib() -> int:
    """This process's resident memory in KiB (/proc, else the peak from getrusage)."""
    import resource

    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
