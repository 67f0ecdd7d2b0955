"""Slot-aware fused MoE reference: FP4 from the pool when resident, 2-bit base otherwise."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tierstore.compute.moe import BaseWeights, StaticPool, dense_moe, fused_moe, fused_moe_reference
from tierstore.errors import ConfigError
from tierstore.format import layouts
from tierstore.testing.model import make_moe_model, write_model_packs

L, E, H, I, K = 2, 8, 128, 64, 3


@pytest.fixture(scope="module")
def model():
    return make_moe_model(L, E, H, I, seed=3)


def _decoded(model, tag):
    rows = model.fp4_rows if tag == "fp4" else model.base_rows
    a, b = layouts.decode_experts(torch.from_numpy(rows), tag, H, I)
    return a.double(), b.double()


def _routing(model, T, layer=1, seed=0):
    x = model.tokens(T, seed)
    w, ids = model.route(x, layer, K)
    return x, w, ids


def _mixed_dense(model, resident_mask, layer):
    f13, f2 = _decoded(model, "fp4")
    b13, b2 = _decoded(model, "base")
    m = torch.as_tensor(resident_mask)[:, None, None]
    return torch.where(m, f13[layer], b13[layer]), torch.where(m, f2[layer], b2[layer])


def test_nothing_resident_uses_the_base_rows(model):
    x, w, ids = _routing(model, 12)
    pool = StaticPool(model.fp4_rows, n_slots=4)
    base = BaseWeights(model.base_rows, H, I)
    got = fused_moe_reference(x, w, ids, 1, pool, base, dtype=torch.float64)
    b13, b2 = _decoded(model, "base")
    ref = dense_moe(x, w, ids, b13[1], b2[1])
    assert torch.allclose(got, ref, rtol=1e-10, atol=1e-12)
    # and it is really the base: FP4 weights give a visibly different answer
    f13, f2 = _decoded(model, "fp4")
    assert (dense_moe(x, w, ids, f13[1], f2[1]) - ref).norm() > 0.1 * ref.norm()


def test_mixed_residency_follows_the_slot_table_not_the_slot_order(model):
    x, w, ids = _routing(model, 16)
    pool = StaticPool(model.fp4_rows, n_slots=E)
    resident = np.array([0, 1, 0, 1, 1, 0, 0, 1], bool)
    # promote in reverse order so slot numbers differ from expert numbers
    keys = [(1, e) for e in np.flatnonzero(resident)[::-1]] + [(0, 2)]
    pool.promote(keys)
    assert int(pool.slot_table[1, 7]) == 0 and int(pool.slot_table[0, 2]) >= 0
    base = BaseWeights(model.base_rows, H, I)
    got = fused_moe_reference(x, w, ids, 1, pool, base, dtype=torch.float64)
    ref = dense_moe(x, w, ids, *_mixed_dense(model, resident, 1))
    assert torch.allclose(got, ref, rtol=1e-10, atol=1e-12)


def test_fp4_is_closer_to_full_precision_than_base(model):
    x, w, ids = _routing(model, 32)
    full = dense_moe(x, w, ids, model.w13[1], model.w2[1])
    pool = StaticPool(model.fp4_rows, n_slots=E)
    base = BaseWeights(model.base_rows, H, I)
    err_base = (fused_moe_reference(x, w, ids, 1, pool, base, torch.float64) - full).norm() / full.norm()
    pool.promote([(1, e) for e in range(E)])
    err_fp4 = (fused_moe_reference(x, w, ids, 1, pool, base, torch.float64) - full).norm() / full.norm()
    assert err_fp4 < 0.35 and err_base > 1.5 * err_fp4


def test_out_of_range_ids_contribute_nothing_and_dtype_is_kept(model):
    x, w, ids = _routing(model, 6)
    pool = StaticPool(model.fp4_rows, n_slots=E)
    base = BaseWeights(model.base_rows, H, I)
    ids2 = ids.clone()
    ids2[:, 0] = -1
    ids2[0, 1] = E + 5
    got = fused_moe(x.bfloat16(), w, ids2, 1, pool, base)
    assert got.dtype == torch.bfloat16 and got.shape == (6, H)
    keep = torch.ones_like(w)
    keep[:, 0] = 0
    keep[0, 1] = 0
    ref = fused_moe_reference(x.bfloat16(), w * keep, ids.clamp(0, E - 1), 1, pool, base)
    rel = (got.float() - ref).norm() / ref.norm()
    assert rel < 1e-2


def test_duplicate_expert_within_and_across_tokens(model):
    x = model.tokens(4, 9)
    ids = torch.tensor([[2, 2, 5], [2, 5, 1], [1, 1, 1], [7, 0, 2]])
    w = torch.rand(4, 3)
    pool = StaticPool(model.fp4_rows, n_slots=E)
    pool.promote([(0, 2), (0, 1)])
    base = BaseWeights(model.base_rows, H, I)
    got = fused_moe_reference(x, w, ids, 0, pool, base, dtype=torch.float64)
    resident = np.zeros(E, bool)
    resident[[1, 2]] = True
    ref = dense_moe(x, w, ids, *_mixed_dense(model, resident, 0))
    assert torch.allclose(got, ref, rtol=1e-10, atol=1e-12)


def test_chunked_expert_groups_give_the_same_answer(model, monkeypatch):
    import tierstore.compute.moe as moe

    x, w, ids = _routing(model, 16)
    pool = StaticPool(model.fp4_rows, n_slots=E)
    pool.promote([(1, 0), (1, 3)])
    base = BaseWeights(model.base_rows, H, I)
    whole = fused_moe_reference(x, w, ids, 1, pool, base, torch.float64)
    monkeypatch.setattr(moe, "_CHUNK_BYTES", 1)  # one expert per chunk
    assert torch.allclose(
        fused_moe_reference(x, w, ids, 1, pool, base, torch.float64), whole, rtol=1e-12, atol=1e-14
    )


def test_base_weights_from_a_written_pack(model, tmp_path):
    fp4_path, base_path = write_model_packs(model, tmp_path)
    base = BaseWeights.from_pack(base_path)
    assert torch.equal(base.rows, torch.from_numpy(model.base_rows))
    assert (base.H, base.I) == (H, I)


def test_bad_arguments_are_named(model):
    pool = StaticPool(model.fp4_rows, n_slots=2)
    base = BaseWeights(model.base_rows, H, I)
    x = model.tokens(2)
    with pytest.raises(ConfigError, match=r"x must be \[T, H=128\]"):
        fused_moe(x[:, :64], torch.ones(2, 1), torch.zeros(2, 1, dtype=torch.long), 0, pool, base)
    with pytest.raises(ConfigError, match="layer 5"):
        fused_moe(x, torch.ones(2, 1), torch.zeros(2, 1, dtype=torch.long), 5, pool, base)
    with pytest.raises(ConfigError, match="do not fit"):
        pool.promote([(0, 1), (0, 2), (0, 3)])
    with pytest.raises(ConfigError, match="base rows must be uint8"):
        BaseWeights(model.base_rows[..., :100], H, I)


def test_with_the_real_expert_store_on_cpu(model, tmp_path):
    from tierstore import ExpertStore

    fp4_path, base_path = write_model_packs(model, tmp_path)
    base = BaseWeights.from_pack(base_path)
    x, w, ids = _routing(model, 8)
    with ExpertStore(fp4_path, vram_slots=6, device="cpu") as store:
        promoted = [2, 5, 7]
        store.promote([(1, e) for e in promoted]).wait()
        resident = (store.slot_table[1] >= 0).numpy()
        assert resident[promoted].all()
        got = fused_moe_reference(x, w, ids, 1, store, base, dtype=torch.float64)
        ref = dense_moe(x, w, ids, *_mixed_dense(model, resident, 1))
        assert torch.allclose(got, ref, rtol=1e-10, atol=1e-12)
        out = torch.full((8, H), float("nan"))
        fused_moe(x, w, ids, 1, store, base, out=out)
        assert torch.allclose(out.double(), ref, rtol=1e-4, atol=1e-5)
