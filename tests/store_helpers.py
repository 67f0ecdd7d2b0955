"""Shared helpers for the store / pool / arena tests (not a test module)."""
from __future__ import annotations

import numpy as np

from tierstore.store.slots import RESIDENT


def assert_store_consistent(store) -> None:
    """After any operation or fault: bookkeeping agrees with itself and the device
    slot table, and every published slot and resident arena row holds exactly the
    pack row of its key."""
    store.check_invariants()
    pack, pool, arena = store.pack, store._pool, store._arena
    E = pack.n_experts
    table = pool.device_table()
    pool_bytes = store.pool.cpu().numpy() if store.pool.is_cuda else store.pool.numpy()
    for key in np.flatnonzero(table >= 0):
        slot = int(table[key])
        layer, expert = divmod(int(key), E)
        assert pool.state[slot] == RESIDENT
        assert np.array_equal(pool_bytes[slot], pack.read_row(layer, expert)), \
            f"pool slot {slot} does not hold layer {layer} expert {expert}"
    for key in np.flatnonzero(arena.resident_slot >= 0):
        row = int(arena.resident_slot[key])
        layer, expert = divmod(int(key), E)
        assert np.array_equal(arena.row_bytes(row), pack.read_row(layer, expert)), \
            f"arena row {row} does not hold layer {layer} expert {expert}"


def pairs(dense, n_experts: int) -> np.ndarray:
    dense = np.asarray(dense, dtype=np.int64)
    return np.stack([dense // n_experts, dense % n_experts], axis=1)
