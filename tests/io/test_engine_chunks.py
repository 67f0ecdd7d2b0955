"""The per-chunk copy path on the CPU: rows cut into many small read tasks (with and
without the chunk ramp, buffered and O_DIRECT, aligned and unaligned offsets) land
byte-exact, and a fault in the middle of a row fails that row alone, with nothing
written into caller memory after wait() raised."""

from __future__ import annotations

import errno
import time

import numpy as np
import pytest
from engine_helpers import PAGE, pack_into, random_rows, write_random_file

from tierstore.errors import TierIOError
from tierstore.io.engine import Engine

FILE_BYTES = 8 << 20
ROW = 384 << 10  # 96 pages: with 16 KiB chunks about two dozen tasks per row


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("chunks") / "rows.bin"
    return path, write_random_file(path, FILE_BYTES, seed=5)


@pytest.mark.parametrize("direct", ["off", "on"])
@pytest.mark.parametrize("ramp", [True, False])
@pytest.mark.parametrize("chunk", [PAGE, 16 << 10])
def test_rows_cut_into_many_chunks_are_byte_exact(data_file, direct, ramp, chunk):
    path, data = data_file
    rng = np.random.default_rng(chunk + ramp)
    offsets, lengths = random_rows(rng, FILE_BYTES, 24, max_len=300_000)
    with Engine(path, threads=6, direct=direct, chunk_bytes=chunk, chunk_ramp=ramp) as eng:
        buf = eng.alloc_host(24 * 320_000)
        buf.fill_(0)
        pos = pack_into(buf.numel(), lengths, rng)
        assert eng.submit(offsets, lengths, None, buf.data_ptr() + pos).wait()
        # Read into a src buffer, then copied chunk by chunk into a second host buffer.
        src = eng.alloc_host(24 * 320_000)
        dst = eng.alloc_host(24 * 320_000)
        dst.fill_(0)
        assert eng.submit(offsets, lengths, src.data_ptr() + pos, dst.data_ptr() + pos).wait()
    for o, n, p in zip(offsets, lengths, pos):
        assert np.array_equal(buf.numpy()[p : p + n], data[o : o + n]), f"row at {o:#x} len {n}"
        assert np.array_equal(dst.numpy()[p : p + n], data[o : o + n]), f"row at {o:#x} len {n}"


def test_ramp_cuts_a_batch_into_more_first_tasks(data_file):
    """With chunk 128 KiB a 384 KiB row is 3 tasks; the ramp (8 threads: 16, 32, 48, ...
    KiB) makes it 7. The 5th syscall fails: only the ramped batch has one."""
    path, data = data_file
    with open(path, "rb") as f:
        f.read()  # cached: one syscall per task
    for ramp, expect_ok in ((False, True), (True, False)):
        with Engine(path, threads=8, direct="off", chunk_bytes=128 << 10, chunk_ramp=ramp) as eng:
            buf = eng.alloc_host(ROW)
            buf.fill_(0)
            eng._inject_faults(every_nth=5)
            c = eng.submit([ROW], ROW, None, buf.data_ptr())
            if expect_ok:
                assert c.wait() and np.array_equal(buf.numpy(), data[ROW : 2 * ROW])
            else:
                with pytest.raises(TierIOError):
                    c.wait()


@pytest.mark.parametrize("direct", ["off", "on"])
def test_fault_mid_row_fails_that_row_and_siblings_stay_exact(data_file, direct):
    path, data = data_file
    with Engine(path, threads=4, direct=direct, chunk_bytes=16 << 10) as eng:
        bad = 5 * ROW + ROW // 2 + 123  # inside row 5, many chunks in
        eng._inject_faults(fail_offset=bad)
        buf = eng.alloc_host(8 * ROW)
        buf.fill_(0)
        offsets = np.arange(8) * ROW
        c = eng.submit(offsets, ROW, None, buf.data_ptr() + offsets)
        with pytest.raises(TierIOError) as info:
            c.wait()
        assert info.value.errno == errno.EIO and c.failed_rows.tolist() == [5]
        assert info.value.offset == 5 * ROW and info.value.failed_offset <= bad
        out = buf.numpy().reshape(8, ROW)
        for r in (0, 1, 2, 3, 4, 6, 7):
            assert np.array_equal(out[r], data[r * ROW : (r + 1) * ROW]), f"sibling row {r}"


def test_nothing_writes_after_a_mid_row_failure_was_reported(data_file):
    """Slow chunks of the failed row's siblings are still being read when the fault hits;
    wait() raises only after they finished, and the buffer is stable from then on."""
    path, _ = data_file
    with Engine(path, threads=3, direct="off", chunk_bytes=PAGE) as eng:
        eng._inject_faults(fail_offset=2 * ROW + 50 * PAGE, delay_us=300)
        buf = eng.alloc_host(4 * ROW)
        buf.fill_(0)
        offsets = np.arange(4) * ROW
        c = eng.submit(offsets, ROW, None, buf.data_ptr() + offsets)
        with pytest.raises(TierIOError):
            c.wait(timeout=30)
        assert c.done() and 2 in c.failed_rows.tolist()
        snapshot = buf.clone()
        time.sleep(0.05)
        assert bool((buf == snapshot).all()), "a chunk still landed after wait() raised"
