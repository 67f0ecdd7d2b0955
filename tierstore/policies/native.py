"""The Python face of the policies whose rules are native (lru, heat, hybrid, phase).

The rules (what an access does to the state, decay, the eviction and promotion
orders, the admission filter) are written once, in C++
(csrc/store/include/tierstore/store/policy.hpp, bound as ``tierstore._C.PolicyCore``).
The live store (through these faces, one call per batch of keys) and the
simulator's native replays (``tierstore.sim.native_replay``, over the same core)
run that one code. A face holds the numpy state arrays (``_last``, ``_raw``,
``_pos``, ``_resident``; the core works on them in place), the resident count and
the wall clock, and checks keys; the core holds the clock scalars.
"""

from __future__ import annotations

import numpy as np

from tierstore.errors import TierstoreError
from tierstore.policies.dense import DensePolicy, as_keys, as_weights

NEVER = -1  # the last-use tick of a key never read
_NO_INTS = np.empty(0, dtype=np.int64)
_NO_FLOATS = np.empty(0, dtype=np.float64)


def native_module():
    """``tierstore._C``, whose rules run every policy but Belady's; TierstoreError
    when the extension is not built."""
    try:
        from tierstore import _C
    except ImportError as e:
        raise TierstoreError(
            "policies: the native extension tierstore._C is not built "
            f"(its rules run lru/heat/hybrid/phase/blend/auto): {e}"
        ) from None
    return _C


def is_native_face(policy) -> bool:
    """True for a face class that names its own native kind: its rules are the core's (a
    subclass that only overrides Python methods may behave otherwise)."""
    cls = type(policy)
    return issubclass(cls, NativePolicy) and "kind" in cls.__dict__


class NativePolicy(DensePolicy):
    """A policy whose rules run in ``tierstore._C.PolicyCore`` (``kind``: 0 lru, 1 heat,
    2 hybrid, 3 phase, 4 blend). Subclasses set ``kind`` and the class-level flags below."""

    kind = -1
    stamps = False  # keeps a last-use tick per key (lru, hybrid, phase)
    heats = False  # keeps a raw decayed heat per key (heat, hybrid, phase)
    phased = False  # keeps the group position of each key's last read (phase, blend)
    blends = False  # keeps a second, longer-lived heat per key (blend)

    def __init__(self, n_keys: int, capacity: int, **params):
        super().__init__(n_keys, capacity, **params)  # rejects unknown parameters
        n = self.n_keys
        self._last = np.full(n, NEVER, dtype=np.int64) if self.stamps else _NO_INTS
        self._raw = np.zeros(n, dtype=np.float64) if self.heats else _NO_FLOATS
        self._pos = np.zeros(n, dtype=np.int64) if self.phased else _NO_INTS
        self._raw2 = np.zeros(n, dtype=np.float64) if self.blends else _NO_FLOATS
        self._core = native_module().PolicyCore(
            self.kind,
            self._last,
            self._raw,
            self._pos,
            self._resident,
            float(self._core_half_life()),
            self._raw2,
            float(self._core_half_life2()),
        )

    def _core_half_life(self) -> float:
        """The half-life the core decays heat by (heat-like faces set theirs first)."""
        return 1.0

    def _core_half_life2(self) -> float:
        """The long heat's half-life (blend faces set theirs first)."""
        return 1.0

    # -- events -------------------------------------------------------------------
    def _access(self, keys, weights) -> None:
        arr = as_keys(keys)
        w = None if weights is None else as_weights(weights, arr.size, f"policy {self.name!r}.on_access")
        try:
            self._core.access(np.ascontiguousarray(arr), w)
        except IndexError:
            self._raise_out_of_range(arr, "on_access")

    def _touch_admitted(self, keys: np.ndarray) -> None:
        self._core.admitted(np.ascontiguousarray(keys))

    # -- decisions (the core's) ---------------------------------------------------------
    def coldest_of(self, cand, n) -> np.ndarray:
        arr = self._checked(cand, "coldest_of")
        return self._core.coldest(np.ascontiguousarray(arr), int(n))

    def victims(self, n: int, pinned=None) -> np.ndarray:
        mask = None if pinned is None else np.ascontiguousarray(pinned, dtype=bool)
        self._core.n_resident = self._n_resident
        return self._core.victims(int(n), mask)

    def rank(self, keys) -> np.ndarray:
        return self._core.rank(np.ascontiguousarray(self._checked(keys, "rank")))

    def _admit_pairs(self, candidate, victim):
        """The core's admission filter over scalars or equal-length arrays."""
        scalar = np.ndim(candidate) == 0
        c = self._checked(np.atleast_1d(candidate), "admit")
        v = self._checked(np.atleast_1d(victim), "admit")
        out = self._core.admit(np.ascontiguousarray(c), np.ascontiguousarray(v))
        return bool(out[0]) if scalar else out

    # -- native replays (tierstore.sim.native_replay) -----------------------------------
    def native_state(self):
        """The core, its resident count current, for ``tierstore._C.replay_demand`` /
        ``replay_auto`` (they update it and the arrays in place)."""
        self._core.n_resident = self._n_resident
        return self._core

    def load_native_state(self, n_resident: int | None = None) -> None:
        """Take back the resident count a native replay left (None: the core's)."""
        self._n_resident = int(self._core.n_resident if n_resident is None else n_resident)

    # -- clock scalars (the core's; read by snapshots, invariants and tests) --------------
    @property
    def _clock(self) -> int:
        return self._core.clock

    @property
    def _group(self) -> int:
        return self._core.group

    @property
    def _per_tick(self) -> int:
        return self._core.per_tick

    def reset(self) -> None:
        super().reset()
        self._last[:] = NEVER
        self._raw[:] = 0.0
        self._pos[:] = 0
        self._raw2[:] = 0.0
        core = self._core
        core.base2, core.gain2 = 0.0, 1.0
        core.clock, core.t, core.base, core.gain = 0, 0.0, 0.0, 1.0
        core.group, core.per_tick, core.n_resident = 0, 1, 0

    def check_invariants(self) -> None:
        super().check_invariants()
        if self.stamps:
            assert self._last.max(initial=NEVER) <= self._clock, "a last-use tick is in the future"
            assert self._last.min(initial=NEVER) >= NEVER, "a last-use tick is below NEVER"
        if self.phased:
            assert 0 <= self._group <= self._per_tick, "group counter beyond groups per tick"
            assert self._pos.min(initial=0) >= 0 and self._pos.max(initial=0) < self._per_tick, (
                "group position out of range"
            )
