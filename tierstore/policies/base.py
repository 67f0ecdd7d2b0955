"""The one small interface every replacement policy implements.

A policy decides *which* key to evict and how to rank keys for promotion; it
knows nothing of I/O, memory or threads (the tier that owns it holds the lock).
The same classes run in the live store (one instance per tier, chosen
explicitly) and in the trace simulator (``tierstore.sim``).

Keys are dense ids ``layer * n_experts + expert`` (int64 numpy arrays). All
methods are vectorised over arrays of keys: no Python loop per key on the
forward path. Time is a logical step counter by default (``decay(steps=1)`` at
the end of each decode step); a policy built with ``half_life_s`` decays by wall
clock seconds passed as ``now`` instead.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

NO_KEY = -1  # sentinel: "no victim available"


class Policy(ABC):
    """Tracks the resident set of one tier and ranks keys.

    Thread safety: none; the owning tier serialises calls.
    """

    name: str = "base"

    def __init__(self, n_keys: int, capacity: int, **params):
        self.n_keys = int(n_keys)
        self.capacity = int(capacity)

    # -- events -----------------------------------------------------------
    @abstractmethod
    def on_access(
        self, keys: np.ndarray, weights: np.ndarray | None = None, now: float | None = None
    ) -> None:
        """Keys were read by the forward pass (repeats allowed: one per token).
        ``weights`` (same length, float) scales each access, default 1."""

    @abstractmethod
    def on_admit(self, keys: np.ndarray) -> None:
        """Keys became resident in this tier (after their bytes landed)."""

    @abstractmethod
    def on_evict(self, keys: np.ndarray) -> None:
        """Keys left this tier."""

    # -- decisions --------------------------------------------------------
    @abstractmethod
    def victims(self, n: int, pinned: np.ndarray | None = None) -> np.ndarray:
        """Up to ``n`` resident keys to evict, coldest first, never one whose
        id is set in the boolean mask ``pinned`` [n_keys]. Fewer (possibly
        none) when not enough unpinned keys are resident; never raises."""

    @abstractmethod
    def rank(self, keys: np.ndarray) -> np.ndarray:
        """``keys`` reordered hottest first (promotion order)."""

    def admit(self, candidate, victim):
        """Admission filter: should ``candidate`` displace ``victim``?
        Scalars give a bool; equal-length int arrays give a bool array (one
        answer per pair). Default admits everything; the hybrid policy filters
        one-hit wonders. Never consulted inside a fire (no admission control
        there)."""
        if np.ndim(candidate) == 0:
            return True
        return np.ones(np.shape(candidate), dtype=bool)

    @abstractmethod
    def decay(self, now: float | None = None, steps: int = 1) -> None:
        """Advance time by ``steps`` decode steps (or to wall time ``now``)."""

    @abstractmethod
    def scores(self) -> np.ndarray:
        """float64 [n_keys] heat/recency scores, larger = hotter (snapshots)."""

    @abstractmethod
    def resident(self) -> np.ndarray:
        """int64 array of resident keys (any order)."""

    @abstractmethod
    def reset(self) -> None:
        """Forget all history and residency."""

    @abstractmethod
    def check_invariants(self) -> None:
        """Raise AssertionError if internal bookkeeping is inconsistent."""
