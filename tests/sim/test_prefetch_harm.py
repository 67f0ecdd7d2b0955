"""The prefetcher's price of a fetch's victim (tierstore/policies/prefetch.py,
"the harm to a fetch's victim"): a fetch whose slot evicts a key its layer will
likely route costs more credit, so under the same state and credit the budget
keeps a prefix of the fetches it keeps with free slots; with free slots (-1) or no
victim query the proposal is unchanged; and the simulator's query names exactly
the victims its fill then evicts."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import tierstore.sim.prefetching as prefetching
from tierstore import policies
from tierstore.policies.prefetch import Prefetcher
from tierstore.sim import Prepared, synth
from tierstore.sim.prefetching import replay_prefetching


def _state(seed, slots_frac, ratio, name):
    trace = synth.synthetic_trace(24, n_layers=4, n_experts=16, top_k=3, prefill_tokens=0, seed=seed)
    prep = Prepared(trace)
    slots = max(4, int(trace.n_keys * slots_frac))
    pf = Prefetcher(4, 16, slots, read_ratio=ratio, top_k=3)
    replay_prefetching(prep, policies.make(name, trace.n_keys, slots, prefetching=True), slots, pf)
    return pf


@settings(max_examples=30, deadline=None)
@given(
    st.integers(0, 2**31 - 1),
    st.sampled_from([0.1, 0.3]),
    st.sampled_from([1.0, 1.5, 3.0]),
    st.sampled_from(["lru", "auto"]),
    st.integers(0, 3),
    st.integers(0, 63),
)
def test_a_harmed_victim_costs_credit_and_keeps_a_prefix(seed, frac, ratio, name, layer, vkey):
    # Three prefetchers in the same state (a replay is deterministic; the native
    # shadow does not copy).
    plain, free, harmed = (_state(seed, frac, ratio, name) for _ in range(3))
    pf = plain
    resident = np.zeros(pf.n_keys, dtype=bool)
    seen = []

    def victims(n, blocked):
        seen.append(blocked.copy())
        return (vkey + np.arange(n)) % pf.n_keys  # any resident-looking keys

    f0, h0 = plain.propose(layer, resident)
    f1, h1 = free.propose(layer, resident, lambda n, b: np.full(n, -1, dtype=np.int64))
    f2, h2 = harmed.propose(layer, resident, victims)
    assert np.array_equal(f0, f1) and np.array_equal(h0, h1)  # free slots harm nothing
    assert plain.last_cost == free.last_cost
    assert np.array_equal(f2, f0[: f2.size])  # the harm cuts, never reorders
    assert np.array_equal(h2[: h2.size - f2.size], h0[: h0.size - f0.size])  # same holds
    assert harmed.last_cost >= plain.last_cost * (f2.size == f0.size) - 1e-12
    if seen:  # the group being read is never a victim
        assert seen[0][
            layer * pf.n_experts + (pf._this[layer] if pf._this[layer] is not None else np.empty(0, np.int64))
        ].all()


def test_a_likely_victim_prices_a_fetch_out():
    """Same state, same credit: a victim its layer routes for sure doubles a
    wasted fetch's cost, one it never routes leaves it as it was."""
    L, E, k = 3, 8, 2

    def state():
        pf = Prefetcher(L, E, 12, read_ratio=1.0, top_k=k)
        for t in range(40):  # layer 0's expert t % 2 is followed by layer 1's 4 + t % 2
            pf.on_read(0, np.array([t % 2, 7]), np.ones(2, dtype=bool))
            pf.on_read(1, np.array([4 + t % 2, 7]), np.ones(2, dtype=bool))
            pf.on_read(2, np.array([0, 7]), np.ones(2, dtype=bool))
            pf.end_tick()
        pf.lru_reads += 1  # a little credit
        pf.on_read(0, np.array([0, 7]), np.ones(2, dtype=bool))
        return pf

    none_routed, routed = state(), state()
    f_cold, _ = none_routed.propose(
        0, np.zeros(L * E, dtype=bool), lambda n, b: np.full(n, 2 * E + 3)
    )  # layer 2 never routes 3
    f_hot, _ = routed.propose(
        0, np.zeros(L * E, dtype=bool), lambda n, b: np.full(n, 2 * E + 7)
    )  # layer 2 always routes 7
    assert f_cold.size >= 1 and none_routed.last_cost > 0
    # Fewer fetches, or the same ones at exactly twice the expected cost (h = 1).
    assert f_hot.size < f_cold.size or (
        np.array_equal(f_hot, f_cold) and routed.last_cost == 2 * none_routed.last_cost
    )


def test_the_simulators_victim_query_names_the_fills_victims():
    trace = synth.synthetic_trace(40, n_layers=5, n_experts=24, top_k=4, prefill_tokens=0, seed=7)
    prep = Prepared(trace)
    slots = 20
    asked, evicted = [], []

    class Tier(prefetching.Filler):
        def would_evict(self, n, blocked):
            v = super().would_evict(n, blocked)
            asked.append(v)
            return v

        def place(self, cand, block, admission, count_rejected=True):
            before = self.resident.copy()
            got = super().place(cand, block, admission, count_rejected)
            if not count_rejected:  # a prefetch's fill
                gone = np.flatnonzero(before & ~self.resident)
                evicted.append((got.size, gone))
            return got

    orig = prefetching.Filler
    prefetching.Filler = Tier
    try:
        pf = Prefetcher(5, 24, slots, read_ratio=1.5, top_k=4)
        # The Python loop, whose Filler this instruments (the native loop equals it:
        # tests/sim/test_prefetch_native.py).
        replay_prefetching(prep, policies.make("lru", prep.n_keys, slots), slots, pf, native=False)
    finally:
        prefetching.Filler = orig
    assert evicted and len(asked) >= len(evicted)
    # Each fill's victims are the query's first ``fetched`` answers (the query ran for
    # every candidate, the budget kept a prefix).
    checked = 0
    for v in asked:
        if checked < len(evicted) and v.size >= evicted[checked][0]:
            n, gone = evicted[checked]
            want = v[:n]
            if np.array_equal(np.sort(want[want >= 0]), gone):
                checked += 1
    assert checked == len(evicted)
