"""Pipelined fire: fire(..., pipelined=True) returns once the reads are queued; each
layer becomes resident (slot table + bytes) at its own wait_layer, a failed layer
raises there and leaves nothing of itself or later unpublished layers behind, and
release publishes what nobody waited for. Runs on the CPU pool and, with a GPU, on
the CUDA pool (the `device` fixture)."""

from __future__ import annotations

import errno

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_helpers import assert_store_consistent, pairs

import tierstore as ts
from tierstore.errors import TierIOError
from tierstore.testing.packs import make_random_pack

L, E, SLOT = 6, 8, 3000


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return make_random_pack(tmp_path_factory.mktemp("pipelined"), L, E, SLOT, seed=5)


@pytest.fixture
def store(pack, device):
    s = ts.ExpertStore(pack, vram_slots=20, ram_gb=8 * 4096 / 2**30, device=device, threads=2)
    yield s
    s.close()


def table(store) -> np.ndarray:
    return store.tier("pool").device_table()


def row_ok(store, pack, key: int) -> bool:
    slot = int(table(store)[key])
    got = store.pool[slot].cpu().numpy()
    return slot >= 0 and np.array_equal(got, pack.read_row(*divmod(key, E)))


def test_layers_publish_at_their_own_wait(store, pack):
    keys = np.array([(l, e) for l in (0, 2, 5) for e in (1, 4)])
    fr = store.fire(keys, pipelined=True)
    assert fr.promoted == 6 and fr.pending is not None
    dense = keys[:, 0] * E + keys[:, 1]
    if not store.pool.is_cuda:  # CPU table writes are immediate: nothing visible yet
        assert np.all(table(store)[dense] == -1)
    fr.wait_layer(2)
    assert all(row_ok(store, pack, int(k)) for k in dense[2:4])
    assert np.all(table(store)[dense[4:]] == -1)  # layer 5 still unpublished
    fr.wait_layer(3)  # nothing of layer 3 routed
    fr.wait_layer(0)
    fr.wait_layer(5)
    assert fr.pending.done and all(row_ok(store, pack, int(k)) for k in dense)
    store.release(fr)
    store.wait_idle(10)
    assert_store_consistent(store)
    assert store.stats().pool.pinned == 0


def test_release_publishes_layers_nobody_waited_for(store, pack):
    keys = pairs(np.arange(0, L * E, 5), E)[:12]
    fr = store.fire(keys, pipelined=True)
    fr.wait_layer(0)
    store.release(fr)
    store.wait_idle(10)
    dense = keys[:, 0] * E + keys[:, 1]
    assert all(row_ok(store, pack, int(k)) for k in dense)
    assert_store_consistent(store)


def test_failed_layer_raises_at_its_wait_and_rolls_back_the_rest(store, pack):
    keys = np.array([(0, 0), (1, 3), (3, 2), (4, 6)])
    store.engine._inject_faults(fail_offset=pack.row_offset(3, 2) + 10, errno=errno.EIO)
    fr = store.fire(keys, pipelined=True)
    fr.wait_layer(0)
    fr.wait_layer(1)
    with pytest.raises(TierIOError) as err:
        fr.wait_layer(3)
    assert "layer 3 expert 2" in str(err.value) and err.value.errno == errno.EIO
    with pytest.raises(TierIOError):
        fr.wait_layer(4)  # rolled back with it: never published
    store.release(fr)  # the error was reported: release is quiet
    store.engine._inject_faults()
    store.wait_idle(10)
    assert sorted(map(tuple, store.resident_keys("pool").tolist())) == [(0, 0), (1, 3)]
    assert store.stats().pool.pinned == 0
    assert_store_consistent(store)
    again = store.fire([(3, 2), (4, 6)])  # the same keys load fine afterwards
    assert again.promoted == 2
    store.release(again)
    assert_store_consistent(store)


def test_release_raises_an_error_nobody_saw(store, pack):
    store.engine._inject_faults(fail_offset=pack.row_offset(2, 1) + 10, errno=errno.EIO)
    fr = store.fire([(2, 1), (2, 2)], pipelined=True)
    with pytest.raises(TierIOError):
        store.release(fr)
    store.engine._inject_faults()
    assert fr.released and store.stats().pool.pinned == 0
    store.wait_idle(10)
    assert_store_consistent(store)


def test_evicting_fire_orders_copies_after_the_unpublish(store, pack):
    # A full pool: the pipelined fire's slots are victims' slots; their old readers'
    # event must order the overwrite (device-side on CUDA, no host wait).
    first = store.fire(pairs(np.arange(20), E))
    store.release(first)
    fr = store.fire(pairs(np.arange(20, 40), E), pipelined=True)
    fr.wait_all()
    store.release(fr)
    store.wait_idle(10)
    assert all(row_ok(store, pack, k) for k in range(20, 40))
    assert_store_consistent(store)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_wait_order_ends_consistent(store, pack, data):
    dense = data.draw(st.lists(st.integers(0, L * E - 1), min_size=1, max_size=18, unique=True))
    fr = store.fire(pairs(dense, E), pipelined=data.draw(st.sampled_from([False, True, 3 * SLOT])))
    for layer in data.draw(st.permutations(range(L))):
        if data.draw(st.booleans()):
            fr.wait_layer(layer)
    store.release(fr)
    store.wait_idle(10)
    assert all(row_ok(store, pack, k) for k in dense[: store.n_slots])
    assert_store_consistent(store)


def test_grouped_layers_publish_together(store, pack):
    keys = np.array([(0, 1), (1, 2), (2, 3), (4, 4), (5, 5)])
    fr = store.fire(keys, pipelined=2 * SLOT)  # groups: layers {0, 1}, {2, 4}, {5}
    dense = keys[:, 0] * E + keys[:, 1]
    assert sorted(fr.pending.spans) == [0, 2, 5]
    fr.wait_layer(4)
    assert all(row_ok(store, pack, int(k)) for k in dense[2:4])
    if not store.pool.is_cuda:
        assert np.all(table(store)[dense[[0, 1, 4]]] == -1)
    store.release(fr)
    store.wait_idle(10)
    assert all(row_ok(store, pack, int(k)) for k in dense)
    assert_store_consistent(store)
