"""Device-side residency on a CUDA pool: the decide kernel's choices equal the Python
oracle's (tests/residency_helpers.py) decide for decide, eager and replayed in a CUDA
graph; after each step every pool slot holds exactly its key's bytes from the pack;
victims are never routed in the same decide; the MoE output equals the all-resident one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from residency_helpers import ClockOracle, residency_store

pytestmark = pytest.mark.gpu


def _check(store, pack, oracle: ClockOracle, res) -> None:
    torch.cuda.synchronize()
    n_keys = pack.n_layers * pack.n_experts
    table = store.slot_table.view(-1).cpu().numpy().astype(np.int64)
    assert np.array_equal(table, oracle.table_array(n_keys))
    assert res.state.owner.cpu().numpy()[: res.n_slots].tolist() == oracle.owner
    assert res.state.ref.cpu().numpy()[: res.n_slots].tolist() == oracle.ref
    c = res.counters()
    assert all(c[k] == v for k, v in oracle.c.items()), (c, oracle.c)
    keys = np.array(sorted(oracle.table), dtype=np.int64)
    if len(keys):
        got = store.pool[torch.as_tensor([oracle.table[k] for k in keys], device="cuda")].cpu().numpy()
        want = np.stack([pack.read_row(*divmod(k, pack.n_experts)) for k in keys])
        assert np.array_equal(got, want)  # byte-exact against the pack
    res.check()


def test_decide_kernel_matches_oracle_and_pack_every_step(tmp_path):
    pack, store = residency_store(
        tmp_path, n_layers=3, n_experts=40, slot_bytes=8192, slots=37, device="cuda"
    )
    rng = np.random.default_rng(0)
    with store, store.device_residency(max_ids=48, gather_blocks=7, chunk_bytes=4096) as res:
        oracle = ClockOracle(3, 40, 37)
        for _ in range(30):
            layer = int(rng.integers(3))
            ids = rng.integers(-1, 41, size=int(rng.integers(1, 49)))
            before = oracle.table_array(120)
            res.page_in(layer, torch.as_tensor(ids.astype(np.int32), device="cuda"))
            oracle.decide(layer, ids)
            _check(store, pack, oracle, res)
            routed = {layer * 40 + int(e) for e in ids if 0 <= e < 40}
            gone = set(np.flatnonzero((before >= 0) & (oracle.table_array(120) < 0)).tolist())
            assert not gone & routed
        every = np.concatenate([np.arange(40), [-1] * 8])  # 40 distinct ids, 37 slots
        res.page_in(1, torch.as_tensor(every.astype(np.int32), device="cuda"))
        oracle.decide(1, every)
        _check(store, pack, oracle, res)
        assert oracle.c["evicted"] > 0 and oracle.c["no_slot"] > 0 and oracle.c["hits"] > 0


def test_page_in_replayed_in_a_cuda_graph(tmp_path):
    L, E, k = 4, 32, 6
    pack, store = residency_store(
        tmp_path, n_layers=L, n_experts=E, slot_bytes=65536, slots=40, device="cuda"
    )
    rng = np.random.default_rng(1)
    with store, store.device_residency(max_ids=k) as res:
        ids = torch.zeros(L, k, dtype=torch.int32, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
            for layer in range(L):
                res.page_in(layer, ids[layer])
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        res.reset()  # capture launched nothing; start from empty anyway
        oracle = ClockOracle(L, E, 40)
        for _ in range(12):
            step = np.stack([rng.choice(E, k, replace=False) for _ in range(L)]).astype(np.int32)
            ids.copy_(torch.from_numpy(step))
            graph.replay()
            for layer in range(L):
                oracle.decide(layer, step[layer])
            _check(store, pack, oracle, res)


def test_moe_output_equals_all_resident(tmp_path):
    from tierstore import ExpertStore
    from tierstore.cli.bench_decode_loop import create_decode_pack
    from tierstore.compute import BaseWeights, StaticPool, fused_moe
    from tierstore.format.pack import Pack

    L, E, H, I, k = 2, 16, 128, 64, 4
    pack = Pack.open(create_decode_pack(str(tmp_path / "p"), L, E, H, I))
    rows = np.stack([[pack.read_row(l, e) for e in range(E)] for l in range(L)])
    static = StaticPool(rows, L * E, device="cuda")
    static.promote([(l, e) for l in range(L) for e in range(E)])
    base = BaseWeights(torch.zeros(L, E, 4 * H * I, dtype=torch.uint8), H, I, "cuda")
    store = ExpertStore(
        pack, vram_slots=6, ram_gb=L * E * pack.stride / 2**30, device="cuda", lazy_per_step=0, threads=2
    )
    rng = np.random.default_rng(2)
    with store:
        store.load_arena([(l, e) for l in range(L) for e in range(E)])
        with store.device_residency(max_ids=k) as res:
            for _ in range(10):
                for layer in range(L):
                    ids = torch.as_tensor(
                        rng.choice(E, (1, k), replace=False).astype(np.int32), device="cuda"
                    )
                    w = torch.rand(1, k, device="cuda")
                    x = torch.randn(1, H, device="cuda", dtype=torch.bfloat16)
                    want = fused_moe(x, w, ids, layer, static, base)
                    # hits first: the resident experts' share, then the misses' once paged in
                    res.page_in(layer, ids, gather=False)
                    hit = store.slot_table[layer][ids.long()] >= 0
                    part = fused_moe(x, w, torch.where(hit, ids, -1), layer, store, base).float()
                    res.gather()
                    part += fused_moe(x, w, torch.where(hit, -1, ids), layer, store, base).float()
                    torch.testing.assert_close(part, want.float(), rtol=2e-2, atol=2e-2)
                    got = fused_moe(x, w, ids, layer, store, base)
                    assert torch.equal(got, want)
            assert res.counters()["evicted"] > 0


def test_host_device_pointer_of_the_arena_reads_the_same_bytes(tmp_path):
    from tierstore import _C

    pack, store = residency_store(tmp_path, n_layers=1, n_experts=4, slot_bytes=4096, slots=4, device="cuda")
    with store:
        rows = store.arena.rows
        assert _C.host_device_pointer(rows.data_ptr()) != 0
