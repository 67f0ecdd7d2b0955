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
