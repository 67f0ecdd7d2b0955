"""The native demand replays (tierstore.sim.native_replay: csrc/store/src/replay.cpp,
auto_replay.cpp) against the Python loop (replay_demand_fill(native=False), the
oracle). Both run the one implementation of the rules (policies/native.py over
csrc/store/src/policy.cpp, and auto's AutoCore, csrc/store/src/auto_core.cpp, which
the Python loop calls once per group as the live store does); what this compares is
the replay loops themselves: their
incremental resident orders (phase's buckets), fills, grouping of accesses and, for
auto, the shadows and the leader's decisions. Same hits, reads, evictions and
rejections, and the policy left in the same state, for lru / heat / hybrid / phase /
auto at several capacities on the FLAME trace (when the shared copy is present),
synthetic traces and random small ones (test_native_policies_golden.py pins both to
the Python implementation the C++ rules replaced)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierstore import policies
from tierstore.errors import ConfigError
from tierstore.policies.admission import ADMIT_ALL
from tierstore.policies.auto import AutoPolicy
from tierstore.policies.blend import BlendPolicy
from tierstore.sim.counting import Prepared
from tierstore.sim.demand import replay_demand_fill
from tierstore.sim.native_replay import native_filter
from tierstore.sim.synth import synthetic_trace
from tierstore.sim.traces import Trace, load_trace

_C = pytest.importorskip("tierstore._C")
if not hasattr(_C, "replay_demand"):
    pytest.skip("extension built without replay_demand", allow_module_level=True)

FLAME = Path(
    os.environ.get("TIERSTORE_FLAME_TRACE", "/work/shared/traces/flame_moe_290m_pretrain_2048tok.npy")
)
NAMES = ("lru", "heat", "hybrid", "phase", "blend")


def _make(name, n_keys, capacity, **params):
    # blend is built directly: the registry lists it once the tuning branch registers it.
    if name == "blend":
        return BlendPolicy(n_keys, capacity, **params)
    return policies.make(name, n_keys, capacity, **params)


def _state(p) -> dict:
    if isinstance(p, AutoPolicy):  # every shadow's state, the scores and the leader
        out = {f"{i}.{k}": v for i, e in enumerate(p.experts) for k, v in _state(e).items()}
        out.update(
            scores=p.expert_scores.copy(),
            leader=p.leader,
            _resident=p._resident.copy(),
            _n_resident=p._n_resident,
        )
        return out
    out = {
        k: getattr(p, k)
        for k in ("_clock", "_t", "_base", "_gain", "_n_resident", "_group", "_per_tick")
        if hasattr(p, k)
    }
    out.update(
        {k: getattr(p, k).copy() for k in ("_last", "_raw", "_pos", "_raw2", "_resident") if hasattr(p, k)}
    )
    return out


def assert_same(prep: Prepared, name: str, slots: int, granularity="layer", admission=None, **params) -> None:
    n_keys = prep.n_keys
    fast, slow = (_make(name, n_keys, slots, **params) for _ in range(2))
    adm_f = admission(fast) if admission else None
    adm_s = admission(slow) if admission else None
    assert native_filter(fast, adm_f if adm_f is not None else _default(fast)) is not None
    a = replay_demand_fill(prep, fast, slots, granularity, adm_f)
    b = replay_demand_fill(prep, slow, slots, granularity, adm_s, native=False)
    where = f"{name} slots={slots} {granularity}"
    assert np.array_equal(a.hit, b.hit), where
    assert (a.demand_reads, a.evictions, a.rejected) == (b.demand_reads, b.evictions, b.rejected), where
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
    return [
        Prepared(
            synthetic_trace(
                96, batch=1, prefill_tokens=64, prefill_every=48, n_layers=6, n_experts=32, seed=3
            )
        ),
        Prepared(synthetic_trace(64, batch=4, prefill_tokens=0, n_layers=5, n_experts=24, seed=5)),
    ]


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
@given(
    st.integers(1, 4),
    st.integers(2, 6),
    st.integers(1, 12),
    st.integers(1, 30),
    st.sampled_from(NAMES),
    st.integers(0, 2**31 - 1),
)
def test_random_traces_equal(n_layers, n_experts, n_ticks, slots, name, seed):
    rng = np.random.default_rng(seed + 1)
    params = {} if name == "lru" else {"half_life": float(rng.choice([0.3, 4.0, 256.0]))}
    assert_same(Prepared(_random_trace(n_layers, n_experts, n_ticks, seed)), name, slots, **params)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(4, 12),
    st.integers(1, 16),
    st.integers(1, 20),
    st.sampled_from(["layer", "tick"]),
    st.integers(0, 2**31 - 1),
)
def test_lru_list_ties_equal(n_layers, n_experts, n_ticks, slots, granularity, seed):
    # lru's resident order is a linked list (resident_order.hpp): the keys of one access
    # call share a tick and tie-break by id, so a key linked after a greater id of its
    # call walks back past it. Wide groups make many ties; with the lru shadow leading
    # auto (first on equal scores) its mirror of the real set links keys stamped by the
    # access call behind keys the shadow's admission stamped later (the walk past them).
    # Breaking the tie the other way fails this test.
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(n_ticks):
        for layer in range(n_layers):
            for e in sorted(
                rng.choice(n_experts, size=rng.integers(1, n_experts), replace=False), reverse=True
            ):
                rows.append((t, layer, int(e)))
    rows = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
    prep = Prepared(
        Trace(
            rows[:, 0],
            rows[:, 1].astype(np.int32),
            rows[:, 2].astype(np.int32),
            np.arange(n_layers, dtype=np.int64),
            n_experts,
        )
    )
    assert_same(prep, "lru", slots, granularity)
    from tierstore.policies import auto as auto_module

    saved = auto_module._experts
    try:
        auto_module._experts = lambda n, c: [
            policies.make("lru", n, c),
            policies.make("hybrid", n, c, half_life=4.0),
        ]
        assert_same(prep, "auto", slots, granularity)
    finally:
        auto_module._experts = saved


def _random_trace(n_layers, n_experts, n_ticks, seed) -> Trace:
    rng = np.random.default_rng(seed)
    rows = rng.integers(1, 8, size=n_ticks)
    ticks = np.repeat(np.arange(n_ticks, dtype=np.int64), rows)
    layers = rng.integers(0, n_layers, size=ticks.size).astype(np.int32)
    experts = rng.integers(0, n_experts, size=ticks.size).astype(np.int32)
    order = np.lexsort((layers, ticks))
    return Trace(ticks[order], layers[order], experts[order], np.arange(n_layers, dtype=np.int64), n_experts)


@pytest.mark.parametrize("slots", [1, 9, 40])
@pytest.mark.parametrize("granularity", ["layer", "tick"])
def test_auto_synthetic_equal(synth_preps, slots, granularity):
    # The self-tuning policy: twelve shadows, the leader's decisions, scores and leader.
    for prep in synth_preps:
        assert_same(prep, "auto", slots, granularity)
    assert_same(synth_preps[0], "auto", 9, granularity, admission=lambda p: ADMIT_ALL)


@pytest.mark.skipif(not FLAME.exists(), reason="FLAME trace not present")
def test_auto_flame_equal():
    # The Python auto loop runs ~1e3 accesses/s: the first 4% of FLAME (82 ticks).
    prep = Prepared(load_trace(FLAME).split(0.04)[0])
    for slots in (51, 205):
        assert_same(prep, "auto", slots)


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 4), st.integers(2, 6), st.integers(1, 10), st.integers(1, 20), st.integers(0, 2**31 - 1)
)
def test_auto_random_traces_equal(n_layers, n_experts, n_ticks, slots, seed):
    assert_same(Prepared(_random_trace(n_layers, n_experts, n_ticks, seed)), "auto", slots)


def test_auto_expert_list_is_data(monkeypatch):
    # Any expert list of native kinds replays natively: one phase expert alone, then a
    # shorter, reordered list (auto.py's list may change), each exact.
    from tierstore.policies import auto as auto_module

    prep = Prepared(synthetic_trace(48, batch=2, prefill_tokens=0, n_layers=4, n_experts=16, seed=11))
    for make_experts in (
        lambda n, c: [policies.make("phase", n, c, half_life=8.0)],
        lambda n, c: [
            policies.make("lru", n, c),
            policies.make("hybrid", n, c, half_life=64.0),
            policies.make("heat", n, c, half_life=4.0),
        ],
        # the tuning branch's nine experts: blend first
        lambda n, c: (
            [BlendPolicy(n, c, half_life=h) for h in (16, 4, 64, 2, 256)]
            + [
                policies.make("phase", n, c, half_life=16.0),
                policies.make("hybrid", n, c, half_life=512.0),
                policies.make("heat", n, c, half_life=128.0),
                policies.make("lru", n, c),
            ]
        ),
    ):
        monkeypatch.setattr(auto_module, "_experts", make_experts)
        for slots in (5, 12):
            assert_same(prep, "auto", slots)


def test_not_native_where_inexact():
    # A wall-clock heat or a policy already holding keys stay on the Python loop.
    assert policies.make("heat", 10, 4, half_life_s=1.0).native_state() is None
    assert policies.make("hybrid", 10, 4, half_life_s=1.0).native_state() is None
    p = policies.make("lru", 10, 4)
    p.on_admit(np.array([3]))
    assert native_filter(p, ADMIT_ALL) is None


def test_auto_refuses_an_expert_without_a_step_clock_core(monkeypatch):
    # auto's rules are native only: a wall-clock expert is a configuration error, not a
    # silent Python fallback.
    from tierstore.policies import auto as auto_module

    monkeypatch.setattr(
        auto_module,
        "_experts",
        lambda n, c: [policies.make("lru", n, c), policies.make("heat", n, c, half_life_s=2.0)],
    )
    with pytest.raises(ConfigError, match="expert 'heat' has no native core"):
        policies.make("auto", 10, 4)
