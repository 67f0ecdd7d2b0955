"""One shared suite over every registered policy, micro-traces with exact
hit/miss/eviction counts, and policy-specific behaviour (decay, admission)."""

from __future__ import annotations

import numpy as np
import pytest

from tierstore import policies
from tierstore.errors import ConfigError

ALL = policies.available()


def run_micro_trace(policy, trace, *, use_admission=True):
    """Single-key accesses through a demand-filled cache of policy.capacity.
    Returns (hits, misses, evictions, rejected); ends with check_invariants()."""
    hits = misses = evictions = rejected = 0
    for key in trace:
        keys = np.array([key], dtype=np.int64)
        resident = key in set(policy.resident().tolist())
        policy.on_access(keys)
        if resident:
            hits += 1
        else:
            misses += 1
            if len(policy.resident()) >= policy.capacity:
                victim = policy.victims(1)
                assert victim.size == 1
                if use_admission and not policy.admit(int(key), int(victim[0])):
                    rejected += 1
                else:
                    policy.on_evict(victim)
                    evictions += 1
                    policy.on_admit(keys)
            else:
                policy.on_admit(keys)
        policy.decay()
        policy.check_invariants()
    return hits, misses, evictions, rejected


# -- the shared suite ---------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
def test_empty_policy_victims_returns_empty_never_raises(name):
    p = policies.make(name, 16, 4)
    for n in (0, 1, 5):
        v = p.victims(n)
        assert v.dtype == np.int64 and v.size == 0
    p.check_invariants()


@pytest.mark.parametrize("name", ALL)
def test_all_pinned_victims_returns_empty(name):
    p = policies.make(name, 16, 4)
    p.on_access(np.arange(4))
    p.on_admit(np.arange(4))
    pinned = np.zeros(16, bool)
    pinned[:4] = True
    assert p.victims(3, pinned).size == 0
    pinned[2] = False
    assert p.victims(3, pinned).tolist() == [2]
    p.check_invariants()


@pytest.mark.parametrize("name", ALL)
def test_victims_are_resident_unpinned_and_coldest_first(name):
    p = policies.make(name, 32, 10)
    # keys 0..9 resident, key k read k times (and most recently for larger k)
    p.on_admit(np.arange(10))
    for k in range(10):
        p.on_access(np.full(k + 1, k))
        p.decay()
    pinned = np.zeros(32, bool)
    pinned[[0, 5]] = True
    v = p.victims(4, pinned)
    assert v.tolist() == [1, 2, 3, 4]
    s = p.scores()
    assert np.all(np.diff(s[v]) >= 0)
    p.check_invariants()


@pytest.mark.parametrize("name", ALL)
def test_rank_orders_hottest_first_and_is_a_permutation(name):
    p = policies.make(name, 20, 5)
    for k in (3, 7, 7, 9, 9, 9):
        p.on_access(np.array([k]))
        p.decay()
    keys = np.array([0, 3, 7, 9, 12])
    r = p.rank(keys)
    assert sorted(r.tolist()) == keys.tolist()
    assert r[0] == 9 and r[1] in (7, 3)  # LRU: 9 is most recent; heat: most frequent


@pytest.mark.parametrize("name", ALL)
def test_out_of_range_key_raises_config_error_naming_key(name):
    p = policies.make(name, 8, 2)
    for call in (
        lambda: p.on_access(np.array([1, 8])),
        lambda: p.on_admit([-1]),
        lambda: p.on_evict([99]),
        lambda: p.rank([3, 8]),
    ):
        with pytest.raises(ConfigError, match=r"key (8|-1|99) out of range \[0, 8\)"):
            call()
    p.check_invariants()


@pytest.mark.parametrize("name", ALL)
def test_reset_forgets_history_and_residency(name):
    p = policies.make(name, 8, 4)
    p.on_access([1, 2, 2])
    p.on_admit([1, 2])
    p.decay(steps=3)
    p.reset()
    assert p.resident().size == 0 and p.victims(4).size == 0
    fresh = policies.make(name, 8, 4)
    np.testing.assert_array_equal(p.scores(), fresh.scores())
    p.check_invariants()


@pytest.mark.parametrize("name", ALL)
def test_two_instances_share_no_state(name):
    a, b = policies.make(name, 8, 4), policies.make(name, 8, 4)
    a.on_access([1, 1, 2])
    a.on_admit([1, 2])
    assert b.resident().size == 0 and np.all(b.scores() <= 0)


@pytest.mark.parametrize("name", ALL)
def test_cyclic_scan_larger_than_capacity_never_hits_under_demand_fill(name):
    # A pure cycle over capacity+1 keys: every policy with demand fill (no
    # admission) evicts exactly one key per miss; LRU is the textbook 0-hit case.
    p = policies.make(name, 8, 3)
    hits, misses, evictions, _ = run_micro_trace(p, [0, 1, 2, 3] * 5, use_admission=False)
    assert hits + misses == 20 and evictions == misses - 3
    if name == "lru":
        assert hits == 0


def test_make_unknown_policy_lists_available():
    with pytest.raises(ConfigError, match="unknown policy 'fifo'; available: lru, heat, hybrid"):
        policies.make("fifo", 8, 2)


@pytest.mark.parametrize("name", ALL)
def test_make_unknown_parameter_is_rejected(name):
    with pytest.raises(ConfigError, match="unknown parameter"):
        policies.make(name, 8, 2, bogus=1)


# -- micro-traces with exact counts ------------------------------------------------
def test_lru_micro_trace_exact_counts():
    p = policies.make("lru", 10, 3)
    assert run_micro_trace(p, [1, 2, 3, 1, 4, 1, 2, 5]) == (2, 6, 3, 0)
    assert sorted(p.resident().tolist()) == [1, 2, 5]


def test_heat_keeps_frequent_key_where_lru_drops_it():
    trace = [1, 1, 2, 3, 1]
    assert run_micro_trace(policies.make("lru", 10, 2), trace) == (1, 4, 2, 0)
    heat = policies.make("heat", 10, 2)
    assert run_micro_trace(heat, trace) == (2, 3, 1, 0)
    assert sorted(heat.resident().tolist()) == [1, 3]


def test_hybrid_rejects_one_hit_wonder():
    trace = [1, 1, 2, 1]
    assert run_micro_trace(policies.make("heat", 10, 1), trace) == (1, 3, 2, 0)
    hyb = policies.make("hybrid", 10, 1)
    assert run_micro_trace(hyb, trace) == (2, 2, 0, 1)
    assert hyb.resident().tolist() == [1]
