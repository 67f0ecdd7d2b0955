"""CUDA pool tests (marked gpu; skipped without a device): pool bytes after promote /
fire, stream-ordered publish on a caller's stream, device-side record, and a CUDA
graph that reads slot_table + pool, replayed after promotions and evictions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from store_helpers import assert_store_consistent

import tierstore as ts
from tierstore.testing.packs import make_random_pack, random_layer_rows

pytestmark = pytest.mark.gpu

L, E, SLOT, SEED = 3, 16, 12_345, 31


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return make_random_pack(tmp_path_factory.mktemp("gpu"), L, E, SLOT, seed=SEED)


@pytest.fixture(scope="module")
def row_sums():
    rows = np.stack([random_layer_rows(SEED, l, E, SLOT) for l in range(L)])
    return rows.reshape(L * E, SLOT).astype(np.int64).sum(axis=1)


def open_store(pack, **kw):
    kw.setdefault("vram_slots", 8)
    kw.setdefault("ram_gb", 4 * pack.stride / 2**30)
    return ts.ExpertStore(pack, device="cuda", threads=4, **kw)


def test_cuda_pool_bytes_equal_pack_rows_after_promote_and_fire(pack):
    with open_store(pack) as store:
        assert store.pool.is_cuda and store.slot_table.is_cuda
        store.promote([(0, e) for e in range(4)]).wait(30)
        fr = store.fire([(1, 1), (1, 2), (0, 0)])
        assert fr.promoted == 2 and fr.already_resident == 1
        torch.cuda.synchronize()
        assert_store_consistent(store)
        store.release(fr)
        store.load_arena([(2, 9)])
        fr = store.fire([(2, 9), (2, 10)])  # an arena-sourced copy and a read
        assert fr.sources["arena"] == 1
        store.release(fr)
        assert store.wait_idle(30)
        assert_store_consistent(store)
        assert store.stats().arena.pinned == 0


def test_publish_is_ordered_on_the_callers_stream_without_host_sync(pack, row_sums):
    with open_store(pack, ram_gb=0) as store:
        side = torch.cuda.Stream()
        keys = torch.tensor([[0, 3], [1, 4], [2, 5]], device="cuda")
        fr = store.fire(keys.cpu(), stream=side)
        with torch.cuda.stream(side):  # no synchronize between fire and use
            slots = store.slot_table[keys[:, 0], keys[:, 1]]
            sums = store.pool.index_select(0, slots.clamp(min=0).long()).to(torch.int64).sum(1)
            sums = torch.where(slots >= 0, sums, -1)
        side.synchronize()
        dense = (keys[:, 0] * E + keys[:, 1]).cpu().numpy()
        assert sums.cpu().numpy().tolist() == row_sums[dense].tolist()
        store.release(fr)


def test_record_of_a_cuda_tensor_counts_on_the_device(pack):
    with open_store(pack, ram_gb=0) as store:
        store.fire([(0, 1)])
        store.record(0, torch.tensor([[1, 2], [1, -1]], device="cuda"))
        st = store.stats()
        assert (st.pool.hits, st.pool.misses) == (2, 1)
        assert store.pool_policy.scores()[1] > store.pool_policy.scores()[2] > 0


def test_record_captured_in_a_cuda_graph_counts_every_replay(pack):
    with open_store(pack, ram_gb=0) as store:
        ids = torch.tensor([[3, 4], [3, 5]], device="cuda")
        warm = torch.cuda.Stream()
        warm.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(warm):
            store.record(1, ids)  # warm-up (counted too)
        torch.cuda.current_stream().wait_stream(warm)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            store.record(1, ids)
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        st = store.stats()
        assert st.pool.misses == 4 * 4 and st.pool.distinct_misses == 3
        assert store.pool_policy.scores()[1 * E + 3] == pytest.approx(8.0, rel=0.01)


def test_cuda_graph_reading_slot_table_and_pool_replays_correctly_after_churn(pack, row_sums):
    with open_store(pack, vram_slots=6, ram_gb=0) as store:
        query = torch.tensor([[l, e] for l in range(L) for e in range(0, E, 2)], device="cuda")
        dense = (query[:, 0] * E + query[:, 1]).cpu().numpy()
        table, pool = store.slot_table, store.pool
        ptrs = (table.data_ptr(), pool.data_ptr())

        def gather_sums():
            slots = table[query[:, 0], query[:, 1]]
            sums = pool.index_select(0, slots.clamp(min=0).long()).to(torch.int64).sum(1)
            return torch.where(slots >= 0, sums, torch.full_like(sums, -1))

        warm = torch.cuda.Stream()
        warm.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(warm):
            for _ in range(3):
                gather_sums()
        torch.cuda.current_stream().wait_stream(warm)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = gather_sums()

        def check():
            graph.replay()
            torch.cuda.synchronize()
            resident = store.tier("pool").resident_slot(dense) >= 0
            want = np.where(resident, row_sums[dense], -1)
            assert out.cpu().numpy().tolist() == want.tolist()
            return int(resident.sum())

        assert check() == 0
        fr = store.fire([(0, 0), (0, 2), (1, 4)])
        assert check() == 3
        store.release(fr)
        for layer in range(L):  # churn: 6 slots, many more keys
            store.record(layer, np.arange(0, E, 2).reshape(-1, 1))
            store.promote([(layer, e) for e in range(0, E, 2)]).wait(30)
            assert check() == 6
        assert store.evict([(2, 0), (2, 2)]) > 0
        check()
        assert store.stats().pool.evictions > 0
        assert (table.data_ptr(), pool.data_ptr()) == ptrs
        assert_store_consistent(store)
