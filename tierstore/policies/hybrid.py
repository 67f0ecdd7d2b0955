"""Hybrid: heat ranking, recency tie-break, and a TinyLFU-style admission filter.

Algorithm (the rules run natively, policies/native.py)
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
    kind = 2
    stamps = True

    def admit(self, candidate, victim):
        """True where heat(candidate) > heat(victim); scalars or equal-length arrays."""
        return self._admit_pairs(candidate, victim)

    def last_access(self) -> np.ndarray:
        """int64 [n_keys]: clock tick of each key's last use (-1 = never)."""
        return self._last.copy()

    def check_invariants(self) -> None:
        super().check_invariants()
        # A key with heat was read at least once, so it has a last-use tick.
        assert not np.any((self._raw > 0) & (self._last < 0)), "heat without an access"
