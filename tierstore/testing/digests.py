"""Digests of a replay's results and a policy's state: the one way the golden tests
(tests/policies/test_native_policies_golden.py, tests/sim/test_prefetch_native.py) tell that a
change to a replay loop left its results bit for bit alike."""

from __future__ import annotations

import hashlib

import numpy as np

STATE_ARRAYS = ("_last", "_raw", "_pos", "_resident", "_raw2")


def digest(*arrays) -> str:
    """16 hex digits of sha256 over the arrays' bytes, in order."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def policy_state(policy, names=STATE_ARRAYS) -> list:
    """The arrays that hold ``policy``'s state (the non-empty ones of ``names``); for auto,
    its scores and leader, then every shadow's, in order."""
    if hasattr(policy, "experts"):
        out = [policy.expert_scores, np.array([policy.leader])]
        for shadow in policy.experts:
            out += policy_state(shadow, names)
        return out
    return [getattr(policy, k) for k in names if getattr(policy, k, np.empty(0)).size]
