"""The blend policy: phase over the mean of a short and a 32x longer use rate."""

from __future__ import annotations

import time

import numpy as np
import pytest

import tierstore as ts
from tierstore import policies
from tierstore.policies.admission import ADMIT_ALL
from tierstore.policies.blend import LONG_RATIO
from tierstore.sim import Prepared, replay_demand_fill, replay_lazy, synth
from tierstore.testing.packs import make_random_pack
from tierstore.testing.store_replay import replay_store


def _steady_then_one_hit(name):
    """Key 0 read one tick in four for 200 ticks, key 1 read once, the tick before."""
    p = policies.make(name, 4, 2, half_life=2.0)
    for t in range(200):
        p.on_access([0] if t % 4 == 0 else [3])
        p.decay()
    p.on_access([1])
    p.decay()
    p.on_admit([0, 1])
    p.on_access([2])
    return p


def test_blend_keeps_the_key_that_keeps_coming_back_where_phase_keeps_the_last_one():
    # At a 2-step half-life key 1's single recent read outweighs key 0's history,
    # so phase evicts key 0; blend's long memory (64 steps) keeps key 0.
    assert _steady_then_one_hit("phase").victims(1).tolist() == [0]
    assert _steady_then_one_hit("blend").victims(1).tolist() == [1]


def test_blend_rate_is_the_mean_of_its_two_half_lives():
    rng = np.random.default_rng(3)
    b = policies.make("blend", 20, 20, half_life=4.0)
    short = policies.make("heat", 20, 20, half_life=4.0)
    long_ = policies.make("heat", 20, 20, half_life=4.0 * LONG_RATIO)
    assert b.long_half_life == 4.0 * LONG_RATIO
    for _ in range(30):
        keys = rng.choice(20, 4, replace=False)
        w = rng.integers(1, 4, 4).astype(float)
        for p in (b, short, long_):
            p.on_access(keys, w)
            p.decay()
    want = 0.5 * (
        short.scores() * (1 - 2 ** (-1 / 4.0)) + long_.scores() * (1 - 2 ** (-1 / (4.0 * LONG_RATIO)))
    )
    # One call per tick: every key is a whole tick away, so blend evicts by rate alone.
    b.on_admit(np.arange(20))
    assert b.victims(20).tolist() == np.argsort(want, kind="stable").tolist()
    # Admission is hybrid's on the short heat: hotter candidate only.
    hot, cold = int(np.argmax(short.scores())), int(np.argmin(short.scores()))
    assert b.admit(hot, cold) and not b.admit(cold, hot)
    b.reset()
    assert b.scores().max() == 0 and b.resident().size == 0


def test_blend_on_the_wall_clock_decays_both_memories():
    p = policies.make("blend", 4, 2, half_life_s=1.0)
    t = time.monotonic() + 5.0
    p.on_access([0], now=t)
    p.decay(now=t + 1.0)
    # one half-life later: the short heat halved, the long one (32 s) not
    assert p.scores()[0] == pytest.approx(0.5)
    assert p.long_half_life == LONG_RATIO


@pytest.mark.parametrize("granularity", ["layer", "tick"])
@pytest.mark.parametrize(
    "trace",
    [
        synth.synthetic_trace(
            60, n_layers=4, n_experts=16, top_k=3, prefill_tokens=6, prefill_every=30, seed=2
        ),
        synth.synthetic_trace(40, batch=4, n_layers=3, n_experts=12, top_k=2, prefill_tokens=0, seed=7),
    ],
    ids=["synthetic", "synthetic-batch4"],
)
def test_store_fires_and_simulator_agree_exactly_under_blend(tmp_path, trace, granularity):
    prep = Prepared(trace)
    slots = max(int(np.diff(prep.dstarts).max()) + 2, trace.n_keys // 4)
    params = {"half_life": 4.0}
    cnt = replay_demand_fill(
        prep, policies.make("blend", trace.n_keys, slots, **params), slots, granularity, admission=ADMIT_ALL
    )
    pack = make_random_pack(tmp_path / "pack", trace.n_layers, trace.n_experts, 64, seed=1)
    with ts.ExpertStore(
        pack,
        vram_slots=slots,
        ram_gb=0,
        device="cpu",
        policy={"name": "blend", **params},
        lazy_per_step=0,
        max_promote=trace.n_keys,
        threads=1,
    ) as store:
        got = replay_store(store, trace, "fire", granularity)
        store.check_invariants()
    assert got.distinct_hits == int(cnt.hit.sum())
    assert got.token_hits == int(prep.dcounts[cnt.hit].sum())
    assert got.reads == cnt.demand_reads and got.evictions == cnt.evictions
    assert 0 < got.distinct_hits < prep.dkeys.size


def test_store_lazy_promotions_and_simulator_agree_exactly_under_blend(tmp_path):
    # blend's order (next use) is not its admission score (short heat), so a lazy
    # pass can turn away a pair before the last one: the store's slot take then
    # evicts the coldest keys, and the simulator's lazy model must do the same.
    trace = synth.synthetic_trace(
        60, n_layers=4, n_experts=16, top_k=3, prefill_tokens=6, prefill_every=30, seed=2
    )
    prep = Prepared(trace)
    slots = trace.n_keys // 4
    cnt = replay_lazy(prep, policies.make("blend", trace.n_keys, slots, half_life=4.0), slots, 8)
    pack = make_random_pack(tmp_path / "pack", trace.n_layers, trace.n_experts, 64, seed=1)
    with ts.ExpertStore(
        pack,
        vram_slots=slots,
        ram_gb=0,
        device="cpu",
        policy={"name": "blend", "half_life": 4.0},
        lazy_per_step=8,
        max_promote=trace.n_keys,
        threads=1,
    ) as store:
        got = replay_store(store, trace, "lazy")
        rejected = store.stats().lazy_rejected
    assert got.distinct_hits == int(cnt.hit.sum()) and got.reads == cnt.demand_reads
    assert got.evictions == cnt.evictions and rejected == cnt.rejected > 0
