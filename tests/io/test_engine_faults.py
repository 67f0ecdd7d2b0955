"""Engine failure paths: end of file inside a row (a really truncated file), injected
EIO and short reads, cancellation and close() with reads in flight, wait timeouts."""

from __future__ import annotations

import errno
import time

import numpy as np
import pytest
from engine_helpers import PAGE, write_random_file

from tierstore.errors import TierIOError
from tierstore.io.engine import Engine

ROW = 256 << 10


@pytest.fixture(params=["off", "on"])
def direct(request):
    return request.param


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "rows.bin"
    return path, write_random_file(path, 16 * ROW, seed=3)


def test_truncated_file_fails_only_the_cut_row_naming_path_and_offset(tmp_path, direct):
    path = tmp_path / "cut.pack"
    data = write_random_file(path, 4 * ROW + 1000, seed=5)  # row 4 is cut 1000 B in
    with Engine(path, threads=3, direct=direct, chunk_bytes=64 << 10) as eng:
        buf = eng.alloc_host(5 * ROW)
        offsets = np.arange(5) * ROW
        c = eng.submit(offsets, ROW, None, buf.data_ptr() + offsets)
        with pytest.raises(TierIOError) as info:
            c.wait()
        exc = info.value
        assert exc.errno == errno.ENODATA and exc.path == str(path)
        assert exc.offset == 4 * ROW and exc.row == 4
        assert "unexpected end of file" in str(exc) and f"{4 * ROW:#x}" in str(exc)
        assert c.failed_rows.tolist() == [4] and c.done()
        out = buf.numpy()
        assert np.array_equal(out[: 4 * ROW], data[: 4 * ROW])  # siblings finished, byte-exact


def test_injected_eio_at_one_offset_fails_that_row_and_reports_errno(data_file, direct):
    path, data = data_file
    with Engine(path, threads=4, direct=direct, chunk_bytes=64 << 10) as eng:
        eng._inject_faults(fail_offset=5 * ROW + 12345)
        buf = eng.alloc_host(8 * ROW)
        offsets = np.arange(8) * ROW
        c = eng.submit(offsets, ROW, None, buf.data_ptr() + offsets)
        with pytest.raises(TierIOError) as info:
            c.wait()
        assert info.value.errno == errno.EIO and "EIO" in str(info.value)
        assert info.value.offset == 5 * ROW and str(path) in str(info.value)
        assert c.failed_rows.tolist() == [5]
        good = [i for i in range(8) if i != 5]
        for i in good:
            assert np.array_equal(buf.numpy()[i * ROW : (i + 1) * ROW], data[i * ROW : (i + 1) * ROW])
        assert eng.stats()["failed_rows"] == 1
        # The hook is per engine and can be cleared: the same rows then read cleanly.
        eng._inject_faults()
        assert eng.submit(offsets, ROW, None, buf.data_ptr() + offsets).wait()


def test_every_syscall_failing_fails_every_row_with_the_injected_errno(data_file):
    path, _ = data_file
    with Engine(path, threads=2, direct="off") as eng:
        eng._inject_faults(every_nth=1, errno=errno.EIO)
        c = eng.submit(np.arange(4) * ROW, ROW)
        with pytest.raises(TierIOError):
            c.wait()
        assert c.failed_rows.tolist() == [0, 1, 2, 3]


def test_a_repeating_eintr_surfaces_as_that_errno_instead_of_spinning(data_file):
    # The old fault hook retried EINTR forever: this wait never returned.
    path, data = data_file
    with Engine(path, threads=2, direct="off") as eng:
        eng._inject_faults(fail_offset=2 * ROW + 7, errno=errno.EINTR)
        c = eng.submit(np.arange(4) * ROW, ROW)
        t0 = time.perf_counter()
        with pytest.raises(TierIOError) as info:
            c.wait(timeout=10)
        assert time.perf_counter() - t0 < 5
        assert info.value.errno == errno.EINTR and c.failed_rows.tolist() == [2]
        assert "EINTR" in str(info.value) and info.value.offset == 2 * ROW
        # An EINTR now and then is retried: every other attempt interrupted still reads.
        eng._inject_faults(every_nth=2, errno=errno.EINTR, short_reads=True)
        buf = eng.alloc_host(ROW)
        assert eng.submit([3 * ROW], ROW, None, buf.data_ptr()).wait(timeout=10)
        assert np.array_equal(buf.numpy(), data[3 * ROW : 4 * ROW])


def test_short_reads_are_resumed_byte_exact(data_file, direct):
    path, data = data_file
    with Engine(path, threads=3, direct=direct, chunk_bytes=128 << 10) as eng:
        eng._inject_faults(short_reads=True)
        buf = eng.alloc_host(16 * ROW)
        offsets = np.array([0, 3 * ROW + 17, 7 * ROW, 10 * ROW + PAGE])
        lengths = np.array([ROW, ROW - 17, 2 * ROW + 5, ROW])
        dst = buf.data_ptr() + np.array([0, ROW, 2 * ROW + 3, 5 * ROW])
        assert eng.submit(offsets, lengths, None, dst).wait()
        out = buf.numpy()
        for o, n, d in zip(offsets, lengths, dst - buf.data_ptr()):
            assert np.array_equal(out[d : d + n], data[o : o + n])


def test_wait_times_out_while_reads_are_slow(data_file):
    path, _ = data_file
    with Engine(path, threads=1, direct="off", chunk_bytes=PAGE) as eng:
        eng._inject_faults(delay_us=20_000)
        c = eng.submit([0], [8 * PAGE])
        t0 = time.perf_counter()
        assert c.wait(timeout=0.01) is False and not c.done()
        assert time.perf_counter() - t0 < 0.5
        assert c.wait(timeout=5)


@pytest.mark.parametrize("how", ["cancel", "close"])
def test_cancel_with_reads_in_flight_stops_all_writes_before_wait_raises(data_file, how):
    path, _ = data_file
    eng = Engine(path, threads=2, direct="off", chunk_bytes=PAGE)
    eng._inject_faults(delay_us=5_000)  # every 4 KiB read takes >= 5 ms
    buf = eng.alloc_host(16 * ROW)
    buf.zero_()
    offsets = np.arange(16) * ROW
    c = eng.submit(offsets, ROW, None, buf.data_ptr() + offsets)
    time.sleep(0.03)  # a few reads have landed, most are queued
    t0 = time.perf_counter()
    if how == "cancel":
        c.cancel()
    else:
        eng.close()  # joins the readers: nothing in flight after
    with pytest.raises(TierIOError) as info:
        c.wait(timeout=10)
    assert time.perf_counter() - t0 < 2.0  # 1024 queued reads were dropped, not done
    assert info.value.errno == errno.ECANCELED and c.done()
    assert 0 < len(c.failed_rows) <= 16
    snapshot = buf.clone()
    time.sleep(0.05)
    assert bool((buf == snapshot).all()), "a read still wrote into caller memory after wait()"
    assert int((snapshot != 0).sum()) < 16 * ROW  # some bytes were never read
    eng.close()
