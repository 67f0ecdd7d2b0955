"""Belady's MIN replayed natively (tierstore._C.replay_min, csrc/store/src/min_replay.cpp,
through tierstore.sim.native_replay.replay_min_native) against the Python loop over
BeladyPolicy / BeladySkipPolicy (replay_demand_fill(native=False), the oracle): same hit
mask, reads, evictions and rejections, and the policy object left in the same state, for
both forms at both granularities, under the policy's own rule and ADMIT_ALL, on synthetic
traces, random small ones (ties between equal next uses are common there: two keys read
again in the same group) and FLAME when the shared copy is present."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierstore.policies.admission import ADMIT_ALL
from tierstore.sim import runner
from tierstore.sim.belady import BeladyPolicy, BeladySkipPolicy
from tierstore.sim.counting import Prepared
from tierstore.sim.demand import replay_demand_fill
from tierstore.sim.native_replay import replay_min_native
from tierstore.sim.synth import synthetic_trace
from tierstore.sim.traces import Trace, load_trace

_C = pytest.importorskip("tierstore._C")
if not hasattr(_C, "replay_min"):
    pytest.skip("extension built without replay_min", allow_module_level=True)

FLAME = Path(
    os.environ.get("TIERSTORE_FLAME_TRACE", "/work/shared/traces/flame_moe_290m_pretrain_2048tok.npy")
)
CLASSES = (BeladyPolicy, BeladySkipPolicy)


def _state(p) -> dict:
    return {
        "next": p._next.copy(),
        "neg": p._neg.copy(),
        "resident": p._resident.copy(),
        "cursor": p._cursor,
        "n_resident": p.n_resident,
    }


def assert_same(prep: Prepared, cls, slots: int, granularity="layer", admit_all=False):
    fast, slow = (cls(prep.n_keys, slots, next_use=prep.next_use) for _ in range(2))
    adm = ADMIT_ALL if admit_all else None
    # The native path must be the one taken (not a silent fallback to the Python loop).
    probe = cls(prep.n_keys, slots, next_use=prep.next_use)
    from tierstore.policies.admission import for_policy

    assert (
        replay_min_native(prep, probe, slots, granularity, ADMIT_ALL if admit_all else for_policy(probe))
        is not None
    )
    a = replay_demand_fill(prep, fast, slots, granularity, adm)
    b = replay_demand_fill(prep, slow, slots, granularity, adm, native=False)
    where = f"{cls.name} slots={slots} {granularity} admit_all={admit_all}"
    assert np.array_equal(a.hit, b.hit), where
    assert (a.demand_reads, a.evictions, a.rejected) == (b.demand_reads, b.evictions, b.rejected), where
    sa, sb = _state(fast), _state(slow)
    for k in sa:
        assert np.array_equal(sa[k], sb[k]), f"{where}: {k} differs"
    fast.check_invariants()


def _random_trace(n_layers, n_experts, n_ticks, seed) -> Trace:
    rng = np.random.default_rng(seed)
    rows = rng.integers(1, 8, size=n_ticks)
    ticks = np.repeat(np.arange(n_ticks, dtype=np.int64), rows)
    layers = rng.integers(0, n_layers, size=ticks.size).astype(np.int32)
    experts = rng.integers(0, n_experts, size=ticks.size).astype(np.int32)
    order = np.lexsort((layers, ticks))
    return Trace(ticks[order], layers[order], experts[order], np.arange(n_layers, dtype=np.int64), n_experts)


@pytest.fixture(scope="module")
def synth_preps():
    return [
        Prepared(
            synthetic_trace(
                96, batch=1, prefill_tokens=64, prefill_every=48, n_layers=6, n_experts=32, seed=3
            )
        ),
        Prepared(synthetic_trace(64, batch=4, prefill_tokens=0, n_layers=5, n_experts=24, seed=5)),
    ]


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("slots", [1, 7, 40, 100, 10_000])
@pytest.mark.parametrize("granularity", ["layer", "tick"])
def test_synthetic_equal(synth_preps, cls, slots, granularity):
    for prep in synth_preps:
        assert_same(prep, cls, slots, granularity)


@pytest.mark.parametrize("cls", CLASSES)
def test_admit_all_equal(synth_preps, cls):
    # belady_skip under ADMIT_ALL neither ranks nor filters: it is plain MIN.
    for prep in synth_preps:
        for slots in (3, 30):
            assert_same(prep, cls, slots, "layer", admit_all=True)


@pytest.mark.skipif(not FLAME.exists(), reason="FLAME trace not present")
@pytest.mark.parametrize("cls", CLASSES)
def test_flame_equal(cls):
    prep = Prepared(load_trace(FLAME))
    for slots in (51, 205):
        assert_same(prep, cls, slots)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(2, 6),
    st.integers(1, 14),
    st.integers(1, 30),
    st.sampled_from(CLASSES),
    st.sampled_from(["layer", "tick"]),
    st.integers(0, 2**31 - 1),
)
def test_random_traces_equal(n_layers, n_experts, n_ticks, slots, cls, granularity, seed):
    assert_same(Prepared(_random_trace(n_layers, n_experts, n_ticks, seed)), cls, slots, granularity)


def test_python_loop_where_native_is_not_exact(synth_preps):
    prep = synth_preps[0]
    used = BeladyPolicy(prep.n_keys, 8, next_use=prep.next_use)
    used.on_access(prep.dkeys[:3])  # not fresh: its cursor has moved
    assert replay_min_native(prep, used, 8, "layer", ADMIT_ALL) is None
    other = BeladyPolicy(prep.n_keys, 8, next_use=prep.next_use.copy())  # another oracle
    assert replay_min_native(prep, other, 8, "layer", ADMIT_ALL) is None

    class Custom(BeladyPolicy):  # a subclass may change any rule: Python only
        pass

    assert (
        replay_min_native(prep, Custom(prep.n_keys, 8, next_use=prep.next_use), 8, "layer", ADMIT_ALL) is None
    )


def test_min_stays_the_ceiling_of_demand_fill(synth_preps):
    # What the ceiling is for: no demand policy, replayed natively, beats MIN's bandwidth
    # view, and none with a filter beats MIN that may skip.
    prep = synth_preps[1]
    res = {
        (r.policy, r.slots): r
        for r in runner.replay(prep, ["lru", "hybrid", "phase", "auto", "belady", "belady_skip"], [10, 40])
    }
    for slots in (10, 40):
        mn, skip = res[("belady", slots)], res[("belady_skip", slots)]
        assert skip.bandwidth_hit_rate >= mn.bandwidth_hit_rate - 1e-12
        for name in ("lru", "hybrid", "phase", "auto"):
            assert res[(name, slots)].bandwidth_hit_rate <= skip.bandwidth_hit_rate + 1e-12
        assert res[("lru", slots)].bandwidth_hit_rate <= mn.bandwidth_hit_rate + 1e-12


def test_binding_refuses_arrays_that_disagree(synth_preps):
    prep = synth_preps[0]
    n = prep.dkeys.size
    args = [
        np.ascontiguousarray(prep.dkeys, dtype=np.int64),
        np.ones(n, dtype=np.int64),
        True,
        np.ascontiguousarray(prep.gstarts, dtype=np.int64),
        np.ascontiguousarray(prep.g_tick_end, dtype=bool),
    ]
    nxt = np.full(prep.n_keys, 1 << 62, dtype=np.int64)
    with pytest.raises(ValueError, match="next_use"):
        _C.replay_min(
            *args,
            np.zeros(n - 1, dtype=np.int64),
            4,
            False,
            nxt,
            np.zeros(prep.n_keys, dtype=bool),
            np.zeros(n, dtype=bool),
        )
    with pytest.raises(ValueError, match="next and resident"):
        _C.replay_min(
            *args,
            np.zeros(n, dtype=np.int64),
            4,
            False,
            nxt,
            np.zeros(prep.n_keys + 1, dtype=bool),
            np.zeros(n, dtype=bool),
        )
    with pytest.raises(IndexError):  # a key past the policy's arrays
        _C.replay_min(
            *args,
            np.zeros(n, dtype=np.int64),
            4,
            False,
            nxt[:3],
            np.zeros(3, dtype=bool),
            np.zeros(n, dtype=bool),
        )
