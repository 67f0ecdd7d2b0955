"""The generated MoE model: real quantisation, packs that round-trip, the pool's benefit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tierstore as ts
from tierstore.errors import ConfigError
from tierstore.format import layouts
from tierstore.format.layouts import expert_shape_of
from tierstore.testing.model import make_moe_model, pool_benefit, write_model_packs


def test_model_rows_are_the_encoded_weights():
    m = make_moe_model(1, 4, 64, 64, seed=1)
    assert m.fp4_rows.shape == (1, 4, layouts.row_bytes("fp4", 64, 64))
    assert m.base_rows.shape == (1, 4, layouts.row_bytes("base", 64, 64))
    np.testing.assert_array_equal(m.fp4_rows[0, 2], layouts.encode_expert(m.w13[0, 2], m.w2[0, 2], "fp4"))
    np.testing.assert_array_equal(m.base_rows[0, 3], layouts.encode_expert(m.w13[0, 3], m.w2[0, 3], "base"))


def test_same_seed_same_model_and_heavy_tails():
    a, b = make_moe_model(1, 2, 64, 64, seed=5), make_moe_model(1, 2, 64, 64, seed=5)
    assert torch.equal(a.w13, b.w13) and np.array_equal(a.fp4_rows, b.fp4_rows)
    g = make_moe_model(1, 2, 64, 64, seed=5, dist="gaussian")
    kurt = lambda w: float(((w - w.mean()) ** 4).mean() / w.var() ** 2)
    assert kurt(a.w13) > 4.0 > kurt(g.w13)  # t4 is heavy-tailed, gaussian ~3
    with pytest.raises(ConfigError, match="dist"):
        make_moe_model(1, 2, 64, 64, dist="cauchy")


def test_routing_is_top_k_and_normalised():
    m = make_moe_model(1, 8, 64, 64)
    w, ids = m.route(m.tokens(5), 0, 3)
    assert ids.shape == (5, 3) and torch.allclose(w.sum(-1), torch.ones(5))
    assert all(len(set(r)) == 3 for r in ids.tolist())


def test_written_packs_open_with_layout_and_rows(tmp_path):
    m = make_moe_model(2, 4, 64, 128, seed=2)
    fp4_path, base_path = write_model_packs(m, tmp_path)
    for path, tag, rows in ((fp4_path, "fp4", m.fp4_rows), (base_path, "base", m.base_rows)):
        p = ts.Pack.open(path)
        assert p.tag == tag and p.n_layers == 2 and p.n_experts == 4
        assert p.slot_bytes == rows.shape[-1] and expert_shape_of(p) == (64, 128)
        assert [s.name for s in p.layout.sections] == [s.name for s in layouts.row_sections(tag, 64, 128)]
        np.testing.assert_array_equal(p.read_row(1, 3), rows[1, 3])
        p.verify()


def test_pool_benefit_error_falls_as_routed_experts_are_promoted():
    m = make_moe_model(1, 8, 128, 64, seed=0)
    r = pool_benefit(m, n_tokens=32, top_k=2, fractions=(0.0, 0.5, 1.0))
    base_only, half, full = r["rel_err"]
    assert base_only > half > full
    assert full < 0.35 and base_only > 1.5 * full
