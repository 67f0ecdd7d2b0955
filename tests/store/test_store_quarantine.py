"""A row that fails its checksum under ``quarantine=True`` (what the engines' faces set):
the load that read it fails naming it, later fires and lazy promotions leave it out
(the engine serves its fallback), it is counted and named once; without the option
nothing changes (every fire of it fails again)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from store_helpers import assert_store_consistent
from store_helpers import corrupt_in_place as _corrupt_in_place

import tierstore as ts
from tierstore.testing.packs import make_random_pack

L, E, SLOT = 3, 16, 5000


@pytest.fixture
def pack(tmp_path):
    return make_random_pack(tmp_path, L, E, SLOT, seed=4)


def test_a_rotten_row_is_quarantined_once_and_the_rest_keeps_loading(pack, caplog):
    _corrupt_in_place(pack, 1, 5)
    with ts.ExpertStore(
        pack, vram_slots=8, ram_gb=0, device="cpu", lazy_per_step=0, quarantine=True
    ) as store:
        with caplog.at_level(logging.WARNING, logger="tierstore.store"):
            with pytest.raises(ts.TierIOError, match=r"layer 1 expert 5"):
                store.fire([(1, 4), (1, 5)])
            assert store.quarantined_keys().tolist() == [[1, 5]]
            assert store.stats().quarantined == 1
            fr = store.fire([(1, 4), (1, 5), (0, 3)])  # no error: (1, 5) left out
            table = store.slot_table.cpu().numpy()
            assert table[1, 5] == -1 and table[1, 4] >= 0 and table[0, 3] >= 0
            store.release(fr)
            fr = store.fire([(1, 5)])
            assert fr.promoted == 0 and table[1, 5] == -1
            store.release(fr)
        named = [r for r in caplog.records if "quarantined" in r.getMessage()]
        assert len(named) == 1 and "layer 1 expert 5" in named[0].getMessage()
        assert_store_consistent(store)


def test_lazy_promotions_leave_a_quarantined_row_out(pack):
    _corrupt_in_place(pack, 2, 7)
    with ts.ExpertStore(
        pack, vram_slots=8, ram_gb=0, device="cpu", lazy_per_step=4, quarantine=True
    ) as store:
        for _ in range(3):
            store.record(2, np.array([[7, 8]]))
            store.step()
            store.wait_idle()
        assert store.quarantined_keys().tolist() == [[2, 7]]
        keys = store.resident_keys().tolist()
        assert [2, 8] in keys and [2, 7] not in keys
        assert store.stats().quarantined == 1


def test_without_the_option_every_fire_of_the_row_fails_again(pack):
    _corrupt_in_place(pack, 0, 2)
    with ts.ExpertStore(pack, vram_slots=8, ram_gb=0, device="cpu", lazy_per_step=0) as store:
        for _ in range(2):
            with pytest.raises(ts.TierIOError, match=r"layer 0 expert 2"):
                store.fire([(0, 2)])
        assert store.quarantined_keys().tolist() == [] and store.stats().quarantined == 0


def test_the_tiered_vllm_face_serves_a_rotten_expert_from_its_base_row(tmp_path):
    """The upstream tiered face: prefill routed to a rotten row does not stop the layer;
    the row is quarantined, that expert is computed from its 2-bit base row, the others
    from the pool."""
    import os
    import shutil

    import torch
    from adapter_helpers import make_tier, model_and_dir

    from tierstore.format import Pack

    _, d = model_and_dir()
    private = tmp_path / "packs"
    shutil.copytree(d, private)
    model_and_dir.packs[str(private)] = {
        k: str(private / os.path.basename(v)) for k, v in model_and_dir.packs[d].items()
    }
    fp4 = Pack.open(model_and_dir.packs[str(private)]["fp4"])
    _corrupt_in_place(fp4, 0, 3)
    fp4.close()
    tier = make_tier(str(private), slots=16)
    try:
        ids = torch.tensor([[3, 1], [2, 3]] * 9)  # 18 tokens: a prefill batch
        tier.ensure_resident(0, ids)  # no error: (0, 3) quarantined
        assert tier.store.quarantined_keys().tolist() == [[0, 3]]
        table = tier.store.slot_table.cpu().numpy()
        assert table[0, 3] == -1 and table[0, 1] >= 0 and table[0, 2] >= 0
        x = torch.randn(18, 64)
        out = tier.moe_w2_forward(x, torch.full((18, 2), 0.5), ids, 0)
        assert out.shape == (18, 64) and bool(torch.isfinite(out).all())
    finally:
        tier.shutdown()
