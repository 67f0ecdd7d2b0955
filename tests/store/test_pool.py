"""SlotPool + the slot state machine (tierstore.pool, tierstore.slots) on real memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tierstore import policies
from tierstore.store.pool import SlotPool
from tierstore.store.slots import EVICTING, FREE, LOADING, RESIDENT

L, E, SLOT = 3, 8, 256
N_KEYS = L * E


def make_pool(device="cpu", n_slots=4, policy="heat"):
    return SlotPool(n_slots, SLOT, L, E, device, policies.make(policy, N_KEYS, n_slots))


def fill(pool, keys, stream=None):
    """take -> (bytes written) -> publish, like a load batch with no I/O."""
    taken = pool.take(np.asarray(keys, np.int64), allow_evict=True)
    if len(taken.victims):
        pool.unpublish(taken.victims, stream)
        pool.begin_load(taken.reused)
    for key, slot in zip(taken.keys.tolist(), taken.slots.tolist()):
        pool.pool[slot].fill_(key % 251)
    pool.publish(taken.slots, stream)
    return taken


def test_pool_and_slot_table_shapes_and_initial_state(device):
    pool = make_pool(device)
    assert pool.pool.shape == (4, SLOT) and pool.pool.dtype == torch.uint8
    assert pool.slot_table.shape == (L, E) and pool.slot_table.dtype == torch.int32
    assert pool.pool.device.type == device == pool.slot_table.device.type
    assert torch.all(pool.slot_table == -1) and pool.n_free == 4
    pool.check_invariants()


def test_take_uses_free_slots_then_coldest_unpinned_victims(device):
    pool = make_pool(device)
    fill(pool, [0, 1, 2, 3])
    pool.policy.on_access(np.array([0, 1, 2]), weights=np.array([5.0, 1.0, 3.0]))
    pool.pin(np.array([3]))  # the coldest key is pinned: never a victim
    taken = pool.take(np.array([10, 11], np.int64), allow_evict=True)
    assert taken.victims.tolist() == [1, 2]  # coldest unpinned first
    assert np.all(pool.state[taken.reused] == EVICTING)
    assert pool.resident_slot[1] == -1 and pool.slot_of[10] >= 0
    event = pool.unpublish(taken.victims, None)
    assert (event is None) == (device == "cpu")
    pool.begin_load(taken.reused)
    assert np.all(pool.state[taken.slots] == LOADING)
    pool.publish(taken.slots, None)
    table = pool.device_table()
    assert table[1] == -1 and table[2] == -1
    assert table[10] == taken.slots[0] and table[11] == taken.slots[1]
    pool.check_invariants()


def test_take_without_eviction_or_with_everything_pinned_leaves_keys_out():
    pool = make_pool()
    fill(pool, [0, 1, 2, 3])
    assert len(pool.take(np.array([9], np.int64), allow_evict=False)) == 0
    pool.pin(np.arange(4))
    assert len(pool.take(np.array([9], np.int64), allow_evict=True)) == 0
    pool.check_invariants()


def test_protect_mask_keeps_the_hot_share_out_of_victims():
    pool = make_pool()
    fill(pool, [0, 1, 2, 3])
    pool.policy.on_access(np.arange(4), weights=np.array([4.0, 3.0, 2.0, 1.0]))
    hot = pool.hot_mask(0.5)
    assert np.flatnonzero(hot).tolist() == [0, 1]
    taken = pool.take(np.array([20, 21, 22], np.int64), allow_evict=True, protect=hot)
    assert sorted(taken.victims.tolist()) == [2, 3] and len(taken) == 2


def test_rollback_returns_slots_and_publishes_nothing(device):
    pool = make_pool(device)
    fill(pool, [0, 1])
    taken = pool.take(np.array([5, 6, 7], np.int64), allow_evict=True)
    pool.unpublish(taken.victims, None)
    pool.rollback(taken.slots)
    assert pool.n_free == 3 and pool.n_resident == 1  # the victim left for good
    assert np.all(pool.slot_of[[5, 6, 7]] == -1)
    assert np.all(pool.device_table()[[5, 6, 7]] == -1)
    pool.check_invariants()


def test_explicit_evict_skips_pinned_and_frees_after_finish():
    pool = make_pool()
    fill(pool, [0, 1, 2])
    pool.pin(np.array([1]))
    gone, slots = pool.evict(np.array([0, 1], np.int64))
    assert gone.tolist() == [0] and pool.state[slots[0]] == EVICTING
    pool.unpublish(gone, None)
    pool.finish_evict(slots)
    assert pool.state[slots[0]] == FREE and pool.device_table()[0] == -1
    pool.unpin(np.array([1]))
    pool.check_invariants()


def test_unpin_of_an_unpinned_key_is_an_error():
    pool = make_pool()
    with pytest.raises(AssertionError, match="not pinned"):
        pool.unpin(np.array([3]))


def test_allocations_are_never_replaced_by_churn(device):
    pool = make_pool(device)
    ptrs = (pool.pool.data_ptr(), pool.slot_table.data_ptr())
    rng = np.random.default_rng(0)
    for _ in range(30):
        keys = rng.choice(N_KEYS, size=3, replace=False)
        keys = keys[pool.slot_of[keys] < 0]
        pool.policy.on_access(keys)
        fill(pool, keys)
    assert (pool.pool.data_ptr(), pool.slot_table.data_ptr()) == ptrs
    pool.check_invariants()
    assert np.all(pool.state == RESIDENT)


def test_check_invariants_catches_a_table_that_points_at_the_wrong_slot():
    pool = make_pool()
    fill(pool, [0, 1])
    pool.slot_table.view(-1)[0] = int(pool.resident_slot[1])
    with pytest.raises(AssertionError, match=r"slot_table\[0, 0\]"):
        pool.check_invariants()


def test_slot_ptrs_are_pool_base_plus_slot_times_slot_bytes():
    pool = make_pool()
    ptrs = pool.slot_ptrs(np.array([0, 3]))
    assert ptrs.dtype == np.uint64
    assert ptrs.tolist() == [pool.pool.data_ptr(), pool.pool[3].data_ptr()]
