"""The native prefetch replay (tierstore._C.replay_prefetch / replay_prefetch_auto,
csrc/store/src/prefetch_replay.cpp) against the Python loop of
tierstore/sim/prefetching.py (``native=False``, the oracle), on generated routing:
every counter, the per-access hit mask, the prefetcher's accounting and price, and the
policy's final state are equal, for every native policy and auto, demand fill or not,
any read budget, lead and token batching. What the native loop cannot model exactly
(a timed lead-time model, a Prefetcher subclass, a used policy, one layer) stays on the
Python loop."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierstore import policies
from tierstore.policies.admission import for_policy
from tierstore.policies.prefetch import Prefetcher
from tierstore.sim import Prepared, synth
from tierstore.sim.leadtime import LeadTime
from tierstore.sim.native_replay import native_prefetch_replay
from tierstore.sim.predict import replay_predict
from tierstore.sim.prefetching import replay_prefetching
from tierstore.testing.digests import digest, policy_state

pytest.importorskip("tierstore._C")

BASES = ["lru", "heat", "hybrid", "phase", "blend", "auto"]


def _run(prep, base, slots, native, *, demand_fill=True, **pf_params):
    L, E = prep.trace.n_layers, prep.trace.n_experts
    pf = Prefetcher(L, E, slots, **pf_params)
    pol = policies.make(base, prep.n_keys, slots, prefetching=True)
    c = replay_prefetching(prep, pol, slots, pf, demand_fill=demand_fill, native=native)
    return (
        (
            c.demand_reads,
            c.prefetched,
            c.prefetch_hits,
            c.wasted,
            c.evictions,
            c.rejected,
            c.unserved,
            digest(c.hit),
        ),
        (
            pf.issued,
            pf.useful,
            pf.misses,
            pf.lru_reads,
            pf.held_resident,
            pf.in_flight,
            pf.threshold,
            pf.in_flight_p,
            digest(pf.held_mask),
        ),
        digest(*policy_state(pol)),
        pol.n_resident,
    )


cases = st.tuples(
    st.integers(0, 2**31 - 1),
    st.integers(2, 6),
    st.sampled_from([8, 16, 32]),
    st.integers(1, 3),
    st.sampled_from([1, 2]),
    st.floats(0.05, 0.6),
    st.sampled_from(BASES),
    st.booleans(),
    st.sampled_from([0.0, 1.0, 2.0]),
    st.integers(1, 2),
)


@settings(max_examples=60, deadline=None)
@given(cases)
def test_native_replay_equals_the_python_loop(case):
    seed, L, E, top_k, batch, frac, base, demand_fill, ratio, lead = case
    lead = min(lead, L - 1)
    trace = synth.synthetic_trace(
        24,
        batch=batch,
        n_layers=L,
        n_experts=E,
        top_k=top_k,
        prefill_tokens=8,
        prefill_every=10,
        seed=seed % 1000,
    )
    prep = Prepared(trace)
    slots = max(1, int(prep.n_keys * frac))
    params = dict(read_ratio=ratio, lead=lead, top_k=top_k)
    got = _run(prep, base, slots, True, demand_fill=demand_fill, **params)
    want = _run(prep, base, slots, False, demand_fill=demand_fill, **params)
    assert got == want


@pytest.mark.parametrize("base", BASES)
def test_native_replay_on_a_ds4_shaped_trace(base):
    prep = Prepared(synth.synthetic_trace(40, seed=3, prefill_tokens=64))
    slots = prep.n_keys // 10
    assert _run(prep, base, slots, True, top_k=6) == _run(prep, base, slots, False, top_k=6)


def test_what_the_native_loop_cannot_model_stays_on_the_python_loop():
    prep = Prepared(synth.synthetic_trace(16, n_layers=3, n_experts=8, top_k=2, seed=1))
    L, E, slots = 3, 8, 6

    def native(pf, used=False):
        pol = policies.make("hybrid", prep.n_keys, slots, prefetching=True)
        if used:
            pol.on_admit(np.array([0]))  # a policy with residents: the native loop starts empty
        return native_prefetch_replay(prep, pol, slots, pf, for_policy(pol), True)

    assert native(Prefetcher(L, E, slots)) is not None

    class Sub(Prefetcher):  # may override predict / propose: the Python loop calls them
        pass

    assert native(Sub(L, E, slots)) is None
    assert native(Prefetcher(L, E, slots), used=True) is None
    # A timed lead-time model replays in Python (the native loop has no clock) and still runs.
    lt = LeadTime(lead=1, row_seconds=1e-4, layer_seconds=1e-4)
    pol = policies.make("hybrid", prep.n_keys, slots, prefetching=True)
    c = replay_prefetching(prep, pol, slots, Prefetcher(L, E, slots), lead_time=lt)
    assert c.landed is not None


def test_a_one_layer_trace_stays_on_the_python_loop():
    prep = Prepared(synth.synthetic_trace(12, n_layers=1, n_experts=8, top_k=2, seed=2))
    pol = policies.make("lru", prep.n_keys, 4, prefetching=True)
    assert native_prefetch_replay(prep, pol, 4, Prefetcher(1, 8, 4), for_policy(pol), True) is None


def test_bad_reads_are_refused_with_a_clear_error():
    from tierstore.errors import ConfigError

    pf = Prefetcher(3, 8, 6)
    for experts, hit, what in [
        ([1, 1], [0, 0], "distinct"),
        ([3, 9], [0, 0], "out of range"),
        ([1, 2], [0], "hit flag"),
    ]:
        with pytest.raises(ConfigError, match=what):
            pf.on_read(0, np.array(experts), np.array(hit, dtype=bool))
    with pytest.raises(ConfigError, match="out of range"):
        pf.on_read(3, np.array([0]), np.array([True]))
    assert pf.misses == 0 and pf.lru_reads == 0  # nothing was counted


def test_tables_too_large_for_this_machine_are_refused_before_allocating():
    from tierstore.errors import CapacityError

    with pytest.raises(CapacityError, match="co-routing tables of 4 layers x 1000000 experts"):
        Prefetcher(4, 10**6, 10)


def _predict(prep, slots, native, **kw):
    c = replay_predict(prep, slots, native=native, **kw)
    return (
        c.demand_reads,
        c.prefetched,
        c.prefetch_hits,
        c.wasted,
        c.evictions,
        c.rejected,
        c.unserved,
        digest(c.hit),
    )


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 2**31 - 1),
    st.integers(2, 6),
    st.sampled_from([8, 16, 32]),
    st.integers(1, 3),
    st.sampled_from([1, 2]),
    st.floats(0.05, 0.6),
    st.sampled_from(["lru", "heat", "hybrid", "phase", "blend"]),
    st.integers(0, 12),
    st.sampled_from([0.0, 0.05, 0.2, 0.6]),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
def test_native_predict_model_equals_the_python_loop(
    seed, L, E, top_k, batch, frac, base, budget, threshold, cross, temporal, demand_fill
):
    """Both of the predictor's models: ``predict`` (demand fill) and ``prefetch`` (misses
    unserved, the tick-end lazy pass with the unused budget)."""
    trace = synth.synthetic_trace(
        24,
        batch=batch,
        n_layers=L,
        n_experts=E,
        top_k=top_k,
        prefill_tokens=8,
        prefill_every=10,
        seed=seed % 1000,
    )
    prep = Prepared(trace)
    slots = max(1, int(prep.n_keys * frac))
    kw = dict(
        base=base,
        budget=budget,
        threshold=threshold,
        use_cross=cross,
        use_temporal=temporal,
        demand_fill=demand_fill,
    )
    assert _predict(prep, slots, True, **kw) == _predict(prep, slots, False, **kw)
