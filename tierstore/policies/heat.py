"""Heat: exponentially decayed access frequency.

heat(k, t) = sum over accesses i of k:  w_i * 2^(-(t - t_i) / half_life)

Time is the decode-step counter (``decay(steps=1)`` per step, the default) or,
with ``half_life_s``, wall-clock seconds (``decay(now=...)``; ``now`` omitted
means ``time.monotonic()``). Decay is O(1) per step: instead of multiplying
every key's heat by 2^(-1/h) we store ``raw = heat * 2^((t - base)/h)`` and scale
new increments by 2^((t - base)/h); when that factor would grow past 2^256 the
raw array is renormalised once (O(n_keys), every 256 half-lives). ``raw`` orders
keys exactly like heat, so victim selection never materialises heat at all.

Ties (equal heat, e.g. never-seen keys) go to the lower key id. Departure from
"LFU": history is kept for non-resident keys too (the tier must rank promotion
candidates it does not hold), and nothing is ever reset on eviction.
"""
from __future__ import annotations

import math
import time

import numpy as np

from tierstore.errors import ConfigError
from tierstore.settings import HEAT_HALF_LIFE_STEPS
from tierstore.policies.dense import DensePolicy

# One default for the store and the simulator (why 256: see tierstore.settings).
DEFAULT_HALF_LIFE_STEPS = HEAT_HALF_LIFE_STEPS
_RENORM_EXPONENT = 256.0
_NO_LAST = np.empty(0, dtype=np.int64)  # native_state: heat keeps no last-use ticks
_NO_POS = np.empty(0, dtype=np.int64)   # native_state: only phase keeps group positions


class HeatPolicy(DensePolicy):
    name = "heat"

    def __init__(self, n_keys: int, capacity: int, *, half_life: float | None = None,
                 half_life_s: float | None = None, **params):
        super().__init__(n_keys, capacity, **params)
        if half_life is not None and half_life_s is not None:
            raise ConfigError(f"policy {self.name!r}: give half_life (steps) or half_life_s "
                              f"(seconds), not both ({half_life}, {half_life_s})")
        h = half_life_s if half_life_s is not None else half_life
        h = DEFAULT_HALF_LIFE_STEPS if h is None else float(h)
        if not (h > 0 and math.isfinite(h)):
            raise ConfigError(f"policy {self.name!r}: half-life must be a positive number, got {h}")
        self.half_life = h
        self.wall_clock = half_life_s is not None
        self._raw = np.zeros(self.n_keys, dtype=np.float64)
        self._t0 = time.monotonic() if self.wall_clock else 0.0
        self._t = 0.0       # time since start, in steps or seconds
        self._base = 0.0    # time of the last renormalisation
        self._gain = 1.0    # 2^((t - base) / h): weight of an access made now

    # -- time ---------------------------------------------------------------
    def _advance_to(self, t: float) -> None:
        if t <= self._t:
            return  # time never goes backwards (a stale wall-clock reading)
        self._t = t
        exponent = (t - self._base) / self.half_life
        if exponent > _RENORM_EXPONENT:
            self._raw *= 2.0 ** -exponent
            self._base, exponent = t, 0.0
        self._gain = 2.0 ** exponent

    def decay(self, now=None, steps: int = 1) -> None:
        if self.wall_clock:
            self._advance_to((time.monotonic() if now is None else float(now)) - self._t0)
        else:
            self._advance_to(self._t + steps)

    # -- events ---------------------------------------------------------------
    def on_access(self, keys, weights=None, now=None) -> None:
        arr = self._checked_low(keys, "on_access")
        if self.wall_clock and now is not None:
            self._advance_to(float(now) - self._t0)
        self._add_heat(arr, weights)

    def _add_heat(self, arr: np.ndarray, weights) -> None:
        if arr.size == 0:
            return
        if weights is None:
            inc = self._gain
        else:
            inc = np.asarray(weights, dtype=np.float64).reshape(-1) * self._gain
        try:
            np.add.at(self._raw, arr, inc)
        except IndexError:
            self._raise_out_of_range(arr, "on_access")

    # -- decisions --------------------------------------------------------------
    def _order(self):
        return self._raw, None

    def heat_of(self, keys) -> np.ndarray:
        """float64 heat of ``keys`` now."""
        return self._raw[np.asarray(keys, dtype=np.int64)] / self._gain

    def scores(self) -> np.ndarray:
        return self._raw / self._gain

    def native_state(self):
        """(kind, last, raw, pos, resident, (clock, t, base, gain, n_resident, group,
        per_tick), half_life) for the native loops (tierstore.sim.native_replay): the
        arrays are live, the native loop updates them in place. None on the wall
        clock (the native loops decay by steps only)."""
        if self.wall_clock:
            return None
        return (1, _NO_LAST, self._raw, _NO_POS, self._resident,
                (0, self._t, self._base, self._gain, self._n_resident, 0, 1), self.half_life)

    def load_native_state(self, scalars) -> None:
        """Take back the scalars a native loop returns (see ``native_state``)."""
        self._t, self._base, self._gain = (float(x) for x in scalars[1:4])
        self._n_resident = int(scalars[4])

    def reset(self) -> None:
        super().reset()
        self._raw[:] = 0.0
        self._t0 = time.monotonic() if self.wall_clock else 0.0
        self._t = self._base = 0.0
        self._gain = 1.0

    def check_invariants(self) -> None:
        super().check_invariants()
        assert np.all(self._raw >= 0.0), "negative heat"
        assert self._base <= self._t, "renormalisation base is in the future"
        assert abs(self._gain - 2.0 ** ((self._t - self._base) / self.half_life)) \
            <= 1e-9 * self._gain, "access gain out of step with the clock"
