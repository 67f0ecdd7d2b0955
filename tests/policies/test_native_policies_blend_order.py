"""blend's and phase's incremental resident order in the native replays (csrc/store/src/blend_order.cpp:
per phase bucket, keys sorted by rate at the clock they were last ordered at, re-sorted
when the clock moved) against the Python loop, whose victims scan every resident key
(policy_victims). Traces built for ties: few keys read together with small integer
weights, half-lives up to 1e6 steps (rates barely move, so many are exactly equal)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierstore.policies.blend import BlendPolicy
from tierstore.policies.phase import PhasePolicy
from tierstore.sim.counting import Prepared
from tierstore.sim.demand import replay_demand_fill
from tierstore.sim.traces import Trace

pytest.importorskip("tierstore._C")


def _tied_trace(n_layers, n_experts, n_ticks, seed):
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(n_ticks):
        for layer in rng.choice(n_layers, size=rng.integers(1, n_layers + 1), replace=False):
            # Pairs of experts read together keep equal heats; repeats weigh 2-3 tokens.
            base = rng.integers(0, n_experts, size=rng.integers(1, 4)) // 2 * 2
            for e in np.concatenate([base, np.minimum(base + 1, n_experts - 1)]):
                rows += [(t, layer, e)] * int(rng.integers(1, 3))
    rows = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
    order = np.lexsort((rows[:, 1], rows[:, 0]))
    rows = rows[order]
    return Trace(
        rows[:, 0],
        rows[:, 1].astype(np.int32),
        rows[:, 2].astype(np.int32),
        np.arange(n_layers, dtype=np.int64),
        n_experts,
    )


@settings(max_examples=100, deadline=None)
@given(
    n_layers=st.integers(1, 5),
    n_experts=st.integers(2, 10),
    n_ticks=st.integers(1, 40),
    slots=st.integers(1, 25),
    h=st.sampled_from([0.05, 0.5, 2.0, 16.0, 1e6]),
    granularity=st.sampled_from(["layer", "tick"]),
    seed=st.integers(0, 2**31 - 1),
    cls=st.sampled_from([BlendPolicy, PhasePolicy]),
)
def test_blend_order_matches_the_full_scan(n_layers, n_experts, n_ticks, slots, h, granularity, seed, cls):
    prep = Prepared(_tied_trace(n_layers, n_experts, n_ticks, seed))
    fast, slow = (cls(prep.n_keys, slots, half_life=h) for _ in range(2))
    a = replay_demand_fill(prep, fast, slots, granularity)
    b = replay_demand_fill(prep, slow, slots, granularity, native=False)
    assert np.array_equal(a.hit, b.hit)
    assert (a.demand_reads, a.evictions, a.rejected) == (b.demand_reads, b.evictions, b.rejected)
    for k in ("_last", "_raw", "_pos", "_raw2", "_resident"):
        assert np.array_equal(getattr(fast, k), getattr(slow, k)), k
