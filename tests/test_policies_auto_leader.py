"""auto's leader choice (AutoCore::choose_leader): the short score window alone, or with a
second, longer window whose per-step hit rate is added (tierstore/policies/auto.py
LONG_SCORE_HALF_LIFE). Checked against a Python recomputation from the scores the core
publishes, after every access of random traces."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

import tierstore.policies.auto as auto_mod
from tierstore import policies


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), cap=st.integers(1, 8), long_on=st.booleans())
def test_leader_is_the_first_best_of_the_two_windows(seed, cap, long_on):
    old = auto_mod.SCORE_HALF_LIFE, auto_mod.LONG_SCORE_HALF_LIFE
    auto_mod.SCORE_HALF_LIFE, auto_mod.LONG_SCORE_HALF_LIFE = (8.0, 64.0) if long_on else old
    try:
        p = policies.make("auto", 24, cap)
    finally:
        auto_mod.SCORE_HALF_LIFE, auto_mod.LONG_SCORE_HALF_LIFE = old
    d1 = 2.0 ** (-1.0 / (8.0 if long_on else old[0]))
    d2 = 2.0 ** (-1.0 / 64.0)
    rng = np.random.default_rng(seed)
    long = np.zeros(len(p.expert_scores))
    switches = 0
    for _ in range(150):
        if rng.random() < 0.3:  # a tick end: the long window decays as the core's does
            steps = int(rng.integers(1, 3))
            p.decay(steps=steps)
            long *= d2 ** steps
            continue
        keys = np.unique(rng.integers(0, 24, size=int(rng.integers(1, 6))))
        before, lead = p.expert_scores.copy(), p.leader
        p.on_access(keys)
        long += p.expert_scores - before  # an access adds each shadow's hits, no decay
        comb = ((1.0 - d1) * p.expert_scores + (1.0 - d2) * long) if long_on else p.expert_scores
        best = int(np.argmax(comb))
        # ties to the lower index: np.argmax's; a rounding-level near-tie may go either way
        assert p.leader == best or np.isclose(comb[p.leader], comb[best], rtol=1e-12)
        switches += p.leader != lead
    p.check_invariants()


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), cap=st.integers(1, 8))
def test_meta_leader_follows_the_window_whose_leader_hit_more(seed, cap):
    # META_LEADER: each window's own leader (chosen before a read) is credited that read's
    # hits, decayed over the long window; the window with more credit leads (ties: long).
    old = auto_mod.SCORE_HALF_LIFE, auto_mod.LONG_SCORE_HALF_LIFE, auto_mod.META_LEADER
    auto_mod.SCORE_HALF_LIFE, auto_mod.LONG_SCORE_HALF_LIFE, auto_mod.META_LEADER = 8.0, 64.0, True
    try:
        p = policies.make("auto", 24, cap)
    finally:
        auto_mod.SCORE_HALF_LIFE, auto_mod.LONG_SCORE_HALF_LIFE, auto_mod.META_LEADER = old
    d2 = 2.0 ** (-1.0 / 64.0)
    rng = np.random.default_rng(seed)
    long = np.zeros(len(p.expert_scores))
    ms = ml = 0.0
    ls = ll = 0
    for _ in range(150):
        if rng.random() < 0.3:
            steps = int(rng.integers(1, 3))
            p.decay(steps=steps)
            long *= d2 ** steps
            ms *= d2 ** steps
            ml *= d2 ** steps
            continue
        keys = np.unique(rng.integers(0, 24, size=int(rng.integers(1, 6))))
        before = p.expert_scores.copy()
        p.on_access(keys)
        hits = p.expert_scores - before
        long += hits
        ms += hits[ls]
        ml += hits[ll]
        ls, ll = int(np.argmax(p.expert_scores)), int(np.argmax(long))
        want = ls if ms > ml else ll
        close = np.isclose(ms, ml, rtol=1e-12) or np.isclose(
            p.expert_scores[p.leader], p.expert_scores[ls], rtol=1e-12) or np.isclose(
            long[p.leader], long[ll], rtol=1e-12)
        assert p.leader == want or close
    p.check_invariants()


def test_meta_leader_needs_a_long_window():
    import pytest
    old = auto_mod.META_LEADER
    auto_mod.META_LEADER = True
    try:
        with pytest.raises(ValueError, match="meta needs a long window"):
            policies.make("auto", 24, 4)
    finally:
        auto_mod.META_LEADER = old
