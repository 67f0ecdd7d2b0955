"""The vLLM-Moet FP4 tier surface on a real GPU: CUDA-graph capture with
capture_error_mode="global" while the manager thread works, no host sync in step_end,
pool bytes equal to the pack after every step (fires by the direct and the staged path)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from moet_surface_helpers import E, L, env, moet_env, pack_reference, planes, serve_checked
from tierstore.adapters.moet_copy import copy_block, scatter_rows
from tierstore.testing.moet_engine import MoetEngine

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]
CUDA = torch.device("cuda", 0)


@pytest.mark.parametrize("promote", ["auto", "staged"])
@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_graph_served_steps_keep_pool_equal_to_pack(monkeypatch, tmp_path, runner, promote):
    with moet_env(monkeypatch, env(tmp_path, slots=14, TIERSTORE_PROMOTE=promote)) as m:
        eng = MoetEngine(m, planes(), n_experts=E, dev=CUDA, top_k=2, tokens=2, runner=runner,
                         graphs=True).boot()
        assert eng.graph is not None
        tier, ref = m._TIER, pack_reference(m._TIER)
        assert tier._promote_path == ("direct" if promote == "auto" else "staged")
        assert tier.pool.is_cuda and tier.slot_table.is_cuda and tier.seen.is_cuda
        serve_checked(eng, 10, ref)
        rows = tier._store.rows_for([(0, 1)])
        assert rows[0].is_pinned()


def test_capture_in_global_mode_while_a_manager_pass_reads(monkeypatch, tmp_path):
    with moet_env(monkeypatch, env(tmp_path, slots=40, DELTA_PROMOTE=16)) as m:
        eng = MoetEngine(m, planes(), n_experts=E, dev=CUDA, top_k=2, tokens=4).boot()
        tier = m._TIER
        in_pass = threading.Event()
        real = tier._store.rows_block

        def slow_rows(pairs, scan=False, out=None):
            if threading.current_thread() is tier._thread:
                in_pass.set()
                time.sleep(1.0)             # host work only: the capture runs meanwhile
            return real(pairs, scan=scan, out=out)
        monkeypatch.setattr(tier._store, "rows_block", slow_rows)
        tier.wait_manager_idle()
        for key in range(L):
            m.mark_seen(tier.seen[key], torch.arange(8, device=CUDA))
        tier.step_end()
        torch.cuda.synchronize()
        tier.wake()                          # hands the snapshot over: a pass starts
        assert in_pass.wait(5)
        graph = torch.cuda.CUDAGraph()
        eng._route()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            eng._forward()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph, capture_error_mode="global"):
            eng._forward()                   # raises if another thread calls CUDA now
        assert not tier._manager_idle.is_set()  # the pass outlived the capture
        tier.wait_manager_idle()             # publishes the staged promotions
        graph.replay()
        assert int(eng.out.item()) == eng.expected_out()
        assert eng.check(pack_reference(tier)) > 0


def test_step_end_makes_no_host_sync(monkeypatch, tmp_path):
    with moet_env(monkeypatch, env(tmp_path, slots=40)) as m:
        MoetEngine(m, planes(), n_experts=E, dev=CUDA).boot()
        tier = m._TIER
        for i in range(L):                   # the last pass leaves a staged batch pending
            tier.wait_manager_idle()
            m.mark_seen(tier.seen[i], torch.arange(6, device=CUDA))
            tier.step_end()
            torch.cuda.synchronize()
            tier.wake()
            tier._manager_idle.wait(10)
        assert tier._staged is not None
        m.mark_seen(tier.seen[2], torch.arange(4, device=CUDA))
        torch.cuda.set_sync_debug_mode("error")
        try:
            tier.step_end()
            tier.notify_capture()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert tier._staged is None          # step_end published it, without a sync
        tier.wait_manager_idle()
        assert bool((tier.slot_table[2, :6] >= 0).all().item())


def _rows_into(pool, slots, block):
    out = pool.clone()
    for i, s in enumerate(slots):   # the reference: one row at a time
        out[s] = block[i]
    return out


@pytest.mark.parametrize("scratch_rows", [1, 3, 64])
def test_cuda_scatter_is_exact_and_makes_no_host_sync(scratch_rows):
    dev = torch.device("cuda", 0)
    rng = np.random.default_rng(scratch_rows)
    n_slots, n, sb, stride = 40, 17, 12288, 12288 + 4096
    stage = torch.from_numpy(rng.integers(0, 256, (n, stride), dtype=np.uint8)).pin_memory()
    slots = rng.permutation(n_slots)[:n]
    before = torch.from_numpy(rng.integers(0, 256, (n_slots, sb), dtype=np.uint8))
    pool = before.to(dev)
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.stream(side):
            scatter_rows(pool, slots, stage[:, :sb], scratch_bytes=scratch_rows * stride)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    side.synchronize()
    assert torch.equal(pool.cpu(), _rows_into(before, slots, stage[:, :sb]))
    pool2 = before.to(dev)
    copy_block(pool2, np.arange(5, 5 + n), stage[:, :sb].contiguous().pin_memory(), side)
    side.synchronize()
    assert torch.equal(pool2.cpu(), _rows_into(before, np.arange(5, 5 + n), stage[:, :sb]))


def test_host_store_rows_are_pinned_and_fires_copy_them_exactly(monkeypatch):
    with moet_env(monkeypatch, env(None, slots=14)) as m:     # no STORE_DIR: HostRowStore
        eng = MoetEngine(m, planes(), n_experts=E, dev=CUDA, top_k=2, tokens=2).boot()
        tier = m._TIER
        assert tier._store._layers[0].is_pinned()
        assert tier._store.rows_block(np.array([[0, 1], [1, 2]])).is_pinned()
        serve_checked(eng, 8)

