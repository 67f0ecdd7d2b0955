"""Least recently used, by a logical clock.

Each ``on_access`` call is one clock tick; every key it names gets that tick as
its last use (so keys read in the same call tie and are ordered by key id).
Admission also stamps the clock: a key that lands without having been read (a
prefetch) enters at the most-recent end, as in textbook LRU. Departure from the
textbook linked list: recency lives in an int64 array per key and ``victims``
selects among the resident keys by it, which is O(resident) per call but has no
pointer chasing, and the whole history (also of non-resident keys) is kept, which
``rank`` uses for promotion order. The rules run natively (policies/native.py).
"""

from __future__ import annotations

import numpy as np

from tierstore.policies.native import NativePolicy


class LRUPolicy(NativePolicy):
    name = "lru"
    kind = 0
    stamps = True

    def on_access(self, keys, weights=None, now=None) -> None:
        self._access(keys, None)  # recency ignores weights

    def decay(self, now=None, steps: int = 1) -> None:
        """Recency needs no decay: the clock advances with accesses."""

    def scores(self) -> np.ndarray:
        return self._last.astype(np.float64)

    def last_access(self) -> np.ndarray:
        """int64 [n_keys]: clock tick of each key's last use (-1 = never)."""
        return self._last.copy()
