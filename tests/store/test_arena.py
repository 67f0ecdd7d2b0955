"""The pinned RAM arena (tierstore.arena) through the store: layout, zero-copy hits,
load_arena, source-row pinning and scan resistance."""

from __future__ import annotations

import numpy as np
import pytest
from store_helpers import assert_store_consistent

import tierstore as ts
from tierstore.testing.packs import make_random_pack

L, E, SLOT = 3, 16, 5000  # stride 8192


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return make_random_pack(tmp_path_factory.mktemp("arena"), L, E, SLOT, seed=13)


def open_store(pack, device, rows=4, slots=8, **kw):
    return ts.ExpertStore(
        pack, vram_slots=slots, ram_gb=rows * pack.stride / 2**30, device=device, threads=2, **kw
    )


def test_arena_rows_are_page_aligned_and_stride_apart(pack):
    with open_store(pack, "cpu", rows=5) as store:
        arena = store.arena
        assert store.n_arena_rows == 5 and arena.rows.shape == (5, pack.stride)
        ptrs = arena.row_ptrs(np.arange(5))
        assert np.all(ptrs % 4096 == 0) and np.all(np.diff(ptrs.astype(np.int64)) == pack.stride)
        assert int(ptrs[0]) == arena.rows.data_ptr()


def test_no_arena_when_ram_gb_is_zero(pack):
    with ts.ExpertStore(pack, vram_slots=8, device="cpu") as store:
        assert store.n_arena_rows == 0 and store.arena.rows is None
        fr = store.fire([(0, 0)])
        assert fr.sources["read"] == 1
        assert_store_consistent(store)


def test_load_arena_reads_rows_in_place_and_skips_loaded_ones(pack, device):
    with open_store(pack, device, rows=4) as store:
        assert store.load_arena([(1, 1), (1, 2)]) == 2
        assert store.load_arena([(1, 2), (1, 3)]) == 1
        assert sorted(store.resident_keys("arena").tolist()) == [[1, 1], [1, 2], [1, 3]]
        assert store.resident_keys("pool").tolist() == []  # no pool copy
        assert_store_consistent(store)


def test_arena_hit_is_the_copy_source_with_no_pack_read(pack, device):
    with open_store(pack, device, rows=4) as store:
        store.load_arena([(2, 5)])
        disk_rows = store.engine.stats()["disk"]["rows"] + store.engine.stats()["pagecache"]["rows"]
        fr = store.fire([(2, 5)])
        st = store.engine.stats()
        assert fr.sources == {"pool": 0, "arena": 1, "read": 0}
        assert st["disk"]["rows"] + st["pagecache"]["rows"] == disk_rows
        assert store.stats().bytes_arena == SLOT
        assert_store_consistent(store)


def test_pool_misses_fill_arena_rows_on_the_way_up(pack, device):
    with open_store(pack, device, rows=4) as store:
        store.fire([(0, 1), (0, 2)])
        assert sorted(store.resident_keys("arena").tolist()) == [[0, 1], [0, 2]]
        assert_store_consistent(store)


def test_full_arena_never_evicts_a_row_that_is_this_batchs_copy_source(pack, device):
    # Regression: the source rows of arena hits were pinned only after new rows were
    # taken, so a miss in the same batch could evict a hit's row before its copy ran.
    with open_store(pack, device, rows=2, arena_policy="lru") as store:
        store.load_arena([(1, 8)])
        store.load_arena([(1, 9)])  # (1, 8) is now the LRU victim
        store.fire([(1, 8), (1, 10)])  # hit on (1, 8) + a miss needing a row
        assert store.wait_idle(10)  # CUDA: the worker unpins copy sources
        assert_store_consistent(store)
        assert store.stats().arena.pinned == 0


def test_scan_fills_free_slots_but_keeps_the_hot_set(pack, device):
    with open_store(pack, device, rows=4, slots=8, scan_keep=0.5) as store:
        hot = [(0, e) for e in range(4)]
        for _ in range(5):
            store.record(0, np.arange(4).reshape(-1, 1))
        store.promote(hot).wait(10)
        store.stats()
        prefill = np.arange(16)  # a prefill touching every expert of layer 2
        fr = store.ensure_resident(2, prefill.reshape(-1, 2))
        resident = {tuple(k) for k in store.resident_keys("pool").tolist()}
        assert set(hot) <= resident, "a scan evicted the decode hot set"
        assert fr.promoted == 4 and len(resident) == 8  # the 4 free slots, nothing more
        assert np.all(store.tier("pool").pins(fr.keys) == 1)
        store.step()  # prefill pins end with the step
        assert store.stats().pool.pinned == 0
        assert_store_consistent(store)
