"""Least recently used, by a logical clock.

Each ``on_access`` call is one clock tick; every key it names gets that tick as
its last use (so keys read in the same call tie and are ordered by key id).
Admission also stamps the clock: a key that lands without having been read (a
prefetch) enters at the most-recent end, as in textbook LRU. Departure from the
textbook linked list: recency lives in an int64 array per key and ``victims``
partitions the resident keys by it, which is O(resident) per call but has no
per-key Python work and no pointer chasing, and the whole history (also of
non-resident keys) is kept, which ``rank`` uses for promotion order.
"""
from __future__ import annotations

import numpy as np

from tierstore.policies.dense import DensePolicy

NEVER = -1
_NO_HEAT = np.empty(0, dtype=np.float64)  # native_state: lru keeps no heat
_NO_POS = np.empty(0, dtype=np.int64)      # native_state: only phase keeps group positions


class LRUPolicy(DensePolicy):
    name = "lru"

    def __init__(self, n_keys: int, capacity: int, **params):
        super().__init__(n_keys, capacity, **params)
        self._last = np.full(self.n_keys, NEVER, dtype=np.int64)
        self._clock = 0

    def on_access(self, keys, weights=None, now=None) -> None:
        arr = self._checked_low(keys, "on_access")
        self._clock += 1
        try:
            self._last[arr] = self._clock  # one scatter; repeats are harmless
        except IndexError:
            self._raise_out_of_range(arr, "on_access")

    def _touch_admitted(self, keys: np.ndarray) -> None:
        self._clock += 1
        self._last[keys] = self._clock

    def _order(self):
        return self._last, None

    def decay(self, now=None, steps: int = 1) -> None:
        """Recency needs no decay: the clock advances with accesses."""

    def scores(self) -> np.ndarray:
        return self._last.astype(np.float64)

    def last_access(self) -> np.ndarray:
        """int64 [n_keys]: clock tick of each key's last use (-1 = never)."""
        return self._last.copy()

    def native_state(self):
        """(kind, last, raw, pos, resident, (clock, t, base, gain, n_resident, group,
        per_tick), half_life) for the native loops (``tierstore._C.replay_demand``,
        ``replay_auto``; tierstore.sim.native_replay): the arrays are live, the
        native loop updates them in place."""
        return (0, self._last, _NO_HEAT, _NO_POS, self._resident,
                (self._clock, 0.0, 0.0, 1.0, self._n_resident, 0, 1), 1.0)

    def load_native_state(self, scalars) -> None:
        """Take back the scalars a native loop returns (see ``native_state``)."""
        self._clock, self._n_resident = int(scalars[0]), int(scalars[4])

    def reset(self) -> None:
        super().reset()
        self._last[:] = NEVER
        self._clock = 0

    def check_invariants(self) -> None:
        super().check_invariants()
        assert self._last.max(initial=NEVER) <= self._clock, "a last-use tick is in the future"
        assert self._last.min(initial=NEVER) >= NEVER, "a last-use tick is below NEVER"
