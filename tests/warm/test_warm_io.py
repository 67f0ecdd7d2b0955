"""Atomic writes under real faults: a full/limited filesystem never leaves a
half-written warm file or a stray temp file behind."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tierstore.errors import TierIOError
from tierstore.files.atomic import write_atomic, write_atomic_async
from tierstore.files.untrusted import read_capped

_LIMITED_WRITE = textwrap.dedent("""
    import asyncio, resource, signal, sys
    from tierstore.errors import TierIOError
    from tierstore.files.atomic import write_atomic, write_atomic_async
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # get EFBIG instead of a signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    try:
        if sys.argv[2] == "async":
            asyncio.run(write_atomic_async(sys.argv[1], b"x" * 65536))
        else:
            write_atomic(sys.argv[1], b"x" * 65536)
    except TierIOError as exc:
        print(exc)
        sys.exit(3)
""")


@pytest.mark.parametrize("how", ["sync", "async"])
def test_write_past_file_size_limit_keeps_old_file_and_no_temp(tmp_path, how):
    # a real kernel limit, no patching: the write fails 4 KiB in, and the error says so
    # (the async writer used to report offset 0 whatever the file reached)
    target = tmp_path / "poolmon.json"
    target.write_bytes(b'{"old": true}')
    proc = subprocess.run(
        [sys.executable, "-c", _LIMITED_WRITE, str(target), how], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.strip() == f"{target}: write at offset 0x1000 failed: EFBIG (File too large)"
    assert target.read_bytes() == b'{"old": true}'
    assert os.listdir(tmp_path) == ["poolmon.json"]


def test_async_write_into_missing_dir_raises_and_leaves_nothing(tmp_path):
    with pytest.raises(TierIOError, match="nodir/p.json: write"):
        asyncio.run(write_atomic_async(tmp_path / "nodir" / "p.json", b"x"))
    assert os.listdir(tmp_path) == []


def test_async_write_replaces_atomically(tmp_path):
    target = tmp_path / "p.json"
    target.write_bytes(b"old")
    asyncio.run(write_atomic_async(target, b"new" * 1000))
    assert target.read_bytes() == b"new" * 1000 and os.listdir(tmp_path) == ["p.json"]


@pytest.mark.parametrize("cancel_twice", [False, True])
def test_a_cancelled_async_write_settles_before_the_cancel_goes_on(tmp_path, cancel_twice):
    # The executor is held busy so the write has not started when its caller is
    # cancelled: the write must be abandoned (old target intact) and, once the
    # CancelledError reached the caller, no temp file may appear later (the old
    # aiofiles path returned at once and its thread created the temp afterwards).
    target = tmp_path / "p.json"
    target.write_bytes(b"old")
    gate = threading.Event()
    pool = ThreadPoolExecutor(max_workers=1)

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_default_executor(pool)
        loop.run_in_executor(None, gate.wait)  # the one worker is busy
        task = asyncio.ensure_future(write_atomic_async(target, b"new" * 1000))
        try:
            await asyncio.sleep(0.05)
            task.cancel()
            await asyncio.sleep(0.05)
            if cancel_twice:
                task.cancel()
                await asyncio.sleep(0.05)
            assert not task.done(), "the cancel went on before the write settled"
        finally:
            gate.set()  # asyncio.run joins the executor: a failed check must not hang
        with pytest.raises(asyncio.CancelledError):
            await task
        assert os.listdir(tmp_path) == ["p.json"]

    asyncio.run(main())
    pool.shutdown(wait=True)
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["p.json"]


def test_read_capped_refuses_directory_and_large_file(tmp_path):
    from tierstore.errors import FormatError

    with pytest.raises(FormatError, match="is a directory"):
        read_capped(tmp_path, cap=100)
    big = tmp_path / "big.json"
    big.write_bytes(b"x" * 101)
    with pytest.raises(FormatError, match="101 bytes, larger than the 100-byte cap"):
        read_capped(big, cap=100)
    write_atomic(big, b"y")
    assert read_capped(big, cap=100) == b"y"
