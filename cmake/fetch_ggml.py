#!/usr/bin/env python3
"""Resolve the ggml source tree that codecrt builds against.

Invoked by CMakeLists.txt at configure time (``execute_process``); prints the
absolute path of a ggml source tree (the directory holding ggml's
CMakeLists.txt) on the last line of stdout and exits 0, or explains the failure
on stderr and exits 1.

ggml comes from the PyPI sdist ``ggml-python==<version>`` (its ``vendor/ggml``),
downloaded with pip on first use and kept in a cache:

    ${CODECD_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/codecd}/ggml/
        ggml_python-<version>.tar.gz      the sdist; its sha256 is checked on every use
        ggml_python-<version>-<sha12>/    the extracted vendor/ggml tree (+ .complete stamp)

Never is an unverified file used: a cached tarball whose hash differs is deleted
and downloaded again, a download is verified before it is moved into the cache,
and the extracted tree is only trusted when its stamp names the same hash.

Overrides:
    CODECD_GGML_DIR     a ggml source tree to use as it is (no download, no hash)
    CODECD_GGML_SDIST   a local ggml-python sdist to use instead of downloading
                        (hash-checked like a download)
    CODECD_CACHE_DIR    the cache root (see above)
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

DEFAULT_VERSION = "0.0.45"
DEFAULT_SHA256 = "10aac52075cf3c7ef2b00d6c35b1c23f7b018dbeff8ae8df67339b4be1166f05"
VENDOR_PREFIX = "vendor/ggml/"


def log(msg: str) -> None:
    print(f"fetch_ggml: {msg}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    env = os.environ.get("CODECD_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "codecd"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def locked(dir_: Path) -> Iterator[None]:
    """Serialise concurrent builds (pip install and make native-test at once)."""
    dir_.mkdir(parents=True, exist_ok=True)
    with (dir_ / ".lock").open("a+") as f:
        try:
            import fcntl

            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover - Windows: no locking
            pass
        yield


def _pip_commands() -> list[tuple[list[str], dict[str, str]]]:
    """Ways to run pip, best first.

    Inside pip's isolated build environment pip itself is usually not importable
    (the base site-packages are hidden), so the base interpreter's site-packages
    is added back explicitly as a fallback.
    """
    env = dict(os.environ)
    cmds: list[tuple[list[str], dict[str, str]]] = []
    if importlib.util.find_spec("pip") is not None:
        cmds.append(([sys.executable, "-m", "pip"], env))
    # The interpreter's own (non-isolated) site-packages.
    purelib = sysconfig.get_paths().get("purelib")
    if purelib and (Path(purelib) / "pip").is_dir():
        env2 = dict(env)
        env2["PYTHONPATH"] = os.pathsep.join(
            p for p in (env.get("PYTHONPATH", ""), purelib) if p
        )
        cmds.append(([sys.executable, "-m", "pip"], env2))
    for name in ("pip3", "pip"):
        exe = shutil.which(name)
        if exe:
            env3 = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
            cmds.append(([exe], env3))
            break
    return cmds


def download(version: str, sha256: str, dest: Path) -> None:
    """Download the sdist with pip into a temp dir, verify it, move it to dest."""
    spec = f"ggml-python=={version}"
    name = f"ggml_python-{version}.tar.gz"
    attempts: list[list[str]] = [
        # Fast: no build isolation (needs scikit-build-core importable, which it
        # is inside our own build environment).
        ["download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation", spec],
        # Fallback: isolated metadata build, with binary build deps allowed so
        # pip does not try to build cmake from source.
        ["download", "--no-deps", "--no-binary", "ggml-python", spec],
    ]
    errors: list[str] = []
    for base, env in _pip_commands():
        for args in attempts:
            with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".dl-") as tmp:
                cmd = [*base, *args, "-d", tmp, "--disable-pip-version-check", "-q"]
                log("running " + " ".join(cmd))
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                got = Path(tmp) / name
                if proc.returncode != 0 or not got.is_file():
                    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
                    errors.append(f"{' '.join(cmd)}: rc={proc.returncode}: {' | '.join(tail)}")
                    continue
                digest = sha256_of(got)
                if digest != sha256:
                    # A wrong hash is not a transient failure: never retry into it.
                    raise SystemExit(
                        f"fetch_ggml: downloaded {name} has sha256 {digest}, expected {sha256}"
                    )
                os.replace(got, dest)
                return
    raise SystemExit("fetch_ggml: could not download " + spec + ":\n  " + "\n  ".join(errors))


def _safe_members(tar: tarfile.TarFile, root: str) -> Iterator[tuple[tarfile.TarInfo, str]]:
    prefix = root + VENDOR_PREFIX
    for m in tar.getmembers():
        if not m.name.startswith(prefix):
            continue
        rel = m.name[len(prefix):]
        if not rel:
            continue
        parts = Path(rel).parts
        if Path(rel).is_absolute() or ".." in parts:
            raise SystemExit(f"fetch_ggml: unsafe path in sdist: {m.name}")
        if not (m.isfile() or m.isdir()):
            continue  # no links, devices or fifos
        yield m, rel


def extract(tarball: Path, dest: Path, sha256: str) -> None:
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".x-"))
    os.chmod(tmp, 0o755)
    try:
        with tarfile.open(tarball, "r:gz") as tar:
            first = tar.getmembers()[0].name.split("/")[0]
            root = first + "/"
            n = 0
            for m, rel in _safe_members(tar, root):
                target = tmp / rel
                if m.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(m)
                assert src is not None
                with src, target.open("wb") as out:
                    shutil.copyfileobj(src, out)
                os.chmod(target, 0o755 if m.mode & 0o111 else 0o644)
                n += 1
        if not (tmp / "CMakeLists.txt").is_file():
            raise SystemExit(f"fetch_ggml: {tarball} has no {VENDOR_PREFIX}CMakeLists.txt")
        (tmp / ".complete").write_text(sha256 + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
        log(f"extracted {n} files to {dest}")
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def resolve(version: str, sha256: str) -> Path:
    local_tree = os.environ.get("CODECD_GGML_DIR")
    if local_tree:
        p = Path(local_tree).expanduser().resolve()
        if not (p / "CMakeLists.txt").is_file():
            raise SystemExit(f"fetch_ggml: CODECD_GGML_DIR={local_tree} has no CMakeLists.txt")
        return p

    cdir = cache_root() / "ggml"
    with locked(cdir):
        tarball = cdir / f"ggml_python-{version}.tar.gz"
        tree = cdir / f"ggml_python-{version}-{sha256[:12]}"

        if tarball.is_file() and sha256_of(tarball) != sha256:
            log(f"cached {tarball} fails its sha256 check; removing it")
            tarball.unlink()
        if not tarball.is_file():
            local_sdist = os.environ.get("CODECD_GGML_SDIST")
            if local_sdist:
                src = Path(local_sdist).expanduser()
                digest = sha256_of(src)
                if digest != sha256:
                    raise SystemExit(
                        f"fetch_ggml: CODECD_GGML_SDIST={src} has sha256 {digest}, "
                        f"expected {sha256}"
                    )
                tmp = cdir / f".{tarball.name}.tmp"
                shutil.copyfile(src, tmp)
                os.replace(tmp, tarball)
            else:
                download(version, sha256, tarball)
            log(f"cached {tarball}")

        # The tarball is verified (above) on every use, also when the tree exists.
        stamp = tree / ".complete"
        if not (stamp.is_file() and stamp.read_text().strip() == sha256
                and (tree / "CMakeLists.txt").is_file()):
            extract(tarball, tree, sha256)
        return tree


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--version", default=DEFAULT_VERSION)
    ap.add_argument("--sha256", default=DEFAULT_SHA256)
    args = ap.parse_args(argv)
    try:
        tree = resolve(args.version, args.sha256.lower())
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            return 1
        raise
    except OSError as e:
        print(f"fetch_ggml: {e}", file=sys.stderr)
        return 1
    print(tree.as_posix())
    return 0


if __name__ == "__main__":
    sys.exit(main())
