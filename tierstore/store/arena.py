"""The pinned RAM arena: the hot set of expert rows in host memory.

One page-aligned allocation from the engine (``engine.alloc_host``: pinned and
registered when CUDA is present) of ``n_rows`` rows, each ``stride`` bytes (the
pack's stride, a multiple of 4 KiB), so an O_DIRECT read of a pack row lands in
an arena row in place, and an arena row is a zero-copy DMA source for the pool
copy (``submit(file_offset=-1, src_ptr=row)``).

Rows follow the slot state machine in ``tierstore.store.slots``. A row that is the
source of a copy still in flight is pinned (its key's pin count), so eviction
never overwrites bytes the copy engine is still reading. The arena has its own
policy instance; nothing is shared with the pool's.

Thread safety: none; the store serialises every call under its lock.
"""

from __future__ import annotations

import numpy as np

from tierstore.store.slots import SlotStates


class HostArena(SlotStates):
    """``n_rows`` pinned host rows of ``stride`` bytes (``n_rows`` may be 0: no arena)."""

    def __init__(self, engine, n_rows: int, stride: int, slot_bytes: int, n_keys: int, policy):
        super().__init__(n_rows, n_keys, policy, tier="arena")
        self.stride = int(stride)
        self.slot_bytes = int(slot_bytes)
        if self.stride % 4096:
            raise ValueError(f"arena stride {stride} is not a multiple of 4096")
        if self.n_slots:
            flat = engine.alloc_host(self.n_slots * self.stride)
            self.rows = flat.view(self.n_slots, self.stride)
            self._base_ptr = int(self.rows.data_ptr())
            if self._base_ptr % 4096:
                raise ValueError(f"engine.alloc_host returned {self._base_ptr:#x}, not page-aligned")
        else:
            self.rows = None
            self._base_ptr = 0

    def row_ptrs(self, rows: np.ndarray) -> np.ndarray:
        """Host addresses of ``rows`` (uint64): read targets and copy sources."""
        return np.uint64(self._base_ptr) + np.asarray(rows, dtype=np.uint64) * np.uint64(self.stride)

    def row_bytes(self, row: int) -> np.ndarray:
        """The ``slot_bytes`` payload of one row (a view; tests and verification)."""
        return self.rows[int(row), : self.slot_bytes].numpy()

    def close(self) -> None:
        self.rows = None
        self._base_ptr = 0
