"""auto's leader choice (AutoCore::choose_leader): the short score window alone, or with a
second, longer window whose per-step hit rate is added (tierstore/policies/auto.py
LONG_SCORE_HALF_LIFE). Checked against a Python recomputation from the scores the core
publishes, after every access of random traces."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tierstore.policies.auto as auto_mod
from tierstore import policies


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), cap=st.integers(1, 8), long_on=st.booleans())
def test_leader_is_the_first_best_of_the_two_windows(seed, cap, long_on):
    old = auto_mod.SCORE_HALF_LIFE, auto_mod.LONG_SCORE_HALF_LIFE
    auto_mod.SCORE_HALF_LIFE, auto_mod.LONG_SCORE_HALF_LIFE = (8.0, 64.0) if long_on else (128.0, None)
    try:
        p = policies.make("auto", 24, cap)
    finally:
        auto_mod.SCORE_HALF_LIFE, auto_mod.LONG_SCORE_HALF_LIFE = old
    d1 = 2.0 ** (-1.0 / (8.0 if long_on else 128.0))
    d2 = 2.0 ** (-1.0 / 64.0)
    rng = np.random.default_rng(seed)
    long = np.zeros(len(p.expert_scores))
    switches = 0
    for _ in range(150):
        if rng.random() < 0.3:  # a tick end: the long window decays as the core's does
            steps = int(rng.integers(1, 3))
            p.decay(steps=steps)
            long *= d2**steps
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
            long *= d2**steps
            ms *= d2**steps
            ml *= d2**steps
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
        close = (
            np.isclose(ms, ml, rtol=1e-12)
            or np.isclose(p.expert_scores[p.leader], p.expert_scores[ls], rtol=1e-12)
            or np.isclose(long[p.leader], long[ll], rtol=1e-12)
        )
        assert p.leader == want or close
    p.check_invariants()


def test_meta_leader_needs_a_long_window():
    import pytest

    old = auto_mod.META_LEADER
    auto_mod.META_LEADER = True
    try:
        with pytest.raises(ValueError, match="meta needs a long window"):
            policies.make("auto", 24, 4, prefetching=True)  # its one window
    finally:
        auto_mod.META_LEADER = old


def test_prefetching_picks_the_one_slow_window():
    plain, beside = policies.make("auto", 24, 4), policies.make("auto", 24, 4, prefetching=True)
    assert (plain.score_half_life, plain.long_score_half_life) == (
        auto_mod.SCORE_HALF_LIFE,
        auto_mod.LONG_SCORE_HALF_LIFE,
    )
    assert (beside.score_half_life, beside.long_score_half_life) == (
        auto_mod.PREFETCH_SCORE_HALF_LIFE,
        auto_mod.PREFETCH_LONG_SCORE_HALF_LIFE,
    )
    # The same reads, two leaders: the windows decide (a burst on expert 1's side moves the
    # short-window leader first). Checked on a trace where they differ.
    rng = np.random.default_rng(3)
    leads = set()
    for _ in range(400):
        keys = np.unique(rng.integers(0, 24, size=4))
        plain.on_access(keys)
        beside.on_access(keys)
        leads.add((plain.leader, beside.leader))
        if rng.random() < 0.25:
            plain.decay()
            beside.decay()
    assert any(a != b for a, b in leads)


def test_prefetching_must_be_a_bool():
    from tierstore.errors import ConfigError

    with pytest.raises(ConfigError, match="prefetching must be true or false"):
        policies.make("auto", 24, 4, prefetching="yes")
    # a policy that does not tune itself for a prefetcher is the same policy either way
    assert type(policies.make("lru", 24, 4, prefetching=True)) is type(policies.make("lru", 24, 4))
