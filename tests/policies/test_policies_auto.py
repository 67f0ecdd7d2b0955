"""The fill routine, admission objects, MIN-that-may-skip and the self-tuning policy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierstore import policies, sim
from tierstore.policies.admission import ADMIT_ALL, HotterThanVictim, PolicyFilter
from tierstore.policies.fill import plan_fill, plan_lazy
from tierstore.sim import synth
from tierstore.sim.traces import Trace


def _heat_with(resident, heat):
    p = policies.make("heat", len(heat), len(resident), half_life=1e9)
    p.on_access(np.arange(len(heat)), weights=np.asarray(heat, dtype=float))
    p.on_admit(np.asarray(resident))
    return p


def test_plan_fill_free_slots_first_then_coldest_victims_in_order():
    p = _heat_with([0, 1, 2], [5, 1, 3, 9, 8, 0.5])
    f = plan_fill(p, np.array([3, 4, 5]), 1, None, ADMIT_ALL)
    assert f.keys.tolist() == [3, 4, 5] and f.victims.tolist() == [1, 2] and f.rejected == 0
    # hotter-than-victim: 5 (heat 0.5) may not displace 2 (heat 3)
    f = plan_fill(p, np.array([3, 5]), 0, None, HotterThanVictim(p))
    assert f.keys.tolist() == [3] and f.victims.tolist() == [1] and f.rejected == 1
    blocked = np.zeros(6, dtype=bool)
    blocked[[0, 1, 2]] = True  # nothing may be evicted: all but the free slot rejected
    f = plan_fill(p, np.array([3, 4]), 1, blocked, ADMIT_ALL)
    assert f.keys.tolist() == [3] and f.victims.size == 0 and f.rejected == 1


def test_plan_lazy_ranks_and_caps():
    p = _heat_with([0], [1, 0, 7, 9, 3, 0])
    f = plan_lazy(p, np.array([2, 3, 4]), 2, 5, None, HotterThanVictim(p))
    assert f.keys.tolist() == [3, 2] and f.rejected == 0


def test_policy_filter_is_the_policys_own_admit():
    hy = policies.make("hybrid", 4, 2)
    hy.on_access(np.array([0, 0, 1]))
    assert PolicyFilter(hy).admit(np.array([1, 2]), np.array([0, 3])).tolist() == [False, False]
    assert PolicyFilter(policies.make("lru", 4, 2)).filters is False


def _trace(rows, L, E):
    rows = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
    return Trace(rows[:, 0], rows[:, 1].astype(np.int32), rows[:, 2].astype(np.int32), np.arange(L), E)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10**6), slots=st.integers(2, 12))
def test_min_that_may_skip_bounds_every_model_in_the_bandwidth_view(seed, slots):
    tr = synth.synthetic_trace(
        30, n_layers=2, n_experts=10, top_k=2, prefill_tokens=4, prefill_every=15, seed=seed
    )
    res = {r.policy: r for r in sim.replay(tr, ["all"], [slots], budget=2)}
    top = res["belady_skip"].bandwidth_hit_rate
    assert top >= res["belady"].bandwidth_hit_rate - 1e-12
    for name, r in res.items():
        if name != "unbounded":
            assert r.bandwidth_hit_rate <= top + 1e-12, name
    assert res["hybrid"].ceiling == res["auto"].ceiling == "belady_skip"
    assert res["lru"].ceiling == "belady" and res["belady"].gap_to_min is None


def _scan_plus_hot(n_ticks, seed=0):
    """One layer: 4 hot experts every tick and 2 never-repeating scan experts."""
    rng = np.random.default_rng(seed)
    rows, scan = [], 8
    for t in range(n_ticks):
        hot = np.sort(rng.choice(4, 2, replace=False))
        for e in sorted(list(hot) + [scan, scan + 1]):
            rows.append((t, 0, e))
        scan = 8 + (scan - 8 + 2) % 200
    return _trace(rows, 1, 208)


def test_auto_follows_the_better_expert_on_a_scan():
    tr = _scan_plus_hot(400)
    res = {r.policy: r for r in sim.replay(tr, ["lru", "heat", "hybrid", "auto"], [4])}
    best = max(res[n].hit_rate for n in ("lru", "heat", "hybrid"))
    assert res["auto"].hit_rate >= best - 0.05
    assert res["auto"].hit_rate > res["lru"].hit_rate + 0.2


def test_auto_in_the_store_reports_its_leader_and_keeps_invariants():
    p = policies.make("auto", 208, 4)
    prep = sim.Prepared(_scan_plus_hot(200))
    sim.replay_demand_fill(prep, p, 4)
    p.check_invariants()
    assert p.leader_name() != "lru" and p.expert_scores.max() > 0
    p.reset()
    assert p.resident().size == 0 and p.expert_scores.max() == 0


@pytest.mark.parametrize("name", ["auto", "belady_skip", "lazy"])
def test_all_names_run_through_replay(name):
    tr = synth.synthetic_trace(20, n_layers=2, n_experts=8, top_k=2, prefill_tokens=0, seed=1)
    (r,) = sim.replay(tr, [name], [4])
    assert r.reads == r.demand_reads + r.prefetched
    assert r.bandwidth_hit_rate == pytest.approx(1 - (r.reads + r.unserved) / r.accesses)
