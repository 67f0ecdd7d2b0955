"""The live store replayed as a policy: a CPU-pool ExpertStore over a real pack and
``tierstore.sim`` give identical hits, misses and reads on the same trace, because
both decide through ``tierstore.policies.fill`` (exact agreement, so the simulator's
hit rates are the store's)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tierstore as ts
from tierstore import policies
from tierstore.policies.admission import ADMIT_ALL
from tierstore.sim import Prepared, replay_demand_fill, replay_lazy, synth, traces
from tierstore.testing.packs import make_random_pack
from tierstore.testing.store_replay import replay_store

FLAME = Path("/work/shared/traces/flame_moe_290m_pretrain_2048tok.npy")


def _first_ticks(trace, n):
    return trace.split(n / trace.n_ticks)[0]


def _traces():
    out = [
        (
            "synthetic",
            synth.synthetic_trace(
                60, n_layers=4, n_experts=16, top_k=3, prefill_tokens=6, prefill_every=30, seed=2
            ),
        ),
        (
            "synthetic-batch4",
            synth.synthetic_trace(40, batch=4, n_layers=3, n_experts=12, top_k=2, prefill_tokens=0, seed=7),
        ),
    ]
    if FLAME.exists():  # the shared trace (first 150 ticks keeps the test fast)
        out.append(("flame", _first_ticks(traces.load_trace(FLAME), 150)))
    return out


TRACES = _traces()


def _store(tmp_path, trace, slots, name, params, lazy=0):
    pack = make_random_pack(tmp_path / "pack", trace.n_layers, trace.n_experts, 64, seed=1)
    return ts.ExpertStore(
        pack,
        vram_slots=slots,
        ram_gb=0,
        device="cpu",
        policy={"name": name, **params},
        lazy_per_step=lazy,
        max_promote=trace.n_keys,
        threads=1,
    )


def _sim_policy(trace, slots, name, params):
    return policies.make(name, trace.n_keys, slots, **params)


@pytest.mark.parametrize("label, trace", TRACES, ids=[t[0] for t in TRACES])
@pytest.mark.parametrize(
    "name, params",
    [
        ("lru", {}),
        ("heat", {"half_life": 16.0}),
        ("hybrid", {"half_life": 64.0}),
        ("auto", {}),
        ("phase", {"half_life": 64.0}),
    ],
)
@pytest.mark.parametrize("granularity", ["layer", "tick"])
def test_store_fires_and_simulator_demand_fill_agree_exactly(
    tmp_path, label, trace, name, params, granularity
):
    prep = Prepared(trace)
    per_tick = int(np.diff(prep.dstarts).max())
    slots = max(per_tick + 2, trace.n_keys // 4)  # a tick's keys always fit (no fire overflow)
    cnt = replay_demand_fill(
        prep, _sim_policy(trace, slots, name, params), slots, granularity, admission=ADMIT_ALL
    )
    with _store(tmp_path, trace, slots, name, params) as store:
        got = replay_store(store, trace, "fire", granularity)
        store.check_invariants()
    assert got.distinct_hits == int(cnt.hit.sum())
    assert got.token_hits == int(prep.dcounts[cnt.hit].sum())
    assert got.reads == cnt.demand_reads  # misses = accesses - hits follow
    assert got.evictions == cnt.evictions
    assert 0 < got.distinct_hits < prep.dkeys.size  # the trace exercises both outcomes


@pytest.mark.parametrize("label, trace", TRACES, ids=[t[0] for t in TRACES])
@pytest.mark.parametrize("name", ["hybrid", "heat", "auto"])
def test_store_lazy_promotions_and_simulator_lazy_model_agree_exactly(tmp_path, label, trace, name):
    prep = Prepared(trace)
    slots = trace.n_keys // 4
    params = {} if name == "auto" else {"half_life": 32.0}
    cnt = replay_lazy(prep, _sim_policy(trace, slots, name, params), slots, 8)
    with _store(tmp_path, trace, slots, name, params, lazy=8) as store:
        got = replay_store(store, trace, "lazy")
        store.check_invariants()
        rejected = store.stats().lazy_rejected
    assert got.distinct_hits == int(cnt.hit.sum())
    assert got.token_hits == int(prep.dcounts[cnt.hit].sum())
    assert got.reads == cnt.demand_reads and got.evictions == cnt.evictions
    assert rejected == cnt.rejected
    assert got.reads > 0
