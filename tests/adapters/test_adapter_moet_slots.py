"""Property: any sequence of fires, prefill loads, failed reads and step ends keeps the FP4
tier's slot bookkeeping a bijection and every mapped slot's bytes equal to its row."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from moet_surface_helpers import SLOT, W2, W13, E, L, env, moet_env, planes

from tierstore.errors import TierIOError

PLANES = planes(seed=4)
ROWS = {k: torch.cat(v, 1) for k, v in PLANES.items()}

BAD = (1, 3)  # rotted on disk: every read of it fails its checksum (TIERSTORE_VERIFY=1)

op = st.one_of(
    st.tuples(
        st.just("fire"),
        st.lists(st.tuples(st.integers(0, L - 1), st.integers(0, E - 1)), min_size=1, max_size=12),
        st.one_of(st.none(), st.integers(0, 10)),
    ),
    st.tuples(
        st.just("prefill"), st.integers(0, L - 1), st.lists(st.integers(0, E - 1), min_size=1, max_size=10)
    ),
    st.tuples(st.just("end"), st.none(), st.none()),
)


def _invariants(t):
    t.expert_store.check_invariants()  # states, owners, pins, policy and table agree
    table = t.slot_table.view(-1).numpy()
    mapped = np.flatnonzero(table >= 0)
    slots = table[mapped]
    assert len(set(slots.tolist())) == len(slots) and np.all(slots < t.n_slots)
    assert BAD[0] * E + BAD[1] not in mapped.tolist()  # a bad row is never served
    for k, s in zip(mapped.tolist(), slots.tolist()):
        assert torch.equal(t.pool[s], ROWS[k // E][k % E])


@pytest.fixture(scope="module")
def rotted_pack(tmp_path_factory):
    """A STORE_DIR whose pack has row BAD rotted after it was written."""
    d = tmp_path_factory.mktemp("moet-slots")
    mp = pytest.MonkeyPatch()
    try:
        with moet_env(mp, env(d, slots=8, FORCE_POOL=1)) as m:
            t = m.get_tier(n_experts=E, dev=torch.device("cpu"), w13_bytes=W13, w2_bytes=W2)
            for k, (a, b) in PLANES.items():
                t.add_layer_host_planes(k, a, b)
            path = t._store.path
    finally:
        mp.undo()
    with open(path, "r+b") as f:
        f.seek((BAD[0] * E + BAD[1]) * SLOT + 64)
        f.write(b"\xee" * 16)
    return d


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(op, min_size=1, max_size=25), n_slots=st.integers(8, 20))
def test_bookkeeping_survives_any_sequence(rotted_pack, ops, n_slots):
    mp = pytest.MonkeyPatch()
    try:
        with moet_env(
            mp, env(rotted_pack, slots=n_slots, FORCE_POOL=1, TIERSTORE_VERIFY=1, DELTA_PROMOTE=3)
        ) as m:
            t = m.get_tier(n_experts=E, dev=torch.device("cpu"), w13_bytes=W13, w2_bytes=W2)
            t.wait_manager_idle()
            marked = set()  # what seen holds: a prefill marks its experts too
            for kind, arg, cap in ops:
                if kind == "fire":
                    for li, ei in arg:
                        m.mark_seen(t.seen[li], torch.tensor([ei]))
                    marked |= set(arg)
                    try:
                        n = t.force_promote(max_promote=cap)
                        assert cap is None or n <= cap
                    except TierIOError as exc:
                        assert BAD in marked and "layer 1 expert 3" in str(exc)
                    marked = set()  # force_promote consumed seen
                elif kind == "prefill":
                    marked |= {(arg, e) for e in cap}
                    try:
                        t.ensure_resident(arg, torch.tensor(cap))
                    except TierIOError:
                        assert arg == BAD[0] and BAD[1] in cap
                else:
                    marked = set()
                    t.step_end()  # publishes the previous step's reads
                    t.expert_store.wait_idle()  # this step's reads are done
                _invariants(t)
    finally:
        mp.undo()
