"""Heat: exponentially decayed access frequency.

heat(k, t) = sum over accesses i of k:  w_i * 2^(-(t - t_i) / half_life)

Time is the decode-step counter (``decay(steps=1)`` per step, the default) or,
with ``half_life_s``, wall-clock seconds (``decay(now=...)``; ``now`` omitted
means ``time.monotonic()``). Decay is O(1) per step: instead of multiplying
every key's heat by 2^(-1/h) we store ``raw = heat * 2^((t - base)/h)`` and scale
new increments by 2^((t - base)/h); when that factor would grow past 2^256 the
raw array is renormalised once (O(n_keys), every 256 half-lives). ``raw`` orders
keys exactly like heat, so victim selection never materialises heat at all.
The rules run natively (policies/native.py); this face keeps the wall clock.

Ties (equal heat, e.g. never-seen keys) go to the lower key id. Departure from
"LFU": history is kept for non-resident keys too (the tier must rank promotion
candidates it does not hold), and nothing is ever reset on eviction.
"""

from __future__ import annotations

import math
import time

import numpy as np

from tierstore.errors import ConfigError
from tierstore.policies.native import NativePolicy
from tierstore.settings import HEAT_HALF_LIFE_STEPS

# One default for the store and the simulator (why 256: see tierstore.settings).
DEFAULT_HALF_LIFE_STEPS = HEAT_HALF_LIFE_STEPS


def half_life_of(name: str, half_life, half_life_s) -> tuple[float, bool]:
    """(half-life, on the wall clock) from a heat-like policy's parameters."""
    if half_life is not None and half_life_s is not None:
        raise ConfigError(
            f"policy {name!r}: give half_life (steps) or half_life_s "
            f"(seconds), not both ({half_life}, {half_life_s})"
        )
    h = half_life_s if half_life_s is not None else half_life
    h = DEFAULT_HALF_LIFE_STEPS if h is None else float(h)
    if not (h > 0 and math.isfinite(h)):
        raise ConfigError(f"policy {name!r}: half-life must be a positive number, got {h}")
    return h, half_life_s is not None


class HeatPolicy(NativePolicy):
    name = "heat"
    kind = 1
    heats = True

    def __init__(
        self,
        n_keys: int,
        capacity: int,
        *,
        half_life: float | None = None,
        half_life_s: float | None = None,
        **params,
    ):
        self.half_life, self.wall_clock = half_life_of(self.name, half_life, half_life_s)
        super().__init__(n_keys, capacity, **params)
        self._t0 = time.monotonic() if self.wall_clock else 0.0

    def _core_half_life(self) -> float:
        return self.half_life

    def decay(self, now=None, steps: int = 1) -> None:
        if self.wall_clock:
            self._core.decay_to((time.monotonic() if now is None else float(now)) - self._t0)
        else:
            self._core.decay(int(steps))

    def on_access(self, keys, weights=None, now=None) -> None:
        if self.wall_clock and now is not None:
            self._core.advance_to(float(now) - self._t0)
        self._access(keys, weights)

    def heat_of(self, keys) -> np.ndarray:
        """float64 heat of ``keys`` now."""
        return self._raw[np.asarray(keys, dtype=np.int64)] / self._core.gain

    def scores(self) -> np.ndarray:
        return self._raw / self._core.gain

    def native_state(self):
        """The core (NativePolicy.native_state); None on the wall clock (the native
        replays decay by steps only)."""
        return None if self.wall_clock else super().native_state()

    # Clock scalars (the core's).
    @property
    def _t(self) -> float:
        return self._core.t

    @property
    def _base(self) -> float:
        return self._core.base

    @property
    def _gain(self) -> float:
        return self._core.gain

    def reset(self) -> None:
        super().reset()
        self._t0 = time.monotonic() if self.wall_clock else 0.0

    def check_invariants(self) -> None:
        super().check_invariants()
        assert np.all(self._raw >= 0.0), "negative heat"
        assert self._base <= self._t, "renormalisation base is in the future"
        assert abs(self._gain - 2.0 ** ((self._t - self._base) / self.half_life)) <= 1e-9 * self._gain, (
            "access gain out of step with the clock"
        )
