"""The native routing fold (csrc/store/src/fold.cpp) against the numpy fold it replaces:
same keys, counts, hit split, seen marks and dropped ids, for any mix of records."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from tierstore.store.recorder import RoutingRecorder, _NativeFold
from tierstore.store.stats import Counters

pytestmark = pytest.mark.skipif(_NativeFold is None, reason="extension built without fold.cpp")

L, E = 5, 16


class _Pack:
    path, n_layers, n_experts = "fold-test.pack", L, E


def _recorder(native: bool) -> RoutingRecorder:
    return RoutingRecorder(_Pack(), Counters(8), lock=None, device="cpu", native=native)


def _take(rec, pool_slot, arena_slot):
    seen = np.zeros(L * E, dtype=bool)
    got = rec.take(None, pool_slot, arena_slot, seen)
    if got is None:
        return None, seen
    keys, counts, tally = got
    order = np.argsort(keys)
    return (keys[order].tolist(), counts[order].tolist(), list(tally)), seen


records = st.lists(st.tuples(
    st.integers(0, L - 1),
    st.lists(st.integers(-3, E + 3), min_size=0, max_size=40),
    st.sampled_from(["int64", "int32", "int16", "uint8", "strided", "torch", "list"])),
    min_size=0, max_size=12)


def _as(ids, kind):
    a = np.array(ids, dtype=np.int64)
    if kind == "strided":
        return np.repeat(a, 2)[::2]
    if kind == "torch":
        return torch.from_numpy(a.astype(np.int32))
    if kind == "list":
        return list(ids)
    if kind == "uint8":
        return np.clip(a, 0, 255).astype(np.uint8)
    return a.astype(kind)


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(records, min_size=1, max_size=3), seed=st.integers(0, 2**16))
def test_native_fold_equals_numpy_fold(steps, seed):
    rng = np.random.default_rng(seed)
    pool_slot = np.where(rng.random(L * E) < 0.3, 0, -1).astype(np.int32)
    arena_slot = np.where(rng.random(L * E) < 0.5, 1, -1).astype(np.int32)
    native, numpy_ = _recorder(True), _recorder(False)
    assert native.native and not numpy_.native
    for step in steps:
        for layer, ids, kind in step:
            if kind == "uint8":
                ids = [min(max(i, 0), 255) for i in ids]
            for rec in (native, numpy_):
                rec.record(layer, _as(ids, kind))
        got, seen = _take(native, pool_slot, arena_slot)
        want, want_seen = _take(numpy_, pool_slot, arena_slot)
        assert got == want
        assert np.array_equal(seen, want_seen)
        assert native.counters.record_dropped == numpy_.counters.record_dropped


def test_many_ids_switch_to_the_scan_and_back():
    # Past the listing threshold (2048 ids) take scans every count; the next step lists again.
    rec = _recorder(True)
    pool_slot = np.full(L * E, -1, np.int32)
    big = np.arange(3000) % E
    rec.record(2, big)
    rec.record(0, np.array([3]))
    (keys, counts, tally), _ = _take(rec, pool_slot, pool_slot)
    assert keys == [3] + list(range(2 * E, 3 * E))
    assert counts[0] == 1 and sum(counts) == 3001
    assert tally[0] == 3001 and tally[4] == E + 1
    rec.record(4, np.array([1, 1, 2]))
    (keys, counts, _), _ = _take(rec, pool_slot, pool_slot)
    assert keys == [4 * E + 1, 4 * E + 2] and counts == [2.0, 1.0]
    assert _take(rec, pool_slot, pool_slot)[0] is None


def test_every_key_of_a_small_pack_in_listing_mode():
    # The branch-free listing writes one past the last touched key: all keys touched twice.
    rec = _recorder(True)
    slot = np.zeros(L * E, np.int32)
    for layer in range(L):
        rec.record(layer, np.tile(np.arange(E), 2))
    (keys, counts, tally), seen = _take(rec, slot, slot)
    assert keys == list(range(L * E)) and set(counts) == {2.0} and seen.all()
    assert tally[3] == 2 * L * E and tally[7] == L * E


def test_fold_rejects_bad_layers_and_wrong_arrays():
    fold = _NativeFold(L, E)
    with pytest.raises(IndexError):
        fold.add(L, np.arange(3))
    with pytest.raises(TypeError):
        fold.add(0, np.arange(4)[::2])
    with pytest.raises(TypeError):
        fold.add(0, np.zeros(3))
    with pytest.raises(ValueError):
        fold.take()  # nothing bound yet
    with pytest.raises(TypeError):
        fold.bind(np.zeros(L * E, np.uint8), np.zeros(L * E, np.int32), np.zeros(L * E, np.int32))
    with pytest.raises(ValueError):
        fold.bind(np.zeros(3, bool), np.zeros(3, np.int32), np.zeros(3, np.int32))


def test_numpy_fold_with_unequal_records_whose_total_looks_equal():
    # Regression: sizes 4, 1, 7 (total 12 = 3 x 4) took the equal-size broadcast path.
    rec = _recorder(False)
    for layer, ids in ((0, [0, 0, 0, 0]), (0, [0]), (1, [0] * 7)):
        rec.record(layer, np.array(ids))
    slot = np.full(L * E, -1, np.int32)
    (keys, counts, _), _ = _take(rec, slot, slot)
    assert keys == [0, E] and counts == [5.0, 7.0]
