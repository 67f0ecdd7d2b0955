"""Shared bookkeeping for policies over dense keys: the resident mask, key
checks, and exact "coldest first" / "hottest first" orderings.

Orderings are by a primary score, then a secondary score (ties), then key id,
so every policy is deterministic, and all of it is vectorised: selecting ``n``
victims out of ``R`` resident keys is one ``argpartition`` (O(R)) plus a sort of
the ``n`` chosen (and any keys tied with the n-th).
"""

from __future__ import annotations

import numpy as np

from tierstore.errors import ConfigError
from tierstore.policies.base import Policy

_EMPTY = np.empty(0, dtype=np.int64)


def as_keys(keys) -> np.ndarray:
    """``keys`` as a flat int64 array (no copy when it already is one)."""
    arr = np.asarray(keys)
    if arr.dtype != np.int64:
        arr = arr.astype(np.int64)
    return arr.reshape(-1)


def as_weights(weights, n: int, where: str) -> np.ndarray:
    """``weights`` as a flat contiguous float64 array of ``n`` (one per key), each finite
    and >= 0 (a use adds heat; a negative or NaN weight would turn a heat negative and
    void the orders' bounds); ConfigError naming ``where`` otherwise."""
    w = np.ascontiguousarray(weights, dtype=np.float64).reshape(-1)
    if w.size != n:
        raise ConfigError(f"{where}: {w.size} weights for {n} keys")
    if w.size and not (np.isfinite(w).all() and w.min() >= 0.0):
        bad = w[~(np.isfinite(w) & (w >= 0.0))][0]
        raise ConfigError(f"{where}: weight {bad!r} is not a finite number >= 0")
    return w


def coldest(cand: np.ndarray, primary: np.ndarray, secondary: np.ndarray | None, n: int) -> np.ndarray:
    """The ``n`` keys of ``cand`` with the smallest (primary, secondary, key)."""
    if n <= 0 or cand.size == 0:
        return _EMPTY
    p = primary[cand]
    if n < cand.size:
        # Keep everything tied with the n-th value so the tie-break stays exact.
        threshold = np.partition(p, n - 1)[n - 1]
        keep = p <= threshold
        cand, p = cand[keep], p[keep]
    order = np.lexsort((cand, p)) if secondary is None else np.lexsort((cand, secondary[cand], p))
    return cand[order[:n]]


def hottest_order(keys: np.ndarray, primary: np.ndarray, secondary: np.ndarray | None) -> np.ndarray:
    """``keys`` reordered by descending (primary, secondary); stable on ties."""
    if keys.size <= 1:
        return keys.copy()
    order = (
        np.lexsort((-primary[keys],)) if secondary is None else np.lexsort((-secondary[keys], -primary[keys]))
    )
    return keys[order]


class DensePolicy(Policy):
    """A policy whose resident set is a boolean mask over ``n_keys`` ids."""

    def __init__(self, n_keys: int, capacity: int, **params):
        if params:
            raise ConfigError(f"policy {self.name!r}: unknown parameter(s) {', '.join(sorted(params))}")
        if int(n_keys) <= 0:
            raise ConfigError(f"policy {self.name!r}: n_keys must be > 0, got {n_keys}")
        if int(capacity) < 0:
            raise ConfigError(f"policy {self.name!r}: capacity must be >= 0, got {capacity}")
        super().__init__(n_keys, capacity)
        self._n_keys_u64 = np.uint64(self.n_keys)
        self._resident = np.zeros(self.n_keys, dtype=bool)
        self._n_resident = 0

    # -- helpers for subclasses -------------------------------------------
    def _checked(self, keys, what: str) -> np.ndarray:
        arr = as_keys(keys)
        # One comparison catches both ends: a negative key viewed as uint64 is huge.
        if arr.size and np.count_nonzero(arr.view(np.uint64) >= self._n_keys_u64):
            self._raise_out_of_range(arr, what)
        return arr

    def _raise_out_of_range(self, arr: np.ndarray, what: str):
        bad = arr[(arr < 0) | (arr >= self.n_keys)][0]
        raise ConfigError(f"policy {self.name!r}.{what}: key {int(bad)} out of range [0, {self.n_keys})")

    def _candidates(self, pinned: np.ndarray | None) -> np.ndarray:
        if pinned is None:
            return np.flatnonzero(self._resident)
        return np.flatnonzero(self._resident & ~np.asarray(pinned, dtype=bool))

    # -- orderings ---------------------------------------------------------
    def _order(self) -> tuple[np.ndarray, np.ndarray | None]:
        """(primary, secondary) arrays [n_keys], larger = hotter; secondary breaks ties."""
        raise NotImplementedError

    def coldest_of(self, cand: np.ndarray, n: int) -> np.ndarray:
        """The ``n`` coldest of ``cand`` by this policy's order, coldest first (any
        keys, resident here or not: the self-tuning policy orders its real resident
        set by a shadow's order)."""
        primary, secondary = self._order()
        return coldest(cand, primary, secondary, int(n))

    def victims(self, n: int, pinned=None) -> np.ndarray:
        return self.coldest_of(self._candidates(pinned), n)

    def rank(self, keys) -> np.ndarray:
        primary, secondary = self._order()
        return hottest_order(self._checked(keys, "rank"), primary, secondary)

    # -- residency --------------------------------------------------------
    def on_admit(self, keys) -> None:
        arr = self._checked(keys, "on_admit")
        self._resident[arr] = True
        self._n_resident = int(np.count_nonzero(self._resident))
        self._touch_admitted(arr)

    def on_evict(self, keys) -> None:
        arr = self._checked(keys, "on_evict")
        self._resident[arr] = False
        self._n_resident = int(np.count_nonzero(self._resident))

    def _touch_admitted(self, keys: np.ndarray) -> None:
        """Hook: what admission does to the scores (default nothing)."""

    def resident(self) -> np.ndarray:
        return np.flatnonzero(self._resident)

    def is_resident(self, keys) -> np.ndarray:
        """Boolean mask, one per key: resident in this tier now."""
        return self._resident[as_keys(keys)]

    @property
    def n_resident(self) -> int:
        return self._n_resident

    def reset(self) -> None:
        self._resident[:] = False
        self._n_resident = 0

    def check_invariants(self) -> None:
        assert self._resident.shape == (self.n_keys,), "resident mask has the wrong shape"
        assert self._n_resident == int(np.count_nonzero(self._resident)), (
            f"resident count {self._n_resident} != mask {int(np.count_nonzero(self._resident))}"
        )
        assert self._n_resident <= self.capacity, (
            f"{self._n_resident} keys resident, capacity {self.capacity}"
        )
        s = self.scores()
        assert s.shape == (self.n_keys,) and s.dtype == np.float64, "scores() shape/dtype"
        assert np.all(np.isfinite(s)), "scores() has non-finite entries"
