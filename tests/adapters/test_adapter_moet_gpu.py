"""The vLLM-Moet FP4 tier surface on a real GPU: CUDA-graph capture with
capture_error_mode="global" while the store's worker reads, no host sync in a step_end
with nothing to publish, pool bytes equal to the pack after every step."""

from __future__ import annotations

import time

import pytest
import torch
from moet_surface_helpers import E, L, env, moet_env, pack_reference, planes, serve_checked

from tierstore.testing.moet_engine import MoetEngine

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]
CUDA = torch.device("cuda", 0)


@pytest.mark.parametrize("store_dir", [True, False], ids=["pack", "private"])
@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_graph_served_steps_keep_pool_equal_to_pack(monkeypatch, tmp_path, runner, store_dir):
    with moet_env(monkeypatch, env(tmp_path if store_dir else None, slots=14)) as m:
        eng = MoetEngine(
            m, planes(), n_experts=E, dev=CUDA, top_k=2, tokens=2, runner=runner, graphs=True
        ).boot()
        assert eng.graph is not None
        tier, ref = m._TIER, pack_reference(m._TIER)
        assert tier.pool.is_cuda and tier.slot_table.is_cuda and tier.seen.is_cuda
        assert tier.expert_store.slot_table is tier.slot_table  # one table, adopted
        serve_checked(eng, 10, ref)


def test_capture_in_global_mode_while_the_store_worker_reads(monkeypatch, tmp_path):
    with moet_env(monkeypatch, env(tmp_path, slots=40, DELTA_PROMOTE=16)) as m:
        eng = MoetEngine(m, planes(), n_experts=E, dev=CUDA, top_k=2, tokens=4).boot()
        tier = m._TIER
        es = tier.expert_store
        tier.wait_manager_idle()
        es.engine._inject_faults(delay_us=1_000_000)  # each read sleeps 1 s: the worker is busy
        for key in range(L):
            m.mark_seen(tier.seen[key], torch.arange(8, device=CUDA))
        tier.step_end()  # seen copied to the host, folded a step late:
        tier.step_end()  # now, and the background reads are queued
        deadline = time.monotonic() + 5
        while not es.batches_in_flight and time.monotonic() < deadline:
            time.sleep(0.002)
        assert es.batches_in_flight  # the worker's batch is reading
        graph = torch.cuda.CUDAGraph()
        eng._route()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            eng._forward()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph, capture_error_mode="global"):
            eng._forward()  # raises if another thread calls CUDA now
        es.engine._inject_faults()  # reads already started still sleep, then land
        assert es.wait_idle(10)
        before = tier.slot_table.clone()
        assert es.publish_pending  # read in the background during the capture,
        tier.wait_manager_idle()  # published at the next step's boundary
        assert int((tier.slot_table >= 0).sum()) > int((before >= 0).sum())
        graph.replay()
        assert int(eng.out.item()) == eng.expected_out()
        assert eng.check(pack_reference(tier)) > 0


def test_step_end_makes_no_host_sync_with_nothing_to_publish(monkeypatch, tmp_path):
    with moet_env(monkeypatch, env(tmp_path, slots=40, DELTA_POLICY="need")) as m:
        MoetEngine(m, planes(), n_experts=E, dev=CUDA).boot()
        tier = m._TIER
        tier.step_end()
        m.mark_seen(tier.seen[2], torch.arange(4, device=CUDA))
        torch.cuda.set_sync_debug_mode("error")
        try:
            tier.step_end()
            tier.notify_capture()
            tier.wait_manager_idle()
        finally:
            torch.cuda.set_sync_debug_mode("default")
