"""Phase: hybrid (decayed frequency + admit-if-hotter) whose victims are the keys
with the latest *expected next use*, counting where in the tick each key is read.

A decode tick reads the layers in order, one ``on_access`` group each (the
simulator's per-group calls; the live store folds once per step, so there every
key has phase 0 and this reduces to hybrid). For key ``k`` last read at group
``pos[k]`` of a tick, while group ``c`` is being filled (``c`` = groups seen so
far this tick, minus one), its next chance to be read is ``off = (pos[k] - c) mod
L`` groups away (``L`` = groups per tick, the largest count seen; ``off = L`` for
``pos[k] == c``), and at a per-tick use rate ``lam = heat * (1 - 2^(-1/h))`` it is
expected ``1/lam - 1`` ticks later still. Order (larger = hotter):

    primary[k] = -(off[k] / L + 1 / max(lam[k], 1e-12))

so among equally popular keys, those of layers still to come this tick are kept
over those just read (a stationary estimate of Belady's next-use distance).
Admission is hybrid's (heat of candidate > heat of victim). State: hybrid's
arrays plus ``pos`` (int64 [n_keys]), the group counter ``c`` and ``L``.
"""
from __future__ import annotations

import numpy as np

from tierstore.policies.hybrid import HybridPolicy


class PhasePolicy(HybridPolicy):
    name = "phase"
    groups_accesses = False  # the phase is the group index: one on_access per group

    def __init__(self, n_keys: int, capacity: int, **params):
        super().__init__(n_keys, capacity, **params)
        self._pos = np.zeros(self.n_keys, dtype=np.int64)
        self._group = 0      # groups seen this tick
        self._per_tick = 1   # L: most groups seen in one tick

    def on_access(self, keys, weights=None, now=None) -> None:
        super().on_access(keys, weights, now)
        arr = np.asarray(keys, dtype=np.int64).reshape(-1)
        self._pos[arr] = self._group
        self._group += 1
        if self._group > self._per_tick:
            self._per_tick = self._group

    def decay(self, now=None, steps: int = 1) -> None:
        super().decay(now=now, steps=steps)
        self._group = 0

    def _order(self):
        L = self._per_tick
        c = max(self._group - 1, 0)
        off = np.mod(self._pos - c, L)
        off[off == 0] = L
        lam = self._raw * ((1.0 - 2.0 ** (-1.0 / self.half_life)) / self._gain)
        return -(off / L + 1.0 / np.maximum(lam, 1e-12)), self._last

    def native_state(self):
        """HybridPolicy's, plus the group positions and the tick's progress (kind 3)."""
        state = super().native_state()
        if state is None:
            return None
        _, last, raw, _, resident, (clock, t, base, gain, n_res, _, _), h = state
        return (3, last, raw, self._pos, resident,
                (clock, t, base, gain, n_res, self._group, self._per_tick), h)

    def load_native_state(self, scalars) -> None:
        super().load_native_state(scalars)
        self._group, self._per_tick = int(scalars[5]), int(scalars[6])

    def reset(self) -> None:
        super().reset()
        self._pos[:] = 0
        self._group = 0
        self._per_tick = 1
