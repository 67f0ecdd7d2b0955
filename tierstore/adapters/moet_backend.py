"""``rows_for``: vLLM-Moet's store-backend call, served through the store's public API.

vLLM-Moet's tiers ask a backend for host rows of (layer, expert) pairs. This
backend asks ``ExpertStore.read_rows`` (under the store's lock, its arena and its
native engine: threaded pread / O_DIRECT, one batch) to copy the rows into a
page-aligned host stage (pinned when CUDA is present) — never one ``os.preadv``
per row under a Python lock as the reference does.

Lifetime of the returned rows: views into the backend's reusable stage, valid
until the next ``rows_for`` call; pass ``copy=True`` for rows the caller owns.
Reusing the stage matters: faulting in a fresh buffer per call cost this 2-core
box more than the read itself (bench/results/adapter.md).
"""
from __future__ import annotations

import numpy as np
import torch


class TierstoreBackend:
    """Host rows of any (layer, expert) pairs of one store's pack.

    Thread safety: as the store's; calls from several threads are serialised by it,
    but the stage is shared, so one caller at a time (vLLM-Moet holds its tier lock).
    """

    def __init__(self, store):
        self.store = store
        self.pack = store.pack
        self.hits = 0        # rows answered from the arena
        self.reads = 0       # rows read from the pack
        self._stage: torch.Tensor | None = None

    def rows_for(self, pairs, scan: bool = False, copy: bool = False) -> list[np.ndarray]:
        """One uint8 [slot_bytes] row per pair, in the order given (repeats allowed).

        ``scan=False``: misses are admitted to the arena; ``scan=True`` (a prefill-sized
        sweep): arena hits are used but misses are NOT admitted, so a sweep does not
        wipe the arena's hot set. Bad pairs raise ConfigError / FormatError naming the
        pack, layer and expert before any read; a failed read raises TierIOError.
        """
        keys = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        if keys.size == 0:
            return []
        dense = self.pack.check_keys(keys)
        uniq, inverse = np.unique(dense, return_inverse=True)
        E = int(self.pack.n_experts)
        stage = self._buffer(len(uniq), owned=copy)
        hits = self.store.read_rows(np.stack([uniq // E, uniq % E], axis=1), stage, scan=scan)
        self.hits += hits
        self.reads += len(uniq) - hits
        view = stage.numpy()[: len(uniq), : self.pack.slot_bytes]
        return [view[i] for i in inverse.reshape(-1)]

    def _buffer(self, n: int, owned: bool) -> torch.Tensor:
        """Page-aligned host rows (O_DIRECT reads land in place): a new buffer when the
        caller will own the rows, else the reusable stage."""
        stride = int(self.pack.stride)
        if not owned and self._stage is not None and self._stage.shape[0] >= n:
            return self._stage
        buf = self.store.engine.alloc_host(n * stride).view(n, stride)
        if not owned:
            self._stage = buf
        return buf


def as_tensor_rows(rows: list[np.ndarray]) -> list[torch.Tensor]:
    """The same rows as torch uint8 tensors (no copy)."""
    return [torch.from_numpy(r) for r in rows]
