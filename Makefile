# CI runs these targets as they are. Native builds share the ggml sdist cache
# (cmake/fetch_ggml.py: $${CODECD_CACHE_DIR:-$${XDG_CACHE_HOME:-~/.cache}/codecd}/ggml/);
# set CODECD_GGML_DIR to a ggml source tree to build without the registry.

PYTHON ?= python
PIP ?= $(PYTHON) -m pip
CMAKE ?= cmake
CTEST ?= ctest
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
GENERATOR ?= $(shell command -v ninja >/dev/null 2>&1 && echo Ninja || echo "Unix Makefiles")
PYTEST_ARGS ?=
# ggml's own targets build without ggml's -Wall -Wextra set (GGML_ALL_WARNINGS is
# ggml's option and scopes to ggml's directory): gcc 12 reports ~770
# -Wmaybe-uninitialized false positives from its AVX-512 intrinsics headers
# inlined into ggml-cpu (vec.cpp, repack.cpp, ...), about 13,000 log lines per
# build. codecrt's own targets keep -Wall -Wextra -Werror (CMakeLists.txt).
GGML_QUIET = -DGGML_ALL_WARNINGS=OFF

.PHONY: all build build-deps wheel test lint types native-test asan clean

all: build

# Editable install with the test and dev extras. --no-build-isolation keeps the
# CMake build dir (build/{wheel_tag}) and its ggml objects between runs; the
# build requirements are installed first for that reason.
build: build-deps
	$(PIP) install --no-build-isolation -e ".[test,dev]"

build-deps:
	$(PIP) install "scikit-build-core>=0.10" "cffi>=1.17"

wheel:
	$(PIP) wheel --no-deps -w build/dist .

test:
	$(PYTHON) -m pytest $(PYTEST_ARGS)

lint:
	$(PYTHON) -m ruff check .

types:
	$(PYTHON) -m mypy

native-test:
	$(CMAKE) -S . -B build/native -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
		-DCODECRT_BUILD_TESTS=ON -DCODECRT_BUILD_PYTHON=OFF $(GGML_QUIET)
	$(CMAKE) --build build/native -j $(JOBS)
	$(CTEST) --test-dir build/native --output-on-failure -j $(JOBS)

asan:
	$(CMAKE) -S . -B build/asan -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
		-DCODECRT_BUILD_TESTS=ON -DCODECRT_BUILD_PYTHON=OFF -DCODECRT_SANITIZE=ON $(GGML_QUIET)
	$(CMAKE) --build build/asan -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
		$(CTEST) --test-dir build/asan --output-on-failure -j $(JOBS)

clean:
	rm -rf build
