"""Simulator: exact counts against independent pure-Python references (LRU and
Belady's MIN), the optimum's ordering, the reference manager's rules, and the
predictor's accounting."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierstore import sim
from tierstore.errors import ConfigError
from tierstore.sim.traces import Trace


def make_trace(rows, n_layers, n_experts) -> Trace:
    rows = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
    return Trace(
        rows[:, 0], rows[:, 1].astype(np.int32), rows[:, 2].astype(np.int32), np.arange(n_layers), n_experts
    )


def random_rows(rng, n_ticks, n_layers, n_experts, k):
    rows = []
    for t in range(n_ticks):
        for layer in range(n_layers):
            for e in np.sort(rng.choice(n_experts, k, replace=False)):
                rows.append((t, layer, e))
    return rows


def groups(rows, n_experts):
    """(tick, layer) -> sorted distinct keys, in read order."""
    out = OrderedDict()
    for t, layer, e in rows:
        out.setdefault((t, layer), set()).add(layer * n_experts + e)
    return [sorted(v) for v in out.values()]


def reference_lru_hits(rows, n_experts, slots):
    cache, hits = OrderedDict(), 0
    for g in groups(rows, n_experts):
        for k in g:
            if k in cache:
                hits += 1
        # The group's reads are stamped first (ties by key id), then its
        # admissions (a newer stamp): move to the MRU end in that order.
        for k in [k for k in g if k in cache] + [k for k in g if k not in cache]:
            cache[k] = True
            cache.move_to_end(k)
        while len(cache) > slots:
            victim = next(k for k in cache if k not in g)
            del cache[victim]
    return hits


def reference_min_hits(rows, n_experts, slots):
    seq = groups(rows, n_experts)
    cache, hits = set(), 0
    for i, g in enumerate(seq):
        hits += sum(k in cache for k in g)
        cache |= set(g)
        while len(cache) > slots:

            def next_use(k):
                return next((j for j in range(i + 1, len(seq)) if k in seq[j]), 10**9)

            victim = max((k for k in cache if k not in g), key=lambda k: (next_use(k), -k))
            cache.remove(victim)
    return hits


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), slots=st.integers(3, 14))
def test_lru_and_belady_match_pure_python_references(seed, slots):
    rng = np.random.default_rng(seed)
    rows = random_rows(rng, 12, 3, 6, 2)
    trace = make_trace(rows, 3, 6)
    res = {r.policy: r for r in sim.replay(trace, ["lru", "belady"], [slots])}
    assert round(res["lru"].hit_rate * len(rows)) == reference_lru_hits(rows, 6, slots)
    # Belady ties (equal next use) may break differently; hit counts cannot differ.
    assert round(res["belady"].hit_rate * len(rows)) == reference_min_hits(rows, 6, slots)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), slots=st.integers(3, 20), gran=st.sampled_from(["layer", "tick"]))
def test_belady_is_never_beaten_by_a_forced_admission_policy(seed, slots, gran):
    rng = np.random.default_rng(seed)
    trace = make_trace(random_rows(rng, 20, 3, 8, 2), 3, 8)
    res = {
        r.policy: r.hit_rate for r in sim.replay(trace, ["lru", "heat", "belady"], [slots], granularity=gran)
    }
    assert res["belady"] >= max(res["lru"], res["heat"]) - 1e-12


def test_micro_trace_exact_counts_and_fields():
    # one layer, 4 experts, 2 slots: reads 0 1 | 0 2 | 0 1 (one key per tick group of 2)
    rows = [(0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 2), (2, 0, 0), (2, 0, 1)]
    trace = make_trace(rows, 1, 4)
    res = {r.policy: r for r in sim.replay(trace, ["lru", "belady", "unbounded"], [2])}
    lru = res["lru"]
    # t0: 2 misses; t1: 0 hit, 2 miss -> evict 1; t2: 0 hit, 1 miss -> evict 2
    assert (round(lru.hit_rate * 6), lru.demand_reads, lru.evictions) == (2, 4, 2)
    assert res["belady"].hit_rate == pytest.approx(2 / 6)
    assert res["unbounded"].hit_rate == pytest.approx(3 / 6)  # 3 distinct keys miss once
    assert lru.gap_to_min == pytest.approx(0.0) and lru.reads_per_tick == pytest.approx(4 / 3)
    assert set(lru.as_dict()) >= {
        "policy",
        "slots",
        "hit_rate",
        "distinct_hit_rate",
        "reads",
        "wasted_prefetch",
    }


def test_token_weighted_and_distinct_rates_differ_with_repeats():
    # tick 0: expert 0 by 3 tokens (miss); tick 1: expert 0 by 1 token (hit), expert 1 (miss)
    rows = [(0, 0, 0)] * 3 + [(1, 0, 0), (1, 0, 1)]
    r = sim.replay(make_trace(rows, 1, 2), ["lru"], [2])[0]
    assert r.hit_rate == pytest.approx(1 / 5) and r.distinct_hit_rate == pytest.approx(1 / 3)


def test_tick_granularity_pins_the_whole_step():
    # 2 layers x 1 expert read per tick, 1 slot: layer mode can rotate the slot;
    # tick mode pins both keys of the step, so the second miss is read but not cached.
    rows = [(t, layer, 0) for t in range(3) for layer in range(2)]
    trace = make_trace(rows, 2, 1)
    layer = sim.replay(trace, ["lru"], [1], granularity="layer")[0]
    tick = sim.replay(trace, ["lru"], [1], granularity="tick")[0]
    assert layer.rejected == 0 and layer.evictions == 5
    assert tick.rejected == 3 and tick.evictions == 0 and tick.hit_rate == pytest.approx(2 / 6)


def test_reference_promotes_lazily_at_most_eight_per_tick():
    # 20 keys routed at tick 0, then tick 1 re-reads them: only 8 were promoted.
    rows = [(0, 0, e) for e in range(20)] + [(1, 0, e) for e in range(20)]
    r = sim.replay(make_trace(rows, 1, 20), ["reference"], [64])[0]
    assert r.hit_rate == pytest.approx(8 / 40)  # no hit at tick 0 (counted before promotion)
    assert r.reads == 16 and r.demand_reads == 16  # 8 after tick 0, 8 after tick 1


def test_reference_never_evicts_keys_used_this_tick():
    rows = [(t, 0, e) for t in range(30) for e in (0, 1)] + [(30, 0, 2)] * 1
    r = sim.replay(make_trace(rows, 1, 3), ["reference"], [2])[0]
    assert r.evictions == 0  # key 2 (heat 1) never beats the in-use, hotter 0 and 1


def test_predict_learns_a_deterministic_cross_layer_map():
    # layer 1's experts are a fixed function of layer 0's; layer 0 is random.
    rng = np.random.default_rng(0)
    rows = []
    for t in range(400):
        e0 = np.sort(rng.choice(16, 2, replace=False))
        rows += [(t, 0, e) for e in e0] + [(t, 1, e) for e in np.sort((e0 * 5 + 3) % 16)]
    trace = make_trace(rows, 2, 16)
    res = {r.policy: r for r in sim.replay(trace, ["hybrid", "predict", "belady"], [6], budget=4)}
    p = res["predict"]
    assert p.hit_rate > res["hybrid"].hit_rate + 0.15
    assert p.prefetched > 0 and p.prefetch_hits + p.wasted_prefetch == p.prefetched
    assert p.reads == p.demand_reads + p.prefetched
    assert p.prefetched <= 4 * 400


def test_predict_with_zero_budget_equals_its_base_policy():
    rng = np.random.default_rng(1)
    trace = make_trace(random_rows(rng, 30, 3, 8, 2), 3, 8)
    res = {r.policy: r for r in sim.replay(trace, ["hybrid", "predict"], [5], budget=0)}
    assert res["predict"].hit_rate == res["hybrid"].hit_rate
    assert res["predict"].prefetched == 0


def test_bad_policy_names_and_slots_are_reported_together():
    trace = make_trace([(0, 0, 0)], 1, 1)
    with pytest.raises(ConfigError, match=r"unknown policy 'fifo'.*; slots must be > 0, got \[0\]"):
        sim.replay(trace, ["lru", "fifo"], [4, 0])
    with pytest.raises(ConfigError, match="granularity 'layer'"):
        sim.replay(trace, ["predict"], [4], granularity="tick")


def test_prefetch_model_reads_only_within_its_budget():
    rng = np.random.default_rng(0)
    rows = []
    for t in range(200):
        e0 = np.sort(rng.choice(16, 2, replace=False))
        rows += [(t, 0, e) for e in e0] + [(t, 1, e) for e in np.sort((e0 * 5 + 3) % 16)]
    trace = make_trace(rows, 2, 16)
    res = {r.policy: r for r in sim.replay(trace, ["reference", "prefetch"], [6], budget=2)}
    p = res["prefetch"]
    # reads = predictions + the lazy pass with the leftover budget, never over budget
    assert 0 < p.prefetched and p.reads == p.prefetched + p.demand_reads <= 2 * 200
    assert p.prefetch_hits + p.wasted_prefetch == p.prefetched
    # layer 1 is predictable from layer 0: prefetch beats the lazy reference there
    assert p.hit_rate > res["reference"].hit_rate
