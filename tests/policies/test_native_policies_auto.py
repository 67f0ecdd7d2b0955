"""auto's one implementation (tierstore._C.AutoCore, csrc/store/src/auto_core.cpp)
against a reference written here from the algorithm's text (policies/auto.py): random
read groups with random weights and decays go through the live face's on_access and,
separately, through each expert's own face with the one fill routine
(policies/fill.py plan_fill, the call's keys blocked, hottest first when it filters).
Scores, leader and every shadow's state must match exactly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierstore import policies
from tierstore.errors import ConfigError
from tierstore.policies import auto as auto_module
from tierstore.policies.admission import PolicyFilter
from tierstore.policies.fill import plan_fill

pytest.importorskip("tierstore._C")


class ReferenceAuto:
    """The algorithm of policies/auto.py in numpy, over fresh expert faces."""

    def __init__(self, n_keys, capacity):
        self.experts = auto_module._experts(n_keys, capacity)
        self.capacity = capacity
        self.scores = np.zeros(len(self.experts))
        self.long = np.zeros(len(self.experts))  # the long window (LONG_SCORE_HALF_LIFE)
        self.d1 = 2.0 ** (-1.0 / auto_module.SCORE_HALF_LIFE)
        lhl = auto_module.LONG_SCORE_HALF_LIFE
        self.d2 = None if lhl is None else 2.0 ** (-1.0 / lhl)
        self.blocked = np.zeros(n_keys, dtype=bool)
        self.leader = 0

    def on_access(self, keys, w):
        self.blocked[keys] = True
        for i, e in enumerate(self.experts):
            r = e.is_resident(keys)
            self.scores[i] += float(np.count_nonzero(r))  # distinct hits
            self.long[i] += float(np.count_nonzero(r))
            e.on_access(keys, w)
            miss = keys[~r]
            if miss.size == 0 or self.capacity == 0:
                continue
            free = self.capacity - e.n_resident
            adm = PolicyFilter(e)
            if miss.size > free and adm.filters:
                miss = e.rank(miss)
            fill = plan_fill(e, miss, free, self.blocked, adm)
            if fill.victims.size:
                e.on_evict(fill.victims)
            if fill.keys.size:
                e.on_admit(fill.keys)
        self.blocked[keys] = False
        # The leader: the first best of the sum of the two windows' per-step hit rates
        # (the short window alone when there is no long one).
        comb = self.scores if self.d2 is None else (1.0 - self.d1) * self.scores + (1.0 - self.d2) * self.long
        self.leader = int(np.argmax(comb))

    def decay(self, steps):
        for e in self.experts:
            e.decay(steps=steps)
        self.scores *= self.d1**steps
        if self.d2 is not None:
            self.long *= self.d2**steps


def _arrays(e):
    return [getattr(e, k) for k in ("_last", "_raw", "_pos", "_raw2", "_resident") if getattr(e, k).size]


@settings(max_examples=30, deadline=None)
@given(
    n_keys=st.integers(4, 40),
    cap_frac=st.floats(0.0, 0.9),
    seed=st.integers(0, 2**31 - 1),
    n_calls=st.integers(1, 60),
    weighted=st.booleans(),
)
def test_live_auto_matches_the_reference_on_random_groups(n_keys, cap_frac, seed, n_calls, weighted):
    rng = np.random.default_rng(seed)
    capacity = int(cap_frac * n_keys)
    live = policies.make("auto", n_keys, capacity)
    ref = ReferenceAuto(n_keys, capacity)
    for _ in range(n_calls):
        keys = np.unique(rng.integers(0, n_keys, size=rng.integers(1, 8)))
        w = rng.integers(1, 5, size=keys.size).astype(np.float64) if weighted else None
        # The live face gets the keys shuffled (it sorts them, weights alongside).
        perm = rng.permutation(keys.size)
        live.on_access(keys[perm], None if w is None else w[perm])
        ref.on_access(keys, w)
        if rng.random() < 0.3:
            steps = int(rng.integers(1, 3))
            live.decay(steps=steps)
            ref.decay(steps)
    assert live.expert_scores.tolist() == ref.scores.tolist()
    assert live.leader == ref.leader
    for got, want in zip(live.experts, ref.experts):
        assert got.n_resident == want.n_resident
        for a, b in zip(_arrays(got), _arrays(want)):
            np.testing.assert_array_equal(a, b)
    live.check_invariants()


def test_repeated_keys_fold_into_one_access():
    a, b = policies.make("auto", 8, 3), policies.make("auto", 8, 3)
    a.on_access([5, 1, 5, 1, 1])  # no weights: token repeats become counts
    b.on_access([1, 5], weights=[3.0, 2.0])
    assert a.expert_scores.tolist() == b.expert_scores.tolist()
    for x, y in zip(a.experts, b.experts):
        for u, v in zip(_arrays(x), _arrays(y)):
            np.testing.assert_array_equal(u, v)
    c = policies.make("auto", 8, 3)
    c.on_access([5, 1, 5], weights=[1.0, 3.0, 1.0])  # a key given twice: weights add
    for x, y in zip(b.experts, c.experts):
        for u, v in zip(_arrays(x), _arrays(y)):
            np.testing.assert_array_equal(u, v)


def test_reset_reorders_the_shadows():
    p = policies.make("auto", 16, 4)
    for k in range(12):
        p.on_access([k, (k + 3) % 16])
    p.reset()
    ref = ReferenceAuto(16, 4)
    for k in (2, 3, 9, 2, 7, 8, 2):  # after a reset the shadows start from nothing again
        p.on_access([k])
        ref.on_access(np.array([k]), None)
    assert p.expert_scores.tolist() == ref.scores.tolist()
    for got, want in zip(p.experts, ref.experts):
        np.testing.assert_array_equal(got._resident, want._resident)


def test_bad_calls_are_config_errors():
    p = policies.make("auto", 8, 3)
    with pytest.raises(ConfigError, match="out of range"):
        p.on_access([8])
    with pytest.raises(ConfigError, match="weights for"):
        p.on_access([1, 2], weights=[1.0])
