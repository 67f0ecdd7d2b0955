"""The CUDA copy pipeline (run on the GPU machine): staged, arena and read-into-arena
rows land byte-exact in a device pool, copied chunk by chunk as each read lands;
stream_wait orders a consumer stream after the copies without a host sync; a failed
row fails its batch and wait() raises only once no copy is left on the copy stream;
a small stage ring recycles."""

from __future__ import annotations

import errno

import numpy as np
import pytest
from engine_helpers import write_random_file

from tierstore.errors import TierIOError

pytestmark = pytest.mark.gpu
SLOT = (3 << 20) + 4096 * 3  # not a power of two; a multiple of 4 KiB like pack rows
N_ROWS = 24


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import torch

    from tierstore.io.engine import Engine

    path = tmp_path_factory.mktemp("gpu") / "rows.bin"
    data = write_random_file(path, N_ROWS * SLOT, seed=21)
    eng = Engine(
        path, threads=8, direct="auto", device="cuda", chunk_bytes=1 << 20, stage_bytes=4 << 20, stage_count=3
    )
    pool = torch.zeros((N_ROWS, SLOT), dtype=torch.uint8, device="cuda")
    eng.register_buffer(pool)
    yield eng, pool, data, torch
    eng.close()


def _expected(data, rows):
    return np.stack([data[r * SLOT : (r + 1) * SLOT] for r in rows])


def test_alloc_host_is_pinned_when_cuda_is_present(setup):
    eng, _, _, _ = setup
    assert eng.alloc_host(1 << 20).is_pinned()


def test_staged_rows_stream_through_a_small_ring_into_the_pool_byte_exact(setup):
    eng, pool, data, torch = setup
    pool.zero_()
    rows = np.random.default_rng(0).permutation(N_ROWS)  # 24 rows through 3 stages
    dst = pool.data_ptr() + np.arange(N_ROWS) * SLOT
    c = eng.submit(rows * SLOT, SLOT, None, dst, dst_device=True)
    c.stream_wait(torch.cuda.current_stream())
    assert np.array_equal(pool.cpu().numpy(), _expected(data, rows))
    assert eng.stats()["h2d_bytes"] >= N_ROWS * SLOT


def test_arena_rows_copy_straight_from_host_memory(setup):
    eng, pool, data, torch = setup
    pool.zero_()
    arena = eng.alloc_host(4 * SLOT)
    rows = [5, 1, 17, 9]
    arena.numpy()[:] = _expected(data, rows).reshape(-1)
    c = eng.submit(
        np.full(4, -1),
        SLOT,
        arena.data_ptr() + np.arange(4) * SLOT,
        pool.data_ptr() + np.arange(4) * SLOT,
        dst_device=True,
    )
    c.synchronize()
    assert np.array_equal(pool[:4].cpu().numpy(), _expected(data, rows))


def test_read_into_arena_then_h2d_fills_both(setup):
    eng, pool, data, torch = setup
    pool.zero_()
    arena = eng.alloc_host(6 * SLOT)
    rows = np.array([3, 4, 20, 0, 11, 23])
    c = eng.submit(
        rows * SLOT,
        SLOT,
        arena.data_ptr() + np.arange(6) * SLOT,
        pool.data_ptr() + np.arange(6) * SLOT,
        dst_device=True,
    )
    c.synchronize()
    want = _expected(data, rows)
    assert np.array_equal(arena.numpy().reshape(6, SLOT), want)
    assert np.array_equal(pool[:6].cpu().numpy(), want)


def test_stream_wait_orders_consumer_work_after_the_copies(setup):
    eng, pool, data, torch = setup
    consumer = torch.cuda.Stream()
    want = int(_expected(data, range(N_ROWS)).astype(np.int64).sum())
    for _ in range(3):
        with torch.cuda.stream(consumer):
            pool.zero_()
        consumer.synchronize()
        c = eng.submit(
            np.arange(N_ROWS) * SLOT, SLOT, None, pool.data_ptr() + np.arange(N_ROWS) * SLOT, dst_device=True
        )
        c.stream_wait(consumer)  # no host sync on the copies
        with torch.cuda.stream(consumer):
            total = pool.to(torch.int64).sum()
        consumer.synchronize()
        assert int(total) == want


def test_failed_row_fails_the_batch_and_no_copy_is_pending_when_wait_raises(setup):
    eng, pool, data, torch = setup
    pool.fill_(0xAB)
    torch.cuda.synchronize()
    eng._inject_faults(fail_offset=2 * SLOT + SLOT // 2)  # mid-row: earlier chunks copied
    try:
        c = eng.submit(
            np.arange(4) * SLOT, SLOT, None, pool.data_ptr() + np.arange(4) * SLOT, dst_device=True
        )
        with pytest.raises(TierIOError) as info:
            c.wait()
        # The copy stream is idle: nothing writes into the pool once wait() raised.
        assert torch.cuda.ExternalStream(eng.copy_stream).query()
        assert info.value.errno == errno.EIO and c.failed_rows.tolist() == [2]
    finally:
        eng._inject_faults()
    out = pool[:4].cpu().numpy()
    assert np.array_equal(out[[0, 1, 3]], _expected(data, [0, 1, 3]))


def test_many_chunks_per_row_land_byte_exact_through_two_stages(tmp_path):
    """64 KiB chunks (about 50 H2D copies per row, issued from 6 reader threads out of
    order) through a 2-stage ring: a stage is reused only after all its chunk copies."""
    import torch

    from tierstore.io.engine import Engine

    path = tmp_path / "rows.bin"
    data = write_random_file(path, N_ROWS * SLOT, seed=33)
    pool = torch.zeros((N_ROWS, SLOT), dtype=torch.uint8, device="cuda")
    rows = np.random.default_rng(1).permutation(N_ROWS)
    with Engine(
        path, threads=6, direct="auto", device="cuda", chunk_bytes=64 << 10, stage_bytes=SLOT, stage_count=2
    ) as eng:
        eng.register_buffer(pool)
        for repeat in range(2):
            pool.zero_()
            c = eng.submit(
                rows * SLOT, SLOT, None, pool.data_ptr() + np.arange(N_ROWS) * SLOT, dst_device=True
            )
            c.synchronize()
            assert np.array_equal(pool.cpu().numpy(), _expected(data, rows)), repeat
        assert eng.stats()["h2d_bytes"] == 2 * N_ROWS * SLOT
