"""Auto's experts and selection: each shadow is its expert replayed alone, scores
count reads saved (distinct hits), and the real tier tracks the best expert."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierstore import policies, sim
from tierstore.policies.auto import EXPERTS, SCORE_HALF_LIFE
from tierstore.sim import Prepared, replay_demand_fill, synth


def _expert(name, h, n_keys, slots):
    return policies.make(name, n_keys, slots, **({} if h is None else {"half_life": h}))


def test_expert_list_is_the_documented_one():
    assert len(EXPERTS) == 9 and EXPERTS[0] == ("blend", 16.0) and EXPERTS[-1] == ("lru", None)
    p = policies.make("auto", 10, 3)
    assert [e.name for e in p.experts] == [n for n, _ in EXPERTS]
    assert p.leader_name() == "blend(half_life=16)"  # the prior before any evidence


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10**6), slots=st.integers(3, 20), batch=st.sampled_from([1, 3]))
def test_each_shadow_is_its_expert_replayed_alone(seed, slots, batch):
    tr = synth.synthetic_trace(
        40, batch=batch, n_layers=3, n_experts=12, top_k=2, prefill_tokens=5, prefill_every=20, seed=seed
    )
    prep = Prepared(tr)
    auto = policies.make("auto", tr.n_keys, slots)
    replay_demand_fill(prep, auto, slots)
    for (name, h), shadow in zip(EXPERTS, auto.experts):
        alone = _expert(name, h, tr.n_keys, slots)
        replay_demand_fill(prep, alone, slots, native=False)
        assert np.array_equal(np.sort(shadow.resident()), np.sort(alone.resident())), (name, h)
        if name != "lru":  # (lru's clock counts calls, which the replay merges: same order)
            np.testing.assert_allclose(shadow.scores(), alone.scores(), rtol=1e-12)
    auto.check_invariants()


def test_scores_count_distinct_hits_not_tokens():
    auto = policies.make("auto", 8, 4)
    auto.on_access([1, 2])  # every shadow misses both and admits them
    auto.on_access([1, 2], weights=[100.0, 1.0])
    assert auto.expert_scores.tolist() == [2.0] * len(EXPERTS)
    auto.decay(steps=int(SCORE_HALF_LIFE))
    assert auto.expert_scores == pytest.approx([1.0] * len(EXPERTS))


@pytest.mark.parametrize("seed", [11, 12])
def test_auto_tracks_the_best_of_its_experts(seed):
    # A bursty small-model trace where the experts differ by several percent.
    tr = synth.synthetic_trace(
        300, n_layers=4, n_experts=32, top_k=3, prefill_tokens=16, prefill_every=150, seed=seed
    )
    prep = Prepared(tr)
    slots = tr.n_keys // 8
    alone = {}
    for name, h in EXPERTS:
        cnt = replay_demand_fill(prep, _expert(name, h, tr.n_keys, slots), slots)
        alone[(name, h)] = cnt.result(name, slots, prep, 0, 1.0).bandwidth_hit_rate
    (r,) = sim.replay(prep, ["auto"], [slots])
    best, worst = max(alone.values()), min(alone.values())
    assert best - worst > 0.03  # the choice matters on this trace
    assert r.bandwidth_hit_rate >= best - 0.25 * (best - worst)
