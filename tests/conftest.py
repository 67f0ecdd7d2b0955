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


def _arm_sigint() -> None:
    # A run started in the background by a non-interactive shell (`cmd &`, nohup, some CI
    # runners) inherits SIGINT as SIG_IGN, and Python then never raises KeyboardInterrupt:
    # every Ctrl-C test would fail for a reason that is not the product's. Arm it as an
    # interactive run has it; children then start with the default disposition too.
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


_arm_sigint()


@pytest.fixture(autouse=True)
def _sigint_handler_left_as_found():
    """A test (or the code it runs in-process, e.g. a CLI command's main) that leaves
    SIGINT's handler changed would silently disarm every later Ctrl-C test of the run:
    put it back and fail the test that changed it."""
    import signal

    before = signal.getsignal(signal.SIGINT)
    yield
    after = signal.getsignal(signal.SIGINT)
    if after is not before:
        signal.signal(signal.SIGINT, before)
        pytest.fail(f"this test left SIGINT's handler changed: {before!r} -> {after!r}")
