"""The native demand replay (tierstore.sim.native_replay, csrc/store/src/replay.cpp)
against the Python loop it replaces (replay_demand_fill(native=False), the oracle):
the same hits, reads, evictions and rejections, and the policy left in the same
state, for lru / heat / hybrid / phase at several capacities on the FLAME trace (when
the shared copy is present), synthetic traces and random small ones."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tierstore import policies
from tierstore.policies.admission import ADMIT_ALL
from tierstore.sim.counting import Prepared
from tierstore.sim.demand import replay_demand_fill
from tierstore.sim.native_replay import native_filter
from tierstore.sim.synth import synthetic_trace
from tierstore.sim.traces import Trace, load_trace

_C = pytest.importorskip("tierstore._C")
if not hasattr(_C, "replay_demand"):
    pytest.skip("extension built without replay_demand", allow_module_level=True)

FLAME = Path(os.environ.get("TIERSTORE_FLAME_TRACE",
                            "/work/shared/traces/flame_moe_290m_pretrain_2048tok.npy"))
NAMES = ("lru", "heat", "hybrid", "phase")


def _state(p) -> dict:
    out = {k: getattr(p, k) for k in ("_clock", "_t", "_base", "_gain", "_n_resident", "_group",
                                        "_per_tick")
           if hasattr(p, k)}
    out.update({k: getattr(p, k).copy() for k in ("_last", "_raw", "_pos", "_resident")
                if hasattr(p, k)})
    return out


def assert_same(prep: Prepared, name: str, slots: int, granularity="layer", admission=None,
                **params) -> None:
    n_keys = prep.n_keys
    fast, slow = (policies.make(name, n_keys, slots, **params) for _ in range(2))
    adm_f = admission(fast) if admission else None
    adm_s = admission(slow) if admission else None
    assert native_filter(fast, adm_f if adm_f is not None else _default(fast)) is not None
    a = replay_demand_fill(prep, fast, slots, granularity, adm_f)
    b = replay_demand_fill(prep, slow, slots, granularity, adm_s, native=False)
    where = f"{name} slots={slots} {granularity}"
    assert np.array_equal(a.hit, b.hit), where
    assert (a.demand_reads, a.evictions, a.rejected) == (b.demand_reads, b.evictions,
                                                         b.rejected), where
    sa, sb = _state(fast), _state(slow)
    assert sa.keys() == sb.keys()
    for k in sa:
        assert np.array_equal(sa[k], sb[k]), f"{where}: {k} differs"
    fast.check_invariants()


def _default(p):
    from tierstore.policies.admission import for_policy
    return for_policy(p)


@pytest.fixture(scope="module")
def synth_preps():
    return [Prepared(synthetic_trace(96, batch=1, prefill_tokens=64, prefill_every=48,
                                     n_layers=6, n_experts=32, seed=3)),
            Prepared(synthetic_trace(64, batch=4, prefill_tokens=0, n_layers=5,
                                     n_experts=24, seed=5))]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("slots", [1, 7, 40, 100])
@pytest.mark.parametrize("granularity", ["layer", "tick"])
def test_synthetic_equal(synth_preps, name, slots, granularity):
    for prep in synth_preps:
        assert_same(prep, name, slots, granularity)


@pytest.mark.parametrize("name", NAMES)
def test_admit_all_and_short_half_life_equal(synth_preps, name):
    # ADMIT_ALL turns hybrid's filter off (the store's fire); a half-life of 0.01 steps
    # renormalises the heat every few ticks, exercising that branch.
    for prep in synth_preps:
        assert_same(prep, name, 30, admission=lambda p: ADMIT_ALL)
        if name != "lru":
            assert_same(prep, name, 30, half_life=0.01)


@pytest.mark.skipif(not FLAME.exists(), reason="FLAME trace not present")
@pytest.mark.parametrize("name", NAMES)
def test_flame_equal(name):
    prep = Prepared(load_trace(FLAME))
    for slots in (51, 205):
        assert_same(prep, name, slots)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(2, 6), st.integers(1, 12), st.integers(1, 30),
       st.sampled_from(NAMES), st.integers(0, 2**31 - 1))
def test_random_traces_equal(n_layers, n_experts, n_ticks, slots, name, seed):
    rng = np.random.default_rng(seed)
    rows = rng.integers(1, 8, size=n_ticks)
    ticks = np.repeat(np.arange(n_ticks, dtype=np.int64), rows)
    layers = rng.integers(0, n_layers, size=ticks.size).astype(np.int32)
    experts = rng.integers(0, n_experts, size=ticks.size).astype(np.int32)
    order = np.lexsort((layers, ticks))
    trace = Trace(ticks[order], layers[order], experts[order],
                  np.arange(n_layers, dtype=np.int64), n_experts)
    params = {} if name == "lru" else {"half_life": float(rng.choice([0.3, 4.0, 256.0]))}
    assert_same(Prepared(trace), name, slots, **params)


def test_not_native_where_inexact():
    # A wall-clock heat, a policy already holding keys, or auto stay on the Python loop.
    assert policies.make("heat", 10, 4, half_life_s=1.0).native_state() is None
    assert policies.make("hybrid", 10, 4, half_life_s=1.0).native_state() is None
    p = policies.make("lru", 10, 4)
    p.on_admit(np.array([3]))
    assert native_filter(p, ADMIT_ALL) is None
    assert native_filter(policies.make("auto", 10, 4), ADMIT_ALL) is None
