"""Shared helpers for the store / pool / arena tests (not a test module)."""

from __future__ import annotations

import os

import numpy as np


def assert_store_consistent(store) -> None:
    """After any operation or fault: bookkeeping agrees with itself and the device
    slot table, and every published slot and resident arena row holds exactly the
    pack row of its key."""
    store.check_invariants()
    pack, pool, arena = store.pack, store.tier("pool"), store.tier("arena")
    E = pack.n_experts
    table = pool.device_table()
    resident = pool.resident_slot()
    pool_bytes = store.pool.cpu().numpy() if store.pool.is_cuda else store.pool.numpy()
    for key in np.flatnonzero(table >= 0):
        slot = int(table[key])
        layer, expert = divmod(int(key), E)
        assert resident[key] == slot, f"slot {slot} of key {key} published, not RESIDENT"
        assert np.array_equal(pool_bytes[slot], pack.read_row(layer, expert)), (
            f"pool slot {slot} does not hold layer {layer} expert {expert}"
        )
    arena_rows = arena.resident_slot()
    for key in np.flatnonzero(arena_rows >= 0):
        row = int(arena_rows[key])
        layer, expert = divmod(int(key), E)
        assert np.array_equal(arena.row_bytes(row), pack.read_row(layer, expert)), (
            f"arena row {row} does not hold layer {layer} expert {expert}"
        )


def pairs(dense, n_experts: int) -> np.ndarray:
    dense = np.asarray(dense, dtype=np.int64)
    return np.stack([dense // n_experts, dense % n_experts], axis=1)


def corrupt_in_place(pack, layer, expert, nbytes=7):
    """Flip bytes of one row in place, keeping size and (restored) mtime, so only the
    checksum can tell."""
    st = os.stat(pack.path)
    fd = os.open(pack.path, os.O_RDWR)
    try:
        off = pack.row_offset(layer, expert) + 100
        old = os.pread(fd, nbytes, off)
        os.pwrite(fd, bytes(b ^ 0xFF for b in old), off)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.utime(pack.path, ns=(st.st_atime_ns, st.st_mtime_ns))
    fd = os.open(pack.path, os.O_RDONLY)
    try:  # out of the page cache: the next read comes from the disk
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
