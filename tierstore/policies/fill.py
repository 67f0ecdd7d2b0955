"""The one fill routine: which candidates get a slot, over which victims.

``plan_fill`` is the decision every tier and every model makes when keys want in:
the live store's slot reservation (``store.slots.SlotStates.take``: fires,
promotions, preheat), its lazy promotions (``store.fire.lazy_candidates``), and
the simulator's demand fill, reference manager and prefetch
(``tierstore.sim``). It only decides; the caller moves the bytes (or, in the
simulator, flips its resident mask) and then tells the policy
``on_evict(victims)`` / ``on_admit(keys)``.

Rule, for ``cand`` (unique, not resident, in the order they should win slots):
the first ``n_free`` take free slots; the rest ask the policy for as many victims
among the unblocked resident keys (coldest first) and pair up in order; a
candidate left without a victim, or whose pair ``admission`` rejects, is
rejected (it is read for this use only, or not promoted at all).
"""

from __future__ import annotations

import numpy as np

from tierstore.policies.admission import ADMIT_ALL, Admission, HotterThanVictim, PolicyFilter
from tierstore.policies.base import Policy

_EMPTY = np.empty(0, dtype=np.int64)


class Fill:
    """``keys`` get slots (free ones first, then those of ``victims``, which pair
    with ``keys[n_free:]`` in order); ``rejected`` candidates got nothing."""

    __slots__ = ("keys", "victims", "n_free", "rejected")

    def __init__(self, keys, victims, n_free, rejected):
        self.keys, self.victims, self.n_free, self.rejected = keys, victims, n_free, rejected


def plan_fill(
    policy: Policy,
    cand: np.ndarray,
    n_free: int,
    blocked: np.ndarray | None = None,
    admission: Admission = ADMIT_ALL,
    evict: bool = True,
) -> Fill:
    """Decide the fill of ``cand`` (see module doc). ``blocked``: boolean [n_keys]
    mask of keys that may not be victims (pins, the group being read), or None.
    ``evict=False``: free slots only. Calls ``policy.victims`` only; never
    changes the policy."""
    n = len(cand)
    n_free = max(int(n_free), 0)
    if n <= n_free:
        return Fill(cand, _EMPTY, n, 0)
    if not evict:
        return Fill(cand[:n_free], _EMPTY, n_free, n - n_free)
    victims = np.asarray(policy.victims(n - n_free, blocked), dtype=np.int64)
    contenders = cand[n_free : n_free + len(victims)]
    rejected = n - n_free - len(victims)
    if admission.filters and len(victims):
        ok = admission.admit(contenders, victims)
        rejected += int(len(ok) - np.count_nonzero(ok))
        if not ok.all():
            victims, contenders = victims[ok], contenders[ok]
    keys = np.concatenate((cand[:n_free], contenders)) if n_free else contenders
    return Fill(keys, victims, min(n_free, n), rejected)


def plan_lazy(
    policy: Policy, cand: np.ndarray, cap: int, n_free: int, blocked: np.ndarray | None, admission: Admission
) -> Fill:
    """A lazy (background) promotion pass: ``cand`` ranked hottest first by
    ``policy``, at most ``cap`` of them, each over a victim only when
    ``admission`` agrees (the store's step() with HotterThanVictim; the
    simulator's model of it and of the reference manager). For a native policy
    under its own filter or HotterThanVictim of itself the core decides
    (policy.hpp policy_plan_lazy: the code the simulator's native replays run);
    :func:`plan_lazy_python` is the same rule spelled here, for every other pair."""
    if len(cand) == 0 or cap <= 0:
        return Fill(_EMPTY, _EMPTY, 0, 0)
    hotter = _native_admission(policy, admission)
    if hotter is None:
        return plan_lazy_python(policy, cand, cap, n_free, blocked, admission)
    n_free = max(int(n_free), 0)
    policy._core.n_resident = policy.n_resident
    keys, victims, rejected = policy._core.plan_lazy(
        np.ascontiguousarray(policy._checked(cand, "plan_lazy")),
        int(cap),
        n_free,
        None if blocked is None else np.ascontiguousarray(blocked, dtype=bool),
        hotter,
    )
    return Fill(keys, victims, min(n_free, len(keys)), int(rejected))


def plan_lazy_python(
    policy: Policy, cand: np.ndarray, cap: int, n_free: int, blocked: np.ndarray | None, admission: Admission
) -> Fill:
    """plan_lazy's rule through the policy's Python methods (any policy, any admission;
    the tests' oracle for the core's)."""
    if len(cand) == 0 or cap <= 0:
        return Fill(_EMPTY, _EMPTY, 0, 0)
    cand = policy.rank(cand)[: int(cap)]
    return plan_fill(policy, cand, n_free, blocked, admission)


def _native_admission(policy: Policy, admission: Admission) -> bool | None:
    """The core's ``hotter`` flag when it decides exactly what plan_lazy_python would:
    a native face of its own kind, under its own filter or HotterThanVictim of itself."""
    from tierstore.policies.native import is_native_face

    if not is_native_face(policy) or getattr(admission, "policy", None) is not policy:
        return None
    if type(admission) is HotterThanVictim:
        return True
    return False if type(admission) is PolicyFilter else None
