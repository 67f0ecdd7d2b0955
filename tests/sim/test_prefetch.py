"""The prefetcher (tierstore/policies/prefetch.py) and its replay
(tierstore/sim/prefetching.py): properties over generated routing.

- the budget: a proposal's expected cost (sum of 1 - calibrated p) never exceeds
  the credit, it fetches only non-resident keys of its target layer, and what it
  fetches is held; with ``read_ratio = 0`` nothing is ever fetched;
- a prefetch that pays for itself needs no credit: told the true routes, the
  prefetcher over LRU (no savings to spend) fetches every later miss and its
  reads stay at LRU's;
- an inaccurate model spends (almost) nothing: on routing with no structure the
  calibrated probabilities stay at chance, so after its first few proposals
  nothing is fetched and the tier is about its demand policy;
- a prefill (many tokens in one read) predicts its next layer near-whole;
- reads are counted: the prefetcher's reads are the replay's (demand + prefetch)
  and its shadow's are exactly LRU's demand fill;
- only the past is used: changing the ticks after T changes no decision before T;
- the model registered in the simulator reports the latency view with reads.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierstore import policies, sim
from tierstore.errors import ConfigError
from tierstore.policies.prefetch import Prefetcher
from tierstore.sim import Prepared, replay_demand_fill, synth
from tierstore.sim.prefetch_bound import ToldPrefetcher, routes_table
from tierstore.sim.prefetching import replay_prefetching, replay_with_prefetch
from tierstore.sim.traces import Trace


def _trace(rng, n_ticks, n_layers, n_experts, top_k, sticky) -> Trace:
    """Routing with some structure to learn: each layer's experts follow the previous
    layer's (a fixed random map) with probability ``sticky``, else are random."""
    perm = rng.permutation(n_experts)
    rows = []
    for t in range(n_ticks):
        prev = rng.choice(n_experts, top_k, replace=False)
        for layer in range(n_layers):
            follow = rng.random(top_k) < sticky
            ids = np.where(follow, perm[(prev + layer) % n_experts], rng.integers(0, n_experts, top_k))
            ids = np.unique(ids)
            rows += [(t, layer, int(e)) for e in ids]
            prev = ids if ids.size == top_k else prev
    arr = np.array(rows, dtype=np.int64)
    return Trace(
        arr[:, 0],
        arr[:, 1].astype(np.int32),
        arr[:, 2].astype(np.int32),
        np.arange(n_layers, dtype=np.int64),
        n_experts,
        "generated",
    )


class LoggingPrefetcher(Prefetcher):
    """Records every proposal with the credit and cap it was made under."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.log = []
        self.tick = 0

    def propose(self, layer, resident, victims=None):
        credit = self.credit()
        res = resident.copy()
        fetch, hold = super().propose(layer, resident, victims)
        self.log.append((self.tick, layer, credit, self.last_cost, res, fetch.copy(), hold.copy()))
        return fetch, hold

    def end_tick(self):
        super().end_tick()
        self.tick += 1


shapes = st.tuples(
    st.integers(8, 40),
    st.integers(2, 5),
    st.integers(4, 16),
    st.integers(1, 4),
    st.floats(0.0, 1.0),
    st.integers(0, 2**31 - 1),
    st.floats(0.1, 0.6),
    st.sampled_from([0.0, 0.5, 1.0, 2.0]),
    st.sampled_from(["lru", "hybrid", "heat"]),
)


@settings(max_examples=40, deadline=None)
@given(shapes)
def test_proposals_respect_the_budget_and_reads_are_counted(shape):
    n_ticks, L, E, k, sticky, seed, frac, ratio, name = shape
    k = min(k, E)
    trace = _trace(np.random.default_rng(seed), n_ticks, L, E, k, sticky)
    prep = Prepared(trace)
    slots = max(1, int(trace.n_keys * frac))
    pf = LoggingPrefetcher(L, E, slots, read_ratio=ratio)
    cnt = replay_prefetching(prep, policies.make(name, trace.n_keys, slots, prefetching=True), slots, pf)
    for _tick, layer, credit, cost, res, fetch, hold in pf.log:
        assert fetch.size == 0 or cost <= max(credit, 0.0) + 1e-9  # expected reads in credit
        target = (layer + 1) % L
        assert np.all(fetch // E == target) and np.all(hold // E == target)
        assert not res[fetch].any()  # only rows not already there are read
        assert np.isin(fetch, hold).all() and np.unique(hold).size == hold.size
    if ratio == 0.0:
        assert pf.issued == 0 and cnt.prefetched == 0
    # Reads counted: the budget's view is the replay's, whenever every fetch got a slot.
    assert pf.issued >= cnt.prefetched
    if pf.issued == cnt.prefetched:
        assert pf.reads == cnt.demand_reads + cnt.prefetched
    lru = replay_demand_fill(prep, policies.make("lru", trace.n_keys, slots), slots)
    assert pf.lru_reads == lru.demand_reads  # the shadow is LRU, exactly
    assert 0 <= pf.useful <= pf.issued
    assert not pf.held_mask.any() or pf.held_mask.sum() == sum(h.size for h in pf._held)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(4, 20), st.sampled_from(["hybrid", "auto"]))
def test_decisions_up_to_t_use_only_the_past(seed, cut, name):
    """Two traces equal before tick ``cut`` (the second's later ticks permuted and
    re-drawn): every proposal and hit before ``cut`` is the same."""
    rng = np.random.default_rng(seed)
    a = _trace(rng, 30, 3, 10, 3, 0.7)
    tick_of = a.ticks
    later = tick_of >= cut
    b_rows = a.to_rows().copy()
    tail = b_rows[later]
    ticks = np.unique(tail[:, 0])
    perm = dict(zip(ticks.tolist(), rng.permutation(ticks).tolist()))
    tail[:, 0] = [perm[t] for t in tail[:, 0].tolist()]
    tail[:, 2] = (tail[:, 2] + rng.integers(0, 10, len(tail))) % 10
    b_rows[later] = tail
    b_rows = b_rows[np.lexsort((b_rows[:, 2], b_rows[:, 1], b_rows[:, 0]))]
    b_rows = np.unique(b_rows, axis=0)
    b = Trace(
        b_rows[:, 0].astype(np.int64),
        b_rows[:, 1].astype(np.int32),
        b_rows[:, 2].astype(np.int32),
        a.layer_ids,
        a.n_experts,
        "permuted",
    )
    logs, hits = [], []
    for tr in (a, b):
        prep = Prepared(tr)
        pf = LoggingPrefetcher(3, 10, 9, read_ratio=1.5)
        cnt = replay_prefetching(prep, policies.make(name, tr.n_keys, 9, prefetching=True), 9, pf)
        logs.append([e for e in pf.log if e[0] < cut])
        hits.append(cnt.hit[prep.dtick < cut])
    assert len(logs[0]) == len(logs[1])
    for x, y in zip(*logs):
        assert x[:2] == y[:2] and x[2] == y[2]
        assert np.array_equal(x[5], y[5]) and np.array_equal(x[6], y[6])
    assert np.array_equal(hits[0], hits[1])


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 5), st.integers(6, 16), st.floats(0.1, 0.5))
def test_reads_that_pay_for_themselves_need_no_credit(seed, L, E, frac):
    """Told the true routes, the prefetcher over LRU (which saves nothing to spend)
    still fetches: a correct prefetch replaces the demand read it anticipates. Its
    reads stay at LRU's and every later access hits."""
    trace = _trace(np.random.default_rng(seed), 30, L, E, 3, 0.5)
    prep = Prepared(trace)
    slots = max(2 * 3 + 2, int(trace.n_keys * frac))
    pf = ToldPrefetcher(routes_table(prep), L, E, slots)
    cnt = replay_prefetching(prep, policies.make("lru", trace.n_keys, slots), slots, pf)
    lru = replay_demand_fill(prep, policies.make("lru", trace.n_keys, slots), slots)
    assert cnt.prefetched == cnt.prefetch_hits > 0 and cnt.wasted == 0
    # Reads at LRU's: a prefetch evicts before the layer's own misses do, so the
    # victims (and a read or two) may differ from plain LRU's.
    assert cnt.demand_reads + cnt.prefetched <= 1.05 * lru.demand_reads + L
    # Only the first read group of the trace can miss (nothing predicted it).
    first = prep.gstarts[1]
    assert cnt.hit[first:].all()


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from(["lru", "hybrid"]))
def test_an_inaccurate_model_spends_nothing(seed, name):
    """Routing with no structure (uniform, independent): the calibrated
    probabilities stay at chance, below the price, so (almost) nothing is fetched
    and the tier loses at most what those few fetches evicted, plus the noise of
    the holds: a held resident key (free, no read) turns the victim to another
    key, which at chance is as likely to be wanted next, a +-1 walk (300 seeds x
    2 policies: worst loss 1 hit with nothing fetched, a gain on average)."""
    rng = np.random.default_rng(seed)
    n_ticks, L, E, k = 120, 3, 32, 2
    rows = [
        (t, layer, int(e))
        for t in range(n_ticks)
        for layer in range(L)
        for e in rng.choice(E, k, replace=False)
    ]
    arr = np.array(rows, dtype=np.int64)
    arr = arr[np.lexsort((arr[:, 2], arr[:, 1], arr[:, 0]))]
    trace = Trace(
        arr[:, 0],
        arr[:, 1].astype(np.int32),
        arr[:, 2].astype(np.int32),
        np.arange(L, dtype=np.int64),
        E,
        "uniform",
    )
    prep = Prepared(trace)
    slots = 24
    cnt, pf = replay_with_prefetch(
        prep, policies.make(name, trace.n_keys, slots, prefetching=True), slots, read_ratio=1.0, top_k=k
    )
    base = replay_demand_fill(
        prep, policies.make(name, trace.n_keys, slots, prefetching=True), slots, native=False
    )
    # Chance is p = k / E = 0.06, below the lowest price: only the first proposals,
    # before the calibration has seen outcomes, may fetch (seeds 0-999 x both policies:
    # median 0, p99 3.5 %, max 5.5 % of the demand reads; hypothesis found 5.04 %, seed
    # 11671, past the former 5 % bound, the same with the Python implementation of 848e399).
    assert cnt.prefetched <= 0.06 * base.demand_reads
    assert pf.held_resident > 0  # the holds ran, so the bound below covers them
    noise = max(3, int(0.02 * base.hit.sum()))
    assert cnt.hit.sum() >= base.hit.sum() - 2 * cnt.prefetched - noise


def test_a_prefill_predicts_its_next_layer_near_whole():
    """A read of many tokens (routings = 40 tokens x k) is one weak observation
    of co-routing, and the next layer of the same tick is predicted routed by any
    of its tokens: 1 - (1 - q)^tokens, near 1 for every expert."""
    L, E, k = 3, 16, 2
    pf = Prefetcher(L, E, 40, read_ratio=2.0, top_k=k)
    experts = np.arange(E)
    pf.on_read(0, experts, np.zeros(E, dtype=bool), routings=40 * k)
    fetch, hold = pf.propose(0, np.zeros(L * E, dtype=bool))
    assert set(fetch.tolist()) == set(range(E, 2 * E))  # the whole of layer 1, nothing else
    assert pf.last_cost < 0.1 * E  # each nearly pays for itself
    # A single token's read (decode) predicts about k experts, not the layer.
    pf2 = Prefetcher(L, E, 40, read_ratio=2.0, top_k=k)
    pf2.on_read(0, experts[:k], np.zeros(k, dtype=bool), routings=k)
    p = pf2.predict(0, 1, False)
    assert p.sum() == pytest.approx(k)


def test_prefetch_model_in_the_simulator_reports_the_latency_view():
    trace = synth.synthetic_trace(160, n_layers=6, n_experts=32, top_k=4, prefill_tokens=0, seed=3)
    res = {r.policy: r for r in sim.replay(trace, ["lru", "belady", "auto", "auto+prefetch"], [40])}
    r, lru = res["auto+prefetch"], res["lru"]
    assert r.prefetched > 0 and r.reads == r.demand_reads + r.prefetched
    # Budgeted against LRU's reads as they happen: a base policy's lead over LRU can
    # shrink after the credit was spent, so a short trace may end a little over
    # (bench/hits_eval.py makes the strict comparison on long traces).
    assert r.reads <= 1.02 * lru.reads
    # Comparable in the latency view exactly when it read no more than LRU.
    assert (r.latency_gap_closed is not None) == (r.reads <= lru.reads)
    assert r.latency_hit_rate >= res["auto"].latency_hit_rate - 0.02


def test_bad_parameters_are_config_errors():
    with pytest.raises(ConfigError, match="lead"):
        Prefetcher(4, 8, 10, lead=4)
    with pytest.raises(ConfigError, match="read_ratio"):
        Prefetcher(4, 8, 10, read_ratio=-1)
    with pytest.raises(ConfigError, match="granularity"):
        sim.replay(
            synth.synthetic_trace(4, n_layers=2, n_experts=8, top_k=2, prefill_tokens=0),
            ["auto+prefetch"],
            [4],
            granularity="tick",
        )
    with pytest.raises(ConfigError, match="unknown policy"):
        sim.replay(
            synth.synthetic_trace(4, n_layers=2, n_experts=8, top_k=2, prefill_tokens=0),
            ["nosuch+prefetch"],
            [4],
        )
    prep = Prepared(synth.synthetic_trace(4, n_layers=2, n_experts=8, top_k=2, prefill_tokens=0))
    with pytest.raises(ConfigError, match="prefetcher built"):
        replay_prefetching(prep, policies.make("lru", 16, 4), 4, Prefetcher(2, 8, 5))
    cnt, pf = replay_with_prefetch(prep, policies.make("lru", 16, 4), 4, read_ratio=0.0)
    assert pf.issued == 0 and cnt.prefetched == 0
