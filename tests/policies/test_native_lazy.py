"""The lazy promotion models natively (csrc/store/src/lazy_replay.cpp): the
live store's step() path (``lazy``: this tick's misses, hotter than their victims) and
vLLM-Moet's reference manager (``reference``: the hottest non-resident keys, never over a
key the tick used), each equal to ``sim.demand.replay_lazy``'s Python loop, the oracle:
counters, the per-access hit mask and the policy's final state."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierstore import policies
from tierstore.policies.admission import HotterThanVictim
from tierstore.sim import Prepared, synth
from tierstore.sim.demand import hottest_nonresident, replay_lazy
from tierstore.sim.native_replay import native_lazy_replay
from tierstore.testing.digests import digest, policy_state

_C = pytest.importorskip("tierstore._C")

KINDS = ["lru", "heat", "hybrid", "phase", "blend"]


def _lazy(prep, kind, slots, cap, candidates, native, **params):
    pol = policies.make(kind, prep.n_keys, slots, **params)
    c = replay_lazy(prep, pol, slots, cap, candidates=candidates, native=native)
    return (
        (int(c.hit.sum()), c.demand_reads, c.evictions, c.rejected, c.unserved, digest(c.hit)),
        digest(*policy_state(pol)),
        pol.n_resident,
        digest(np.sort(pol.resident())),
    )


@settings(max_examples=80, deadline=None)
@given(
    st.integers(0, 2**31 - 1),
    st.integers(1, 5),
    st.sampled_from([4, 8, 16, 32]),
    st.integers(1, 4),
    st.sampled_from([1, 3]),
    st.floats(0.02, 0.7),
    st.sampled_from(KINDS),
    st.integers(0, 20),
    st.sampled_from(["seen", "hottest"]),
    st.sampled_from([None, 2.0, 64.0]),
)
def test_native_lazy_replay_equals_the_python_loop(
    seed, L, E, top_k, batch, frac, kind, cap, candidates, half_life
):
    trace = synth.synthetic_trace(
        32,
        batch=batch,
        n_layers=L,
        n_experts=E,
        top_k=min(top_k, E),
        prefill_tokens=8,
        prefill_every=12,
        seed=seed % 1000,
    )
    prep = Prepared(trace)
    slots = max(1, int(prep.n_keys * frac))
    params = {} if half_life is None or kind == "lru" else {"half_life": half_life}
    assert _lazy(prep, kind, slots, cap, candidates, True, **params) == _lazy(
        prep, kind, slots, cap, candidates, False, **params
    )


@pytest.mark.parametrize("candidates", ["seen", "hottest"])
def test_native_lazy_replay_on_a_ds4_shaped_trace(candidates):
    prep = Prepared(synth.synthetic_trace(24, seed=3, prefill_tokens=32))
    for kind in ("hybrid", "heat"):
        assert _lazy(prep, kind, 1101, 8, candidates, True) == _lazy(prep, kind, 1101, 8, candidates, False)


def _brute_hottest(scores, resident, n):
    """The definition: the n highest scores > 0 off the resident set, ties to the lower id,
    returned ascending."""
    keys = [k for k in range(scores.size) if not resident[k] and scores[k] > 0]
    keys.sort(key=lambda k: (-scores[k], k))
    return np.array(sorted(keys[: max(n, 0)]), dtype=np.int64)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.0, 2.0, 3.0]), min_size=0, max_size=40),
    st.integers(0, 2**31 - 1),
    st.integers(-2, 45),
)
def test_hottest_nonresident_is_the_n_highest_ties_to_the_lower_key(values, seed, n):
    scores = np.array(values, dtype=np.float64)
    resident = np.random.default_rng(seed).random(scores.size) < 0.3
    want = _brute_hottest(scores, resident, n)
    got = hottest_nonresident(scores, resident, n)
    assert got.dtype == np.int64 and np.array_equal(got, want)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 2**31 - 1),
    st.sampled_from(["heat", "hybrid", "lru"]),
    st.sampled_from([0, 1, 3, 8, 70, 500]),
)
def test_the_native_selection_picks_what_the_python_one_picks(seed, kind, n):
    """Both spellings of hottest_nonresident over one policy's real state, ties included
    (keys routed by the same tokens have equal heats), the short and the long path (> 64)."""
    prep = Prepared(synth.synthetic_trace(12, batch=2, n_layers=4, n_experts=64, top_k=4, seed=seed % 1000))
    pol = policies.make(kind, prep.n_keys, 40)
    replay_lazy(prep, pol, 40, 8, candidates="hottest")
    scores, resident = pol.scores(), np.zeros(prep.n_keys, dtype=bool)
    resident[pol.resident()] = True
    native = np.asarray(_C.hottest_nonresident(pol.native_state(), n), dtype=np.int64)
    assert np.array_equal(native, hottest_nonresident(scores, resident, n))


def test_what_the_native_loop_cannot_model_stays_on_the_python_loop():
    prep = Prepared(synth.synthetic_trace(16, n_layers=3, n_experts=16, seed=2))
    fresh = policies.make("hybrid", prep.n_keys, 10)
    assert native_lazy_replay(prep, fresh, 10, 8, hottest=False) is not None
    used = policies.make("hybrid", prep.n_keys, 10)
    used.on_admit(np.array([1, 2]))
    assert native_lazy_replay(prep, used, 10, 8, hottest=False) is None
    wall = policies.make("heat", prep.n_keys, 10, half_life_s=1.0)
    assert native_lazy_replay(prep, wall, 10, 8, hottest=True) is None
    auto = policies.make("auto", prep.n_keys, 10)
    assert native_lazy_replay(prep, auto, 10, 8, hottest=True) is None
    # An explicit admission rule is the Python loop's: equal to the default's native run.
    pol = policies.make("hybrid", prep.n_keys, 10)
    explicit = replay_lazy(prep, pol, 10, 8, admission=HotterThanVictim(pol))
    default = replay_lazy(prep, policies.make("hybrid", prep.n_keys, 10), 10, 8)
    assert np.array_equal(explicit.hit, default.hit)
    assert (explicit.demand_reads, explicit.rejected) == (default.demand_reads, default.rejected)


def _state_after(kind, seed, slots):
    """A policy with real state: a short trace replayed through its lazy path."""
    prep = Prepared(synth.synthetic_trace(10, batch=2, n_layers=3, n_experts=24, top_k=4, seed=seed % 1000))
    pol = policies.make(kind, prep.n_keys, slots)
    replay_lazy(prep, pol, slots, 6, candidates="hottest")
    return prep, pol


@settings(max_examples=120, deadline=None)
@given(
    st.integers(0, 2**31 - 1),
    st.sampled_from(KINDS),
    st.integers(1, 60),
    st.integers(0, 12),
    st.integers(0, 5),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
def test_the_cores_lazy_plan_is_the_python_rule(seed, kind, slots, cap, extra_free, hotter, pin, empty):
    """plan_lazy through the core (what the live store's step() now runs for a native pool
    policy) against plan_lazy_python, the rule through the face's Python methods."""
    from tierstore.policies.admission import PolicyFilter
    from tierstore.policies.fill import plan_lazy, plan_lazy_python

    prep, pol = _state_after(kind, seed, slots)
    rng = np.random.default_rng(seed)
    resident = np.zeros(prep.n_keys, dtype=bool)
    resident[pol.resident()] = True
    out = np.flatnonzero(~resident)
    cand = np.zeros(0, dtype=np.int64) if empty else rng.permutation(out)[: rng.integers(0, 12)]
    blocked = (rng.random(prep.n_keys) < 0.3) if pin else None
    n_free = max(slots - pol.n_resident, 0) + extra_free
    adm = HotterThanVictim(pol) if hotter else PolicyFilter(pol)
    a = plan_lazy(pol, cand, cap, n_free, blocked, adm)
    b = plan_lazy_python(pol, cand, cap, n_free, blocked, adm)
    assert np.array_equal(a.keys, b.keys) and np.array_equal(a.victims, b.victims)
    assert (a.n_free, a.rejected) == (b.n_free, b.rejected)
