"""What an ExpertStore holds, read-only: its tiers' bookkeeping and its background work.

``store.tier("pool")`` / ``store.tier("arena")`` return a ``TierView``: which slot (or
arena row) each key holds, which keys are pinned, which slots are mid-load. Every answer
is a copy taken under the store lock, so a caller can neither change the store through
it nor see a half-made change. Keys are dense ids ``layer * n_experts + expert`` (as in
``FireResult.keys``); ``store.resident_keys(tier)`` gives (layer, expert) pairs.

The store's mixin ``Inspection`` adds the view and the few facts about its background
work a test or a debugging session asks (batches in flight, sections open, the worker
thread). None of it is needed to serve; all of it is cheap (no I/O; ``device_table``
is one host sync).
"""

from __future__ import annotations

import numpy as np

from tierstore.errors import ConfigError
from tierstore.store.slots import EVICTING, LOADING

TIERS = ("pool", "arena")


class TierView:
    """Read-only view of one tier (``store.tier(name)``); see the module docstring.

    ``keys`` arguments: a dense id, a sequence or an int array of them; ``None`` = every
    key (an array of ``n_layers * n_experts``, indexed by dense id)."""

    def __init__(self, store, states):
        self._store, self._states = store, states

    @property
    def name(self) -> str:
        """ "pool" or "arena"."""
        return self._states.tier

    @property
    def n_slots(self) -> int:
        """Slots (pool) or rows (arena) of the tier."""
        return int(self._states.n_slots)

    @property
    def n_free(self) -> int:
        """Slots holding no key at all (not resident, loading or evicting)."""
        with self._store.lock:
            return self._states.n_free

    def slot_of(self, keys=None) -> np.ndarray:
        """int64: the slot each key holds, resident or still loading; -1 = none."""
        return self._read(self._states.slot_of, keys)

    def resident_slot(self, keys=None) -> np.ndarray:
        """int32: the slot of each RESIDENT key (its bytes are there); -1 = not resident."""
        return self._read(self._states.resident_slot, keys)

    def pins(self, keys=None) -> np.ndarray:
        """int32: how many holders pin each key now (fires, a prefill, copy sources,
        staged rows); a pinned key is never a victim."""
        return self._read(self._states.key_pins, keys)

    def in_flight(self) -> np.ndarray:
        """int64: the slots mid-change (LOADING or EVICTING); empty once every call and
        promotion ended."""
        with self._store.lock:
            state = self._states.state
            return np.flatnonzero((state == LOADING) | (state == EVICTING))

    def device_table(self) -> np.ndarray:
        """Pool only: the slot table as the device sees it now, flat int64 by dense id
        (a host sync on CUDA: everything queued on the device is done first)."""
        if self.name != "pool":
            raise ConfigError(f"device_table: only the pool has a slot table, not the {self.name}")
        return self._states.device_table()

    def row_bytes(self, row: int) -> np.ndarray:
        """Arena only: a copy of the payload (``slot_bytes``) of arena row ``row``."""
        if self.name != "arena":
            raise ConfigError(f"row_bytes: only the arena has host rows, not the {self.name}")
        with self._store.lock:
            return self._states.row_bytes(row).copy()

    def _read(self, table: np.ndarray, keys) -> np.ndarray:
        with self._store.lock:
            return table.copy() if keys is None else np.array(table[keys])

    def __repr__(self) -> str:
        return f"TierView({self.name}, {self.n_slots} slots, {self.n_free} free)"


class Inspection:
    """ExpertStore's read-only inspection surface (a mixin; see the module docstring)."""

    def tier(self, name: str) -> TierView:
        """A read-only ``TierView`` of the "pool" or the "arena"."""
        if name not in TIERS:
            raise ConfigError(f"tier: name must be 'pool' or 'arena', found {name!r}")
        return TierView(self, self._pool if name == "pool" else self._arena)

    @property
    def batches_in_flight(self) -> int:
        """Read batches (fires, promotions, arena loads) planned or running and not yet
        published or rolled back; 0 when the store is idle, and after close()."""
        with self.lock:
            return len(self._mover.inflight)

    @property
    def sections_open(self) -> int:
        """Multi-table writes (a publish, a rollback) running now, or cut by a Ctrl-C and
        not yet finished by the next call into the store (store/interrupts.py); 0 between
        calls. Read without the lock: interrupt tests poll it on every traced line."""
        return len(self._journal.open)

    @property
    def worker_alive(self) -> bool:
        """The background worker thread (promotions, unpins, snapshots) is running; False
        once close() returned."""
        return self._worker.thread.is_alive()
