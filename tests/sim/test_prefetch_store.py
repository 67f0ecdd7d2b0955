"""The live store's prefetch hook and the simulator's prefetching replay run the
same Prefetcher in the same order (store/prefetch.py, sim/prefetching.py), so a
CPU-pool store driven a layer at a time and the replay agree exactly: hits,
reads (demand + prefetch), evictions and the prefetcher's own counts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tierstore as ts
from tierstore import policies
from tierstore.errors import ConfigError
from tierstore.policies.admission import ADMIT_ALL
from tierstore.sim import Prepared, synth, traces
from tierstore.sim.prefetching import replay_with_prefetch
from tierstore.testing.packs import make_random_pack

FLAME = Path("/work/shared/traces/flame_moe_290m_pretrain_2048tok.npy")


def _traces():
    out = [
        (
            "synthetic",
            synth.synthetic_trace(
                80, n_layers=4, n_experts=16, top_k=3, prefill_tokens=6, prefill_every=40, seed=2
            ),
        ),
        (
            "synthetic-batch3",
            synth.synthetic_trace(50, batch=3, n_layers=3, n_experts=12, top_k=2, prefill_tokens=0, seed=7),
        ),
    ]
    if FLAME.exists():  # the shared trace, its first 160 ticks
        tr = traces.load_trace(FLAME)
        out.append(("flame", tr.split(160 / tr.n_ticks)[0]))
    return out


TRACES = _traces()


def drive_store(store, trace) -> int:
    """A forward a layer at a time: record (the hook proposes and queues its reads),
    wait for the worker (a deterministic landing), fire the layer's experts,
    release; step() per tick. Returns the distinct hits."""
    E = trace.n_experts
    keys, starts = trace.keys, trace.tick_starts
    hits = 0
    for i in range(starts.size - 1):
        k = keys[starts[i] : starts[i + 1]]
        for g in np.split(k, np.flatnonzero(np.diff(k // E)) + 1):
            layer = int(g[0] // E)
            store.record(layer, (g % E).astype(np.int64))
            store.wait_idle()
            u = np.unique(g)
            fr = store.fire(np.stack([u // E, u % E], axis=1))
            hits += fr.already_resident
            store.release(fr)
        store.step()
    return hits


@pytest.mark.parametrize("label, trace", TRACES, ids=[t[0] for t in TRACES])
@pytest.mark.parametrize("name", ["lru", "hybrid", "auto"])
def test_store_prefetch_and_simulator_agree_exactly(tmp_path, label, trace, name):
    prep = Prepared(trace)
    per_layer = int(np.diff(prep.gstarts).max())
    slots = max(3 * per_layer, trace.n_keys // 5)  # a layer's fire always fits beside the pins
    params = {} if name == "auto" else ({"half_life": 32.0} if name == "hybrid" else {})
    # Reads beyond LRU's, so even an LRU base prefetches; the store is told top_k (the
    # replay reads it from the trace) to count a group's tokens the same way.
    budget = {"read_ratio": 1.5, "top_k": int(trace.meta["top_k"])}
    # prefetching=True: the base <policy>+prefetch and the store's prefetch= both build
    base = policies.make(name, trace.n_keys, slots, prefetching=True, **params)
    cnt, pf = replay_with_prefetch(prep, base, slots, admission=ADMIT_ALL, **budget)
    pack = make_random_pack(tmp_path / "pack", trace.n_layers, trace.n_experts, 64, seed=1)
    with ts.ExpertStore(
        pack,
        vram_slots=slots,
        ram_gb=0,
        device="cpu",
        policy={"name": name, **params},
        lazy_per_step=0,
        max_promote=trace.n_keys,
        threads=1,
        prefetch=budget,
    ) as store:
        assert getattr(store.pool_policy, "prefetching", True)  # auto told, as the replay's
        hits = drive_store(store, trace)
        store.check_invariants()
        st = store.stats()
        got = store.prefetch.counts()
    assert hits == int(cnt.hit.sum())
    assert int(st.pool.hits) == int(prep.dcounts[cnt.hit].sum())
    assert int(st.pool.promotions) == cnt.demand_reads + cnt.prefetched  # every read
    assert int(st.pool.evictions) == cnt.evictions
    assert got["issued"] == pf.issued == cnt.prefetched  # every proposal got a slot
    assert got["useful"] == pf.useful and got["lru_reads"] == pf.lru_reads
    assert got["held_resident"] == pf.held_resident
    assert pf.issued > 0 and pf.useful > 0  # the trace exercises prefetch


def test_store_prefetch_option_is_checked(tmp_path):
    pack = make_random_pack(tmp_path / "pack", 2, 4, 64, seed=1)
    with pytest.raises(ConfigError, match="prefetch"):
        ts.ExpertStore(pack, vram_slots=4, device="cpu", prefetch="yes")
    with pytest.raises(ConfigError, match="lead"):
        ts.ExpertStore(pack, vram_slots=4, device="cpu", prefetch={"lead": 5})
