"""Shared fixtures. GPU tests are marked ``gpu`` and skipped without a device."""
from __future__ import annotations

import pytest

import tierstore


def _has_gpu() -> bool:
    try:
        return tierstore.cuda_available()
    except Exception:
        return False


HAS_GPU = _has_gpu()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=["cpu"] + (["cuda"] if HAS_GPU else []))
def device(request):
    """Every store/pool test runs on the CPU pool, and on a CUDA pool when present."""
    return request.param


def private_temp_root(tmp_path_factory, monkeypatch):
    """A temp root of the test's own (TMPDIR and tempfile): demo runs of other processes on
    a shared machine must not count. Modules that check for leftover temp directories
    make it autouse: ``private_tmp = pytest.fixture(autouse=True)(private_temp_root)``."""
    import tempfile
    root = tmp_path_factory.mktemp("tmproot")
    monkeypatch.setenv("TMPDIR", str(root))
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root
