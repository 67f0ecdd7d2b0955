"""The C++ unit tests of the I/O room (csrc/io/tests/test_*.cpp): configured, built and
run with cmake + ctest in a temporary build directory (no Python module, no CUDA, so
no nanobind is needed), on real files in that directory. Skips only when cmake or a
C++ compiler is missing."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _tool(name: str) -> str | None:
    return shutil.which(name)


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory):
    cmake, ctest = _tool("cmake"), _tool("ctest")
    if cmake is None or ctest is None:
        pytest.skip("cmake/ctest not installed")
    if not (_tool("c++") or _tool("g++") or _tool("clang++")):
        pytest.skip("no C++ compiler")
    build = tmp_path_factory.mktemp("cpp_units")
    gen = ["-G", "Ninja"] if _tool("ninja") else []
    cfg = subprocess.run(
        [
            cmake,
            "-S",
            str(ROOT),
            "-B",
            str(build),
            *gen,
            "-DCMAKE_BUILD_TYPE=Release",
            "-DTIERSTORE_BUILD_PYTHON=OFF",
            "-DTIERSTORE_BUILD_TESTS=ON",
            "-DTIERSTORE_DISABLE_CUDA=ON",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if cfg.returncode != 0:
        pytest.fail(f"cmake configure failed:\n{cfg.stdout[-2000:]}\n{cfg.stderr[-3000:]}")
    jobs = str(min(2, os.cpu_count() or 1))
    res = subprocess.run(
        [cmake, "--build", str(build), "-j", jobs], capture_output=True, text=True, timeout=300
    )
    if res.returncode != 0:
        pytest.fail(f"C++ unit tests failed to build:\n{res.stdout[-4000:]}\n{res.stderr[-2000:]}")
    return build


def _cases():
    return sorted(p.stem for p in (ROOT / "csrc/io/tests").glob("test_*.cpp"))


@pytest.mark.parametrize("name", _cases())
def test_cpp_unit(build_dir, name):
    res = subprocess.run(
        [shutil.which("ctest"), "--output-on-failure", "-R", f"^{name}$"],
        cwd=build_dir,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "TIERSTORE_TEST_DIR": str(build_dir)},
    )
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    assert "100% tests passed" in res.stdout and "out of 1" in res.stdout
