"""MoetTier: the tier surface vLLM-Moet calls, on a real store over generated packs."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from adapter_helpers import E, L, P, env_for, make_tier, model_and_dir, one_torch_thread, slot_bytes  # noqa: F401
from tierstore.adapters.moet_config import config_from_env
from tierstore.adapters.vllm_moet import MoetTier
from tierstore.errors import CapacityError, ClosedError, ConfigError, FormatError
from tierstore.compute.moe import dense_moe
from tierstore.store.sizing import fire_floor

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def store_dir():
    return model_and_dir()[1]


@pytest.fixture
def tier(store_dir):
    t = make_tier(store_dir, slots=16)
    yield t
    t.shutdown()


def test_fixed_pool_is_allocated_at_construction_with_the_pack_geometry(tier):
    assert tier.n_slots == 16
    assert tuple(tier.slot_table.shape) == (L, E) and tier.slot_table.dtype == torch.int32
    assert tuple(tier.pool.shape) == (16, slot_bytes())
    assert tuple(tier.seen.shape) == (L, E) and tier.seen.dtype == torch.uint8
    assert (tier.hidden_size, tier.intermediate_size) == (64, 64)
    assert bool((tier.slot_table == -1).all())


@pytest.mark.parametrize("env_policy, policy", [("freq", "heat"), ("need", "hybrid"), ("lru", "lru")])
def test_env_policy_reaches_the_store(store_dir, env_policy, policy):
    with make_tier(store_dir, DELTA_POLICY=env_policy) as t:
        assert t.store.pool_policy.name == policy


def test_missing_store_dir_is_a_config_error_naming_the_variable():
    with pytest.raises(ConfigError, match="VLLM_MOE_W2_STORE_DIR is not set"):
        MoetTier(config_from_env({}), device="cpu")


def test_directory_without_packs_is_a_format_error_naming_it(tmp_path):
    with pytest.raises(FormatError, match=str(tmp_path)):
        MoetTier(config_from_env(env_for(str(tmp_path))), device="cpu")


# -- auto sizing and the fire floor ------------------------------------------------
def test_auto_pool_is_unusable_until_finalize_auto(store_dir):
    with make_tier(store_dir, slots=None) as t:
        with pytest.raises(ConfigError, match="call finalize_auto"):
            t.slot_table
        assert t.n_slots is None
        reserve = 3 * 2**30
        assert t.finalize_auto(free_bytes=reserve + 10 * slot_bytes() + 100) == 10
        assert t.finalize_auto(free_bytes=1) == 10          # sized once, never again
        assert tuple(t.pool.shape) == (10, slot_bytes())


def test_auto_pool_honours_reserve_and_max_gb(store_dir):
    cap = 5 * slot_bytes() / 2**30
    with make_tier(store_dir, slots=None, DELTA_RESERVE_GB=0, DELTA_MAX_GB=repr(cap)) as t:
        assert t.finalize_auto(free_bytes=2**30) == 5


def test_floor_checked_before_auto_sizing_is_deferred_not_refused(store_dir):
    floor = fire_floor(L, 2)                                  # 3 * 2 * 1.7 = 10
    with make_tier(store_dir, slots=None, DELTA_RESERVE_GB=0) as t:
        assert t.check_pool_floor(top_k=2) == floor           # the reference refused here
        assert t.finalize_auto(free_bytes=floor * slot_bytes()) == floor
    with make_tier(store_dir, slots=None, DELTA_RESERVE_GB=0) as t:
        t.check_pool_floor(top_k=2)
        with pytest.raises(CapacityError, match=rf"{floor - 1} slots .* fire floor of {floor} slots"
                                                r".*VLLM_MOE_W2_FORCE_POOL=1"):
            t.finalize_auto(free_bytes=(floor - 1) * slot_bytes())


def test_pool_under_the_floor_warns_with_force_pool(store_dir):
    with make_tier(store_dir, slots=8, FORCE_POOL=1) as t:
        with pytest.warns(RuntimeWarning, match="continuing because VLLM_MOE_W2_FORCE_POOL=1"):
            t.check_pool_floor(top_k=2, n_spec=1, max_num_seqs=4)
    with make_tier(store_dir, slots=8) as t:
        with pytest.raises(CapacityError, match="top_k=2, n_spec=1, max_num_seqs=4"):
            t.check_pool_floor(top_k=2, n_spec=1, max_num_seqs=4)


# -- seen marks -------------------------------------------------------------------
def test_mark_seen_marks_only_valid_ids_of_that_layer(tier):
    tier.mark_seen(1, torch.tensor([[3, -1], [3, 7], [E, 0], [-7, 3 * E]], dtype=torch.int32))
    expected = torch.zeros(L, E, dtype=torch.uint8)
    expected[1, [0, 3, 7]] = 1
    assert torch.equal(tier.seen, expected)
    tier.mark_seen("model.layers.2.mlp.experts", torch.tensor([[5]]))
    assert tier.seen_pairs().tolist() == [[1, 0], [1, 3], [1, 7], [2, 5]]


def test_extra_seen_rows_are_marked_but_never_promoted(store_dir):
    cfg = config_from_env(env_for(store_dir))
    with MoetTier(cfg, device="cpu", extra_seen_rows=1) as t:
        assert tuple(t.seen.shape) == (L + 1, E)
        t.mark_seen(L, torch.tensor([[1, 2]]))             # the MTP drafter's row
        assert t.seen[L].sum() == 2 and len(t.seen_pairs()) == 0
        assert t.force_promote().promoted == 0


# -- fire, prefill, step ------------------------------------------------------------
def test_force_promote_makes_seen_experts_resident_and_pins_until_step_end(tier):
    tier.step_begin()
    tier.mark_seen(0, torch.tensor([[1, 4]]))
    tier.mark_seen(2, torch.tensor([[6, 1]]))
    result = tier.force_promote()
    assert result.promoted == 4
    for layer, expert in [(0, 1), (0, 4), (2, 1), (2, 6)]:
        assert int(tier.slot_table[layer, expert]) >= 0
    assert not result.released
    tier.step_end()
    assert result.released and int(tier.seen.sum()) == 0
    tier.store.check_invariants()


def test_force_promote_is_capped_by_gate_max_promote(store_dir):
    with make_tier(store_dir, GATE_MAX_PROMOTE=3) as t:
        t.mark_seen(0, torch.arange(E).view(1, -1))
        assert t.force_promote().promoted == 3
        assert int((t.slot_table[0] >= 0).sum()) == 3
        assert t.force_promote(max_promote=2, pin=False).promoted == 2
        t.step_end()


def test_step_end_records_heat_and_advances_the_store(tier):
    before = tier.store.stats()
    tier.step_begin()
    tier.mark_seen(0, torch.tensor([[2, 3]]))
    tier.mark_seen(1, torch.tensor([[3]]))
    tier.step_end()
    after = tier.store.stats()
    assert after.step_count == before.step_count + 1
    looked = after.pool.hits + after.pool.misses - before.pool.hits - before.pool.misses
    assert looked == 3
    assert tier.store.pool_policy.scores()[[2, 3, E + 3]].min() > 0


def test_ensure_resident_promotes_the_prefill_layer(tier):
    ids = torch.tensor([[0, 5], [5, -1], [2, 0]])
    result = tier.ensure_resident(1, ids)
    assert sorted(tier.slot_table[1].ge(0).nonzero().flatten().tolist()) == [0, 2, 5]
    tier.step_end()
    assert result.released


def test_ensure_resident_is_refused_during_graph_capture(tier, monkeypatch):
    monkeypatch.setattr("tierstore.adapters.moet_native._capturing", lambda: True)
    with pytest.raises(ConfigError, match="during CUDA-graph capture"):
        tier.ensure_resident(0, torch.tensor([[1]]))


def test_wait_manager_idle_returns_once_lazy_promotions_landed(tier):
    tier.mark_seen(0, torch.tensor([[1, 2, 3]]))
    tier.step_end()                                          # queues lazy promotions
    assert tier.wait_manager_idle(timeout=10.0)


# -- forward ---------------------------------------------------------------------
def test_moe_w2_forward_reads_fp4_for_promoted_experts(tier):
    model = model_and_dir()[0]
    x = model.tokens(4, seed=3)
    w, ids = model.route(x, 0, 2)
    ref = dense_moe(x, w, ids, model.w13[0], model.w2[0]).float()
    err = lambda out: float((out - ref).norm() / ref.norm())  # noqa: E731
    base_only = tier.moe_w2_forward(x, w, ids, 0)
    assert base_only.shape == x.shape and base_only.dtype == x.dtype
    tier.mark_seen(0, ids)
    tier.force_promote()
    promoted = tier.moe_w2_forward(x, w, ids, "model.layers.0.mlp.experts")
    assert err(promoted) < 0.5 * err(base_only)
    tier.step_end()


# -- warm start and lifecycle ----------------------------------------------------------
def test_preload_pool_reads_the_pool_heat_file_and_snapshots_it(store_dir, tmp_path):
    d = model_and_dir(seed=3)[1]                 # own directory: the heat file lands there
    heat = {"TIERSTORE_POOL_HEAT": 1}            # POOL_HEAT* are vLLM-Moet's base tier's
    with make_tier(d, **heat) as first:
        assert first.preload_pool() == 0                      # no file yet: cold
        first.mark_seen(1, torch.tensor([[0, 1, 2, 3]]))
        first.force_promote()
        first.step_end()
    files = [f for f in os.listdir(d) if f.startswith("pool-heat")]
    assert files == ["pool-heat.fp4.rank0of1.json"]           # written on shutdown
    with make_tier(d, **heat) as second:
        assert second.preload_pool() == 4                     # the 4 hot experts (<= 0.9 of 16)
        assert sorted(second.slot_table[1].ge(0).nonzero().flatten().tolist()) == [0, 1, 2, 3]


def test_shutdown_is_idempotent_and_use_after_is_an_error(store_dir):
    t = make_tier(store_dir)
    t.shutdown()
    t.shutdown()
    with pytest.raises(ClosedError, match="after shutdown"):
        t.force_promote()
    assert np.asarray(t.seen_pairs()).shape == (0, 2)


def test_tier_preheat_fills_the_arena_from_the_packs_heat_file():
    from tierstore.warm import arena_heat_path, save_arena_heat
    d = model_and_dir(seed=2)[1]                 # own directory: the heat file stays here
    with make_tier(d) as first:
        first.backend().rows_for([(0, 1), (2, 5), (1, 7)])
        save_arena_heat(first.store, arena_heat_path(first.pack_path))
    with make_tier(d) as warm:                   # an arena preheats from the heat file
        assert sorted(map(tuple, warm.store.resident_keys("arena").tolist())) == [(0, 1), (1, 7), (2, 5)]
    with make_tier(d, TIERSTORE_RAM_GB=0) as cold:   # no arena, nothing to preheat
        assert len(cold.store.resident_keys("arena")) == 0
