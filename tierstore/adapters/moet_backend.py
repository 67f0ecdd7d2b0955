"""``rows_for``: vLLM-Moet's store-backend call, served by tierstore's I/O engine.

vLLM-Moet's own tiers (its base cache, its stage buffers) ask a backend for host
rows of (layer, expert) pairs. This backend answers from the pinned RAM arena
when it can (zero-copy views) and otherwise with one batched engine read
(threaded pread / O_DIRECT) into a fresh page-aligned buffer the caller owns — never one
``os.preadv`` per row under a Python lock as the reference does.

Lifetime of the returned rows: they are views (into arena rows, or into the
backend's reusable page-aligned stage for rows read from the pack) valid until
the next ``rows_for`` call or the next store call that may evict (``promote``,
``fire``, ``step``): copy them before then, or pass ``copy=True`` to get rows
the caller owns. Reusing the stage matters: faulting in a fresh buffer per call
cost this 2-core box more than the read itself (bench/results/adapter.md).
"""
from __future__ import annotations

import numpy as np
import torch

from tierstore.errors import ConfigError

PAGE = 4096


class TierstoreBackend:
    """Host rows of any (layer, expert) pairs of one store's pack.

    Thread safety: as the store's; calls from several threads are serialised by it.
    """

    def __init__(self, store):
        self.store = store
        self.pack = store.pack
        self.hits = 0        # rows answered from the arena
        self.reads = 0       # rows read from the pack
        self._stage: np.ndarray | None = None

    def rows_for(self, pairs, scan: bool = False, copy: bool = False) -> list[np.ndarray]:
        """One uint8 [slot_bytes] row per pair, in the order given (repeats allowed).

        ``scan=False``: rows are admitted to the arena (``store.load_arena``) and
        served from it; ``scan=True`` (a prefill-sized sweep): arena hits are used
        but misses are read into a private buffer and NOT admitted, so a sweep
        does not wipe the arena's hot set. Bad pairs raise ConfigError /
        FormatError naming the pack, layer and expert before any read.
        """
        keys = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        if keys.size == 0:
            return []
        dense = self.pack.check_keys(keys)
        uniq, first = np.unique(dense, return_index=True)
        if not scan and self._arena() is not None:
            self.store.load_arena(keys[first])
        rows: dict[int, np.ndarray] = {}
        in_arena = self._arena_rows(uniq)
        hit = in_arena >= 0
        arena = self._arena()
        for key, row in zip(uniq[hit], in_arena[hit]):
            view = arena.rows[int(row), : self.pack.slot_bytes].numpy()
            rows[int(key)] = view.copy() if copy else view
        self.hits += int(hit.sum())
        if (~hit).any():
            rows.update(self._read_fresh(uniq[~hit], owned=copy))
        return [rows[int(k)] for k in dense]

    # -- helpers -----------------------------------------------------------------
    def _arena(self):
        arena = getattr(self.store, "arena", None)
        return arena if arena is not None and getattr(arena, "n_slots", 0) else None

    def _arena_rows(self, dense: np.ndarray) -> np.ndarray:
        arena = self._arena()
        if arena is None:
            return np.full(len(dense), -1, dtype=np.int64)
        return arena.resident_slot[dense].astype(np.int64)

    def _buffer(self, nbytes: int, owned: bool) -> np.ndarray:
        """Page-aligned (O_DIRECT reads land in place) pageable host bytes: a new
        buffer when the caller will own the rows, else the reusable stage."""
        if not owned and self._stage is not None and self._stage.nbytes >= nbytes:
            return self._stage[:nbytes]
        raw = np.empty(nbytes + PAGE, dtype=np.uint8)
        lead = (-raw.ctypes.data) % PAGE
        buf = raw[lead: lead + nbytes]
        if not owned:
            self._stage = buf
        return buf

    def _read_fresh(self, dense: np.ndarray, owned: bool) -> dict[int, np.ndarray]:
        """One batched engine read of ``dense`` rows into a page-aligned buffer."""
        pack, n = self.pack, len(dense)
        engine = getattr(self.store, "engine", None)
        if engine is None:
            raise ConfigError(f"{pack.path}: store has no I/O engine to read rows with")
        buf = self._buffer(n * pack.stride, owned)
        base = int(buf.ctypes.data)
        dst = base + np.arange(n, dtype=np.uint64) * np.uint64(pack.stride)
        done = engine.submit(pack.row_offsets(dense).astype(np.int64),
                             np.full(n, pack.slot_bytes, dtype=np.int64),
                             np.zeros(n, dtype=np.uint64), dst.astype(np.uint64),
                             dst_device=False)
        done.wait()
        self.reads += n
        view = buf.reshape(n, pack.stride)[:, : pack.slot_bytes]
        return {int(k): view[i] for i, k in enumerate(dense)}


def as_tensor_rows(rows: list[np.ndarray]) -> list[torch.Tensor]:
    """The same rows as torch uint8 tensors (no copy)."""
    return [torch.from_numpy(r) for r in rows]
