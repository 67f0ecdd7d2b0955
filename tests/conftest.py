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
