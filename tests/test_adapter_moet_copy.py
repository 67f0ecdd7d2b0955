"""The FP4 tier's batched host-to-pool copy (adapters/moet_copy.py): exact bytes for any
slot order, row size and stage stride; one copy into the pool per force_promote, not one
per row, through vLLM-Moet's real call sequence on both stores; the host store's pinning."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.overrides import TorchFunctionMode

from moet_surface_helpers import E, L, SLOT, env, moet_env, pack_reference, planes
from tierstore.adapters.moet_copy import by_layer, copy_block, scatter_rows
from tierstore.adapters.moet_store import HostRowStore
from tierstore.testing.moet_engine import MoetEngine


def _expected(pool, slots, block):
    out = pool.clone()
    for i, s in enumerate(slots):   # the reference: one row at a time
        out[s] = block[i]
    return out


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.sampled_from([(4096, 4096), (1000, 4096), (24, 24), (13, 16),
                                            (12, 12)]),
       st.booleans(), st.integers(1, 9), st.randoms(use_true_random=False))
def test_every_row_lands_in_its_slot_exactly(n_slots, sizes, run, chunk_rows, rnd):
    sb, stride = sizes
    n = rnd.randint(1, n_slots)
    rng = np.random.default_rng(rnd.randint(0, 2**32 - 1))
    stage = torch.from_numpy(rng.integers(0, 256, (n + 1, stride), dtype=np.uint8))
    block = stage[:n, :sb]                       # a store's stage view (pack stride)
    slots = (np.arange(n) + rnd.randint(0, n_slots - n) if run
             else rng.permutation(n_slots)[:n])
    before = torch.from_numpy(rng.integers(0, 256, (n_slots, sb), dtype=np.uint8))
    want = _expected(before, slots, block)
    pool = before.clone()
    copy_block(pool, slots, block)               # the CPU pool path
    assert torch.equal(pool, want)
    pool = before.clone()
    scatter_rows(pool, slots, block, scratch_bytes=chunk_rows * stride)   # the CUDA path's body
    assert torch.equal(pool, want)


def test_a_block_of_the_wrong_shape_is_refused():
    pool = torch.zeros(4, 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"uint8 \[2, 16\]"):
        copy_block(pool, [0, 1], torch.zeros(2, 8, dtype=torch.uint8))


def test_by_layer_keeps_keys_slots_and_victims_together():
    keys, slots, victims = by_layer(np.array([35, 2, 18, 3]), [7, 1, 4, 0], [-1, 9, -1, 5])
    assert keys.tolist() == [2, 3, 18, 35] and slots == [1, 0, 4, 7] and victims == [9, 5, -1, -1]


class _PoolWrites(TorchFunctionMode):
    """Counts tensor ops that write into the tier's pool storage."""
    WRITES = {torch.Tensor.copy_, torch.Tensor.index_copy_, torch.Tensor.__setitem__,
              torch.Tensor.index_put_}

    def __init__(self, pool):
        super().__init__()
        self.ptr, self.n = pool.untyped_storage().data_ptr(), 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.WRITES and args and isinstance(args[0], torch.Tensor) \
                and args[0].untyped_storage().data_ptr() == self.ptr:
            self.n += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("store", [True, False], ids=["pack", "host"])
def test_force_promote_writes_the_pool_once_not_once_per_row(monkeypatch, tmp_path, store):
    with moet_env(monkeypatch, env(tmp_path if store else None, slots=12, FORCE_POOL=1,
                                   DELTA_POLICY="need")) as m:
        eng = MoetEngine(m, planes(), n_experts=E, dev="cpu", top_k=2, tokens=2).boot()
        tier = m._TIER
        ref = pack_reference(tier) if store else None
        for layer, experts in ((0, range(12)), (1, range(2, 14)), (2, (15, 0, 9, 4, 11))):
            tier.wait_manager_idle()
            m.mark_seen(tier.seen[layer], torch.tensor(list(experts)))
            with _PoolWrites(tier.pool) as writes:
                got = tier.force_promote(layers=None, max_promote=None, pin=False)
            assert got == len(experts)           # rows promoted (later ones evict earlier)
            assert writes.n == 1, f"{writes.n} pool writes for {got} rows"
            assert eng.check(ref) >= got         # every mapped slot == the pack / planes
            tier.step_end()


def test_host_store_pins_only_when_cuda_is_there():
    p = planes()
    store = HostRowStore(L, E, SLOT, pinned=True)
    for k, (a, b) in p.items():
        store.add_layer(k, (a, b))
    block = store.rows_block(np.array([[0, 3], [0, 4], [2, 1]]))
    want = torch.stack([torch.cat(p[0], 1)[3], torch.cat(p[0], 1)[4], torch.cat(p[2], 1)[1]])
    assert torch.equal(block, want)
    stage = store.alloc_stage(4)
    cuda = torch.cuda.is_available()
    assert store._layers[0].is_pinned() == cuda and block.is_pinned() == cuda
    assert stage.is_pinned() == cuda
    assert not HostRowStore(L, E, SLOT, pinned=False).alloc_stage(2).is_pinned()
