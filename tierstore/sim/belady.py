"""Belady's MIN as a Policy, in two forms: forced admission (every miss is
cached: the ceiling of plain demand fill and of the store's fire) and "may
skip" (a miss whose next use is farther than every victim's is read for this
use only: the ceiling of any policy with an admission filter, and of every
policy in the bandwidth view, since fetching early never needs fewer reads)."""

from __future__ import annotations

import numpy as np

from tierstore.policies.dense import DensePolicy
from tierstore.sim.counting import NEVER


class BeladyPolicy(DensePolicy):
    """MIN: the simulator feeds each tick's distinct keys in ``Prepared`` order,
    and the policy reads their next-use times from the oracle array by position.
    Victims: farthest next use first."""

    name = "belady"

    def __init__(self, n_keys: int, capacity: int, *, next_use: np.ndarray):
        super().__init__(n_keys, capacity)
        self._oracle = next_use
        self._cursor = 0
        self._next = np.full(self.n_keys, NEVER, dtype=np.int64)
        self._neg = np.zeros(self.n_keys, dtype=np.int64)  # -next use: larger = hotter

    def on_access(self, keys, weights=None, now=None) -> None:
        arr = np.asarray(keys, dtype=np.int64)
        nu = self._oracle[self._cursor : self._cursor + arr.size]
        self._cursor += arr.size
        self._next[arr] = nu
        self._neg[arr] = -nu

    def _order(self):
        return self._neg, None

    def replay_state(self, oracle: np.ndarray):
        """(next uses, resident mask) for the native replay to update in place
        (``tierstore._C.replay_min``), or None unless this policy is fresh and reads
        ``oracle``; ``load_replayed`` must follow it."""
        if self._cursor or self.n_resident or self._oracle is not oracle:
            return None
        return self._next, self._resident

    def load_replayed(self, keys: np.ndarray) -> None:
        """After the native replay of the whole oracle (read order ``keys``): the rest
        of the state from it (a key never read keeps on_access's untouched 0)."""
        read = np.zeros(self.n_keys, dtype=bool)
        read[keys] = True
        self._neg[:] = np.where(read, -self._next, 0)
        self._cursor = int(self._oracle.size)
        self._n_resident = int(np.count_nonzero(self._resident))

    def rank(self, keys) -> np.ndarray:
        arr = np.asarray(keys, dtype=np.int64)
        return arr[np.argsort(self._next[arr], kind="stable")]

    def decay(self, now=None, steps: int = 1) -> None:
        pass

    def scores(self) -> np.ndarray:
        return -self._next.astype(np.float64) / float(NEVER)

    def reset(self) -> None:
        super().reset()
        self._cursor = 0
        self._next[:] = NEVER
        self._neg[:] = 0


class BeladySkipPolicy(BeladyPolicy):
    """MIN that may skip: a candidate displaces its victim only when it is used
    again sooner (Belady with bypass, optimal when a miss need not be cached)."""

    name = "belady_skip"

    def admit(self, candidate, victim):
        out = (
            self._next[np.asarray(candidate, dtype=np.int64)] < self._next[np.asarray(victim, dtype=np.int64)]
        )
        return bool(out) if np.ndim(out) == 0 else out
