"""codecd's benchmarks, one entry point: ``python -m bench SUITE [ARGS]`` (run from the repository root).

``python -m bench`` lists the suites; ``python -m bench SUITE --help`` gives a suite's options.
Each suite prints markdown tables; docs/benchmarks.md gives the command, machine and date beside
every figure it quotes. bench/gpu/run.sh runs the GPU suites on the device machine.
"""

import atexit
import shutil
import tempfile
from pathlib import Path


def scratch(prefix: str) -> Path:
    """A new temporary folder for a suite's models, removed when the process exits: a suite's
    released-size checkpoints and GGUFs are up to a GB, and runs must not pile up in /tmp."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, True)
    return path
