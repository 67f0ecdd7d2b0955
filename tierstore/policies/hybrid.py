"""Hybrid: heat ranking, recency tie-break, and a TinyLFU-style admission filter.

Algorithm
- Every access adds to the key's exponentially decayed frequency (the heat of
  ``HeatPolicy``, same half-life options) and stamps its last-use clock.
- Eviction and promotion order: by heat; equal heat goes to recency (least
  recently used first), then key id. Equal heat is common in practice: keys
  never read, or read exactly once in the same step.
- Admission (``admit(candidate, victim)``, vectorised over arrays): the
  candidate displaces the victim only if its heat is strictly greater. A
  one-hit wonder (heat <= 1 and falling) therefore cannot push out a key that
  has been read twice within about a half-life; a key that keeps coming back
  gets in as soon as its heat passes the coldest resident's.

Where it departs from TinyLFU (Einziger et al.) and S3-FIFO (Yang et al.):
- The frequency "sketch" is exact: keys are dense and few (layers x experts,
  ~1e4), so a float64 per key is cheaper than a count-min sketch and has no
  collisions.
- Aging is continuous exponential decay (O(1) per step, see heat.py) instead
  of halving all counters every W samples.
- There is no separate LRU window or probationary FIFO: the recency tie-break
  plays the window's role for keys of equal heat, and the store's fire never
  consults ``admit`` (an uncertain token's experts must be upgraded), so
  newcomers always have a path in.
"""
from __future__ import annotations

import numpy as np

from tierstore.policies.heat import HeatPolicy


class HybridPolicy(HeatPolicy):
    name = "hybrid"

    def __init__(self, n_keys: int, capacity: int, **params):
        super().__init__(n_keys, capacity, **params)
        self._last = np.full(self.n_keys, -1, dtype=np.int64)
        self._clock = 0

    def on_access(self, keys, weights=None, now=None) -> None:
        arr = self._checked_low(keys, "on_access")
        if self.wall_clock and now is not None:
            self._advance_to(float(now) - self._t0)
        self._clock += 1
        self._add_heat(arr, weights)    # raises on a key >= n_keys before the stamp
        self._last[arr] = self._clock

    def _order(self):
        return self._raw, self._last

    def admit(self, candidate, victim):
        """True where heat(candidate) > heat(victim); scalars or equal-length arrays."""
        c = np.asarray(candidate, dtype=np.int64)
        v = np.asarray(victim, dtype=np.int64)
        out = self._raw[c] > self._raw[v]
        return bool(out) if out.ndim == 0 else out

    def last_access(self) -> np.ndarray:
        """int64 [n_keys]: clock tick of each key's last use (-1 = never)."""
        return self._last.copy()

    def native_state(self):
        """HeatPolicy's, plus the last-use ticks and their clock (kind 2)."""
        state = super().native_state()
        if state is None:
            return None
        _, _, raw, pos, resident, (_, t, base, gain, n_res, g, per), h = state
        return (2, self._last, raw, pos, resident, (self._clock, t, base, gain, n_res, g, per), h)

    def load_native_state(self, scalars) -> None:
        super().load_native_state(scalars)
        self._clock = int(scalars[0])

    def reset(self) -> None:
        super().reset()
        self._last[:] = -1
        self._clock = 0

    def check_invariants(self) -> None:
        super().check_invariants()
        assert self._last.max(initial=-1) <= self._clock, "a last-use tick is in the future"
        # A key with heat was read at least once, so it has a last-use tick.
        assert not np.any((self._raw > 0) & (self._last < 0)), "heat without an access"
