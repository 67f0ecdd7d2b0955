"""bench/hits_bounds.py: its demand loop is the simulator's (so its oracle rows are
comparable with hits_eval's), and the future-knowledge rows bound what they should."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tierstore import sim
from tierstore.policies import make
from tierstore.sim import synth

_SPEC = importlib.util.spec_from_file_location(
    "hits_bounds", Path(__file__).resolve().parents[2] / "bench" / "hits_bounds.py"
)
hb = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(hb)


@pytest.fixture(scope="module")
def prep():
    return sim.Prepared(
        synth.synthetic_trace(24, seed=3, n_layers=4, n_experts=16, top_k=4, prefill_tokens=0)
    )


@pytest.mark.parametrize("policy,h", [("blend", 64.0), ("hybrid", 8.0), ("lru", None)])
@pytest.mark.parametrize("slots", [5, 13, 30])
def test_demand_loop_matches_the_simulator(prep, policy, h, slots):
    kw = {} if h is None else {"half_life": h}
    want = sim.replay(prep, [policy], [slots], policy_params={policy: kw})[0]
    got = hb.demand(prep, hb._groups(prep), make(policy, prep.n_keys, slots, **kw))
    # One key per token on this trace: distinct hits / accesses is the bandwidth hit.
    assert prep.all_single
    assert got == pytest.approx(want.bandwidth_hit_rate, abs=1e-12)


def test_bounds_rows_are_ordered(prep):
    # Every row may skip a miss, so the MIN that may skip (Belady with bypass) is
    # their ceiling: an oracle or window policy above it would be a counting bug.
    blk = hb.bounds(prep.trace)
    skip = {r.slots: r.bandwidth_hit_rate for r in sim.replay(prep, ["belady_skip"], blk["slots"])}
    for r in blk["rows"]:
        for c in ("blend64", "oracle_tick", "static_lfu", "future_16", "future_256"):
            assert 0.0 <= r[c] <= skip[r["slots"]] + 1e-12, (c, r)
        assert np.isfinite(list(r.values())).all()
