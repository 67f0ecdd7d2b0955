"""The native routing fold (csrc/store/src/fold.cpp) against a pure-numpy reference kept
here as the oracle (the product has no numpy fold): same keys, counts, hit split, seen
marks and dropped ids, for any mix of records."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tierstore.store.recorder import NativeFold, RoutingRecorder
from tierstore.store.stats import Counters

L, E = 5, 16


class _Pack:
    path, n_layers, n_experts = "fold-test.pack", L, E


def _recorder() -> RoutingRecorder:
    return RoutingRecorder(_Pack(), Counters(8), lock=None, device="cpu")


class ReferenceFold:
    """The oracle: what a fold must return, in plain numpy (one bincount per take)."""

    def __init__(self):
        self.records, self.dropped = [], 0

    def record(self, layer, ids):
        ids = np.asarray(ids.numpy() if isinstance(ids, torch.Tensor) else ids).astype(np.int64).ravel()
        self.dropped += int(np.count_nonzero(ids >= E))
        self.records.append(ids[(ids >= 0) & (ids < E)] + layer * E)

    def take(self, pool_slot, arena_slot):
        seen = np.zeros(L * E, dtype=bool)
        flat = np.concatenate(self.records) if self.records else np.empty(0, np.int64)
        self.records = []
        if not len(flat):
            return None, seen
        dense = np.bincount(flat, minlength=L * E)
        keys = dense.nonzero()[0]
        counts = dense[keys].astype(np.float64)
        seen[keys] = True
        cat = (pool_slot[keys] >= 0).astype(np.intp) * 2 + (arena_slot[keys] >= 0)
        tally = np.bincount(cat, weights=counts, minlength=4).astype(np.int64).tolist()
        tally += np.bincount(cat, minlength=4).tolist()
        return (keys.tolist(), counts.tolist(), tally), seen


def _take(rec, pool_slot, arena_slot):
    seen = np.zeros(L * E, dtype=bool)
    got = rec.take(None, pool_slot, arena_slot, seen)
    if got is None:
        return None, seen
    keys, counts, tally = got
    order = np.argsort(keys)
    return (keys[order].tolist(), counts[order].tolist(), list(tally)), seen


records = st.lists(
    st.tuples(
        st.integers(0, L - 1),
        st.lists(st.integers(-3, E + 3), min_size=0, max_size=40),
        st.sampled_from(["int64", "int32", "int16", "uint8", "strided", "torch", "list"]),
    ),
    min_size=0,
    max_size=12,
)


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
def test_native_fold_equals_the_numpy_reference(steps, seed):
    rng = np.random.default_rng(seed)
    pool_slot = np.where(rng.random(L * E) < 0.3, 0, -1).astype(np.int32)
    arena_slot = np.where(rng.random(L * E) < 0.5, 1, -1).astype(np.int32)
    native, ref = _recorder(), ReferenceFold()
    for step in steps:
        for layer, ids, kind in step:
            if kind == "uint8":
                ids = [min(max(i, 0), 255) for i in ids]
            native.record(layer, _as(ids, kind))
            ref.record(layer, _as(ids, kind))
        got, seen = _take(native, pool_slot, arena_slot)
        want, want_seen = ref.take(pool_slot, arena_slot)
        assert got == want
        assert np.array_equal(seen, want_seen)
        assert native.counters.record_dropped == ref.dropped


def test_many_ids_switch_to_the_scan_and_back():
    # Past the listing threshold (2048 ids) take scans every count; the next step lists again.
    rec = _recorder()
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
    rec = _recorder()
    slot = np.zeros(L * E, np.int32)
    for layer in range(L):
        rec.record(layer, np.tile(np.arange(E), 2))
    (keys, counts, tally), seen = _take(rec, slot, slot)
    assert keys == list(range(L * E)) and set(counts) == {2.0} and seen.all()
    assert tally[3] == 2 * L * E and tally[7] == L * E


def test_fold_rejects_bad_layers_and_wrong_arrays():
    fold = NativeFold(L, E)
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


def test_unequal_records_whose_total_looks_equal():
    # Sizes 4, 1, 7 (total 12 = 3 x 4): once a regression of the numpy fold's broadcast.
    rec = _recorder()
    for layer, ids in ((0, [0, 0, 0, 0]), (0, [0]), (1, [0] * 7)):
        rec.record(layer, np.array(ids))
    slot = np.full(L * E, -1, np.int32)
    (keys, counts, _), _ = _take(rec, slot, slot)
    assert keys == [0, E] and counts == [5.0, 7.0]


def test_dense_counts_merge_with_listed_ids_and_split_hits():
    # A CUDA store's device counter is added as dense counts (add_counts): merged with the
    # host records of the same step, scanned, split by residency like any other key.
    fold = NativeFold(L, E)
    seen = np.zeros(L * E, bool)
    pool = np.full(L * E, -1, np.int32)
    arena = np.full(L * E, -1, np.int32)
    pool[3] = 0
    arena[E + 1] = 0
    fold.bind(seen, pool, arena)
    fold.add(0, np.array([3, 3, 5]))
    dense = np.zeros(L * E, np.int64)
    dense[[3, E + 1, 4 * E + 15]] = [2, 7, 1]
    fold.add_counts(dense)
    keys, counts, t = fold.take()
    assert keys.tolist() == [3, 5, E + 1, 4 * E + 15] and counts.tolist() == [4, 1, 7, 1]
    assert list(t[:4]) == [2, 7, 4, 0] and list(t[4:8]) == [2, 1, 1, 0]
    assert seen.nonzero()[0].tolist() == [3, 5, E + 1, 4 * E + 15]
    with pytest.raises(ValueError, match="n_keys"):
        fold.add_counts(np.zeros(3, np.int64))
    assert len(fold.take()[0]) == 0 and fold.n_pending == 0
