"""Engine.submit's issue-15 guards on a real GPU (run on the H200): the buffer table
(csrc/io/src/buffer_table.cpp) with device memory on the device side of the bus, and
checksums on rows copied H2D through the pinned staging ring, rows bigger than one
stage included (hashed segment by segment on the stage before it is recycled, while
the segment's H2D chunks are on the copy stream)."""

from __future__ import annotations

import errno

import numpy as np
import pytest
import xxhash
from engine_helpers import PAGE, flip_byte, write_random_file

from tierstore.errors import BufferBoundsError, TierIOError

pytestmark = pytest.mark.gpu
MIB = 1 << 20
# 17 MiB (2 segments of 16 MiB), 40 MiB (3), 17 MiB + 1234 B (2, ragged), 1 MiB + 5 B.
ROWS = [(0, 17 * MIB), (17 * MIB, 40 * MIB), (57 * MIB, 17 * MIB + 1234), (75 * MIB, MIB + 5)]


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    import torch

    from tierstore.io.engine import Engine

    path = tmp_path_factory.mktemp("gpu_checks") / "rows.bin"
    data = write_random_file(path, 77 * MIB, seed=41)
    sums = np.array([xxhash.xxh3_64_intdigest(data[o : o + n].tobytes()) for o, n in ROWS], dtype=np.uint64)
    starts = np.cumsum([0] + [(n + PAGE - 1) // PAGE * PAGE for _, n in ROWS[:-1]])
    eng = Engine(path, threads=8, direct="auto", device="cuda", stage_bytes=16 * MIB, stage_count=3)
    pool = torch.zeros(int(starts[-1]) + ROWS[-1][1], dtype=torch.uint8, device="cuda")
    eng.register_buffer(pool)
    yield eng, pool, path, data, sums, starts, torch
    eng.close()


def _submit(eng, pool, starts, sums):
    return eng.submit(
        [o for o, _ in ROWS],
        [n for _, n in ROWS],
        None,
        (pool.data_ptr() + starts).astype(np.uint64),
        dst_device=True,
        checksums=sums,
    )


def _on_device(pool, starts, i) -> np.ndarray:
    s = int(starts[i])
    return pool[s : s + ROWS[i][1]].cpu().numpy()


def test_big_checksummed_rows_land_on_the_device_byte_exact(big):
    eng, pool, path, data, sums, starts, torch = big
    pool.zero_()
    torch.cuda.synchronize()
    before = eng.stats()
    _submit(eng, pool, starts, sums).synchronize()
    for i, (o, n) in enumerate(ROWS):
        assert np.array_equal(_on_device(pool, starts, i), data[o : o + n]), i
    after = eng.stats()
    assert after["verified_rows"] - before["verified_rows"] == len(ROWS)
    assert after["verified_bytes"] - before["verified_bytes"] == sum(n for _, n in ROWS)
    assert after["h2d_bytes"] - before["h2d_bytes"] == sum(n for _, n in ROWS)


@pytest.mark.parametrize("where", [3, 16 * MIB + 5, 40 * MIB - 1], ids=["first", "middle", "last"])
def test_a_corrupted_segment_fails_its_row_and_no_copy_is_pending(big, where):
    eng, pool, path, data, sums, starts, torch = big
    pool.fill_(0xAB)
    torch.cuda.synchronize()
    at = ROWS[1][0] + where
    flip_byte(path, at)
    try:
        c = _submit(eng, pool, starts, sums)
        with pytest.raises(TierIOError) as info:
            c.wait()
        assert torch.cuda.ExternalStream(eng.copy_stream).query()  # copy stream idle
        exc = info.value
        assert exc.errno == errno.EBADMSG and c.failed_rows.tolist() == [1]
        assert exc.offset == ROWS[1][0] and "xxh3_64 mismatch" in str(exc)
        for i in (0, 2, 3):  # the others landed
            o, n = ROWS[i]
            assert np.array_equal(_on_device(pool, starts, i), data[o : o + n]), i
    finally:
        flip_byte(path, at)


def test_many_small_segments_through_two_stages(tmp_path):
    """1 MiB stages, 128 KiB chunks, 2 stages: segments land out of order, each held on
    its stage until the ones before it are hashed; every byte lands, every row verifies."""
    import torch

    from tierstore.io.engine import Engine

    n, size = 8, 5 * MIB + 777
    path = tmp_path / "rows.bin"
    data = write_random_file(path, n * 6 * MIB, seed=42)
    offsets = np.arange(n) * 6 * MIB + (np.arange(n) % 2) * 100
    sums = np.array(
        [xxhash.xxh3_64_intdigest(data[o : o + size].tobytes()) for o in offsets], dtype=np.uint64
    )
    pool = torch.zeros((n, 6 * MIB), dtype=torch.uint8, device="cuda")
    with Engine(
        path, threads=6, direct="auto", device="cuda", chunk_bytes=128 << 10, stage_bytes=MIB, stage_count=2
    ) as eng:
        eng.register_buffer(pool)
        for _ in range(2):
            pool.zero_()
            eng.submit(
                offsets, size, None, pool.data_ptr() + np.arange(n) * 6 * MIB, dst_device=True, checksums=sums
            ).synchronize()
            got = pool[:, :size].cpu().numpy()
            assert all(np.array_equal(got[i], data[o : o + size]) for i, o in enumerate(offsets))
        assert eng.stats()["verified_rows"] == 2 * n and eng.stats()["checksum_failures"] == 0


def test_device_buffers_are_checked_on_the_device_side(big):
    eng, pool, path, data, sums, starts, torch = big
    dev = torch.full((2 * PAGE,), 7, dtype=torch.uint8, device="cuda")
    with pytest.raises(
        BufferBoundsError,
        match=r"row 0 .*dst 0x[0-9a-f]+ is in no registered "
        r"device buffer",
    ):
        eng.submit([0], PAGE, None, dev.data_ptr(), dst_device=True)
    with eng.registered(dev):
        with pytest.raises(
            BufferBoundsError,
            match=r"past the registered device buffer it "
            r"points into \(8192 B at 0x",
        ):
            eng.submit([0], 2 * PAGE, None, dev.data_ptr() + PAGE, dst_device=True)
        with pytest.raises(BufferBoundsError, match=r"is device memory .*the row needs host"):
            eng.submit([-1], PAGE, dev.data_ptr(), pool.data_ptr(), dst_device=True)
        host = eng.alloc_host(PAGE)  # pinned, host side
        with pytest.raises(BufferBoundsError, match=r"is host memory .*the row needs device"):
            eng.submit([0], PAGE, None, host.data_ptr(), dst_device=True)
        torch.cuda.synchronize()
        assert bool((dev == 7).all())  # nothing was written
        eng.submit(
            [0],
            2 * PAGE,
            None,
            dev.data_ptr(),
            dst_device=True,
            checksums=[xxhash.xxh3_64_intdigest(data[: 2 * PAGE].tobytes())],
        ).synchronize()
        assert np.array_equal(dev.cpu().numpy(), data[: 2 * PAGE])
    ptr = dev.data_ptr()
    del dev  # freed: it leaves the table
    with pytest.raises(BufferBoundsError, match="in no registered device buffer"):
        eng.submit([0], PAGE, None, ptr, dst_device=True)


def test_arena_rows_to_the_device_are_not_hashed(big):
    eng, pool, path, data, sums, starts, torch = big
    arena = eng.alloc_host(2 * MIB)
    arena.numpy()[:] = data[: 2 * MIB]
    before = eng.stats()["verified_rows"]
    eng.submit(
        [-1], 2 * MIB, arena.data_ptr(), pool.data_ptr(), dst_device=True, checksums=[12345]
    ).synchronize()  # a wrong sum: not checked
    assert eng.stats()["verified_rows"] == before
    assert np.array_equal(pool[: 2 * MIB].cpu().numpy(), data[: 2 * MIB])
