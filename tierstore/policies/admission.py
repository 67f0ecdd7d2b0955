"""Admission: should a candidate key displace the victim the policy chose?

One object per rule, each ``admit(candidates, victims) -> bool mask`` over
equal-length int64 arrays (Caffeine's ``Admittor``: the eviction policy names
the victim, a separate admission rule decides whether the newcomer is worth it).
Every fill path (the simulator's demand fill, the store's lazy promotions, the
reference manager's model) asks one of these through ``tierstore.policies.fill``,
so "candidate hotter than the victim" is written once, here.

- ``ADMIT_ALL``: every candidate gets in (a fire, plain demand fill).
- ``PolicyFilter(policy)``: the policy's own filter (``Policy.admit``; default
  admits everything, ``hybrid`` admits only a candidate hotter than its victim).
- ``HotterThanVictim(policy)``: the candidate's score must be strictly above the
  victim's (``policy.scores()``), and the policy's own filter must agree.
"""

from __future__ import annotations

import numpy as np

from tierstore.policies.base import Policy


class Admission:
    """Base: admits everything."""

    def admit(self, candidates: np.ndarray, victims: np.ndarray) -> np.ndarray:
        return np.ones(len(candidates), dtype=bool)

    @property
    def filters(self) -> bool:
        """False when ``admit`` is always all-True (the fill then skips ranking)."""
        return False


ADMIT_ALL = Admission()


def filters_misses(policy: Policy) -> bool:
    """True when ``policy`` overrides ``Policy.admit`` (it may turn a miss away)."""
    return type(policy).admit is not Policy.admit


class PolicyFilter(Admission):
    """The policy's own ``admit`` (vectorised over the pairs)."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self._filters = filters_misses(policy)

    @property
    def filters(self) -> bool:
        return self._filters

    def admit(self, candidates, victims) -> np.ndarray:
        if not self._filters:
            return np.ones(len(candidates), dtype=bool)
        return np.asarray(self.policy.admit(candidates, victims), dtype=bool).reshape(-1)


class HotterThanVictim(PolicyFilter):
    """Strictly hotter than the victim by ``policy.scores()``, and the policy's filter."""

    @property
    def filters(self) -> bool:
        return True

    def admit(self, candidates, victims) -> np.ndarray:
        if len(candidates) == 0:
            return np.zeros(0, dtype=bool)
        s = self.policy.scores()
        ok = s[candidates] > s[victims]
        if self._filters and ok.any():
            ok[ok] = super().admit(candidates[ok], victims[ok])
        return ok


def for_policy(policy: Policy) -> Admission:
    """The demand-fill rule of ``policy``: its own filter, or ADMIT_ALL."""
    return PolicyFilter(policy) if filters_misses(policy) else ADMIT_ALL
