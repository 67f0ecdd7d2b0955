"""Property: any sequence of fires, prefill loads, failed reads and step ends keeps the FP4
tier's slot bookkeeping a bijection and every mapped slot's bytes equal to its row."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moet_surface_helpers import E, L, W13, W2, env, moet_env, planes
from tierstore.errors import TierIOError

PLANES = planes(seed=4)
ROWS = {k: torch.cat(v, 1) for k, v in PLANES.items()}

op = st.one_of(
    st.tuples(st.just("fire"), st.lists(st.tuples(st.integers(0, L - 1), st.integers(0, E - 1)),
                                        min_size=1, max_size=12),
              st.one_of(st.none(), st.integers(0, 10)), st.booleans()),
    st.tuples(st.just("prefill"), st.integers(0, L - 1),
              st.lists(st.integers(0, E - 1), min_size=1, max_size=10), st.booleans()),
    st.tuples(st.just("end"), st.none(), st.none(), st.booleans()),
)


def _invariants(t):
    o = t._owners
    mapped = np.flatnonzero(o.mirror.view(-1).numpy() >= 0)
    slots = o.mirror.view(-1).numpy()[mapped]
    assert len(set(slots.tolist())) == len(slots)
    assert all(o.owner[s] == k for k, s in zip(mapped, slots))
    owned = set(np.flatnonzero(o.owner >= 0).tolist())
    assert owned == set(slots.tolist())
    assert sorted(set(o.free)) == sorted(o.free) and not (set(o.free) & owned)
    assert len(o.free) + len(owned) == t.n_slots
    assert torch.equal(t.slot_table.view(-1)[torch.from_numpy(mapped)],
                       torch.from_numpy(slots.astype(np.int32)))
    assert int((t.slot_table >= 0).sum()) == len(mapped)
    for k, s in zip(mapped.tolist(), slots.tolist()):
        assert torch.equal(t.pool[s], ROWS[k // E][k % E])


@settings(max_examples=40, deadline=None)
@given(st.lists(op, min_size=1, max_size=25), st.integers(8, 20))
def test_bookkeeping_survives_any_sequence(ops, n_slots):
    mp = pytest.MonkeyPatch()
    try:
        with moet_env(mp, env(slots=n_slots, FORCE_POOL=1)) as m:
            t = m.get_tier(n_experts=E, dev=torch.device("cpu"), w13_bytes=W13, w2_bytes=W2)
            for k, (a, b) in PLANES.items():
                t.add_layer_host_planes(k, a, b)
            real = t._store.rows_block
            for kind, arg, cap, fail in ops:
                def rows_block(pairs, scan=False, out=None, fail=fail):
                    if fail:
                        raise TierIOError("pack", 0, 5, what="injected read")
                    return real(pairs, scan=scan, out=out)
                t._store.rows_block = rows_block
                if kind == "fire":
                    for li, ei in arg:
                        m.mark_seen(t.seen[li], torch.tensor([ei]))
                    try:
                        n = t.force_promote(max_promote=cap)
                        assert cap is None or n <= cap
                    except TierIOError:
                        assert fail
                elif kind == "prefill":
                    try:
                        t.ensure_resident(arg, torch.tensor(cap))
                    except TierIOError:
                        assert fail
                else:
                    t._store.rows_block = real
                    t.step_end()
                    t._settle()      # the pass step_end started is published
                _invariants(t)
            t._store.rows_block = real
    finally:
        mp.undo()
