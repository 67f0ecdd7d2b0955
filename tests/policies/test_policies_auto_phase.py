"""The phase policy: hybrid's frequency order plus the within-tick next-use offset (and
blend, phase over two half-lives, under the same random groups)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tierstore import policies


def test_phase_keeps_the_key_of_a_layer_still_to_come_this_tick():
    # Three groups (layers) a tick; keys 0, 1, 2 read at layers 0, 1, 2, equally often.
    p = policies.make("phase", 6, 3, half_life=64.0)
    for _ in range(4):
        for k in range(3):
            p.on_access([k])
        p.decay()
    p.on_admit([0, 1, 2])
    # Tick 5, layer 0 reads key 3 only: key 0 (layer 0) is a whole tick away now.
    p.on_access([3])
    assert p.victims(1).tolist() == [0]
    # Layer 1 reads key 4: key 2 (layer 2) comes next, then key 0, and key 1 last.
    p.on_access([4])
    assert p.victims(3).tolist() == [1, 0, 2]


def test_phase_prefers_the_more_popular_key_over_the_nearer_one():
    p = policies.make("phase", 4, 2, half_life=64.0)
    for t in range(8):
        p.on_access([0])
        if t % 4 == 0:
            p.on_access([1])  # key 1: one tick in four
        else:
            p.on_access([2])
        p.decay()
    p.on_admit([0, 1])
    p.on_access([3])  # the layer-0 group of a new tick, key 0 not read this time
    assert p.victims(1).tolist() == [1]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 11), min_size=0, max_size=5), min_size=1, max_size=40),
    st.integers(1, 6),
    st.sampled_from([("phase", 8.0), ("blend", 2.0)]),
)
def test_phase_and_blend_invariants_under_random_groups(groups, cap, policy):
    name, h = policy
    p = policies.make(name, 12, cap, half_life=h)
    for i, g in enumerate(groups):
        p.on_access(g)
        miss = np.setdiff1d(np.asarray(g, dtype=np.int64), p.resident())
        free = cap - p.n_resident
        if miss.size > free:
            blocked = np.zeros(12, dtype=bool)
            blocked[np.asarray(g, dtype=np.int64)] = True
            v = p.victims(miss.size - free, blocked)
            assert not blocked[v].any() and p.is_resident(v).all()
            p.on_evict(v)
            miss = miss[: free + v.size]
        p.on_admit(miss)
        if i % 3 == 2:
            p.decay()
        p.check_invariants()
