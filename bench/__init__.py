"""codecd's benchmarks, one entry point: ``python -m bench SUITE [ARGS]`` (run from the repository root).

``python -m bench`` lists the suites; ``python -m bench SUITE --help`` gives a suite's options.
Each suite prints markdown tables; docs/benchmarks.md gives the command, machine and date beside
every figure it quotes. bench/gpu/run.sh runs the GPU suites on the device machine.
"""
