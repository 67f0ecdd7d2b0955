"""Device-side residency on the CPU pool (the host spelling of the rule, csrc/store/src/
residency.cpp, through ExpertStore.device_residency): decisions equal the Python oracle's
(tests/residency_helpers.py) decide for decide, bytes equal the pack's, victims are never
routed in the same decide, the store keeps off the pool while attached and takes it back.
The CUDA kernels are checked against the same oracle in tests/store/test_residency_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from residency_helpers import ClockOracle, residency_store

from tierstore.errors import ConfigError


def _ids(values) -> torch.Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.int32))


def _assert_same(res, oracle: ClockOracle, store, pack) -> None:
    n_keys = pack.n_layers * pack.n_experts
    table = store.slot_table.view(-1).numpy().astype(np.int64)
    assert np.array_equal(table, oracle.table_array(n_keys))
    assert res.state.owner.numpy()[: res.n_slots].tolist() == oracle.owner
    c = res.counters()
    for name, value in oracle.c.items():
        assert c[name] == value, name
    assert c["bytes"] == oracle.c["placed"] * store.slot_bytes
    for key, slot in oracle.table.items():  # byte-exact against the pack
        assert np.array_equal(store.pool[slot].numpy(), pack.read_row(*divmod(key, pack.n_experts)))
    res.check()


def test_page_in_random_routing_matches_oracle_and_pack(tmp_path):
    pack, store = residency_store(tmp_path, n_layers=3, n_experts=8, slots=7)
    rng = np.random.default_rng(0)
    with store, store.device_residency(max_ids=6) as res:
        oracle = ClockOracle(3, 8, 7)
        for _ in range(40):
            for layer in range(3):
                ids = rng.integers(-1, 9, size=6)  # -1 and 8 are not experts: ignored
                before = oracle.table_array(24)
                res.page_in(layer, _ids(ids))
                oracle.decide(layer, ids)
                _assert_same(res, oracle, store, pack)
                routed = {layer * 8 + int(e) for e in ids if 0 <= e < 8}
                gone = set(np.flatnonzero((before >= 0) & (oracle.table_array(24) < 0)).tolist())
                assert not gone & routed  # never a victim routed here
                assert all(store.slot_table[layer, int(e)] >= 0 for e in ids if 0 <= e < 8)
        assert oracle.c["evicted"] > 0 and oracle.c["hits"] > 0  # the run exercised both


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(2, 9), st.integers(1, 12), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_decide_any_geometry_equals_oracle(n_layers, n_experts, slots, k, seed):
    from tierstore.store.residency import ResidencyState

    slots = min(slots, n_layers * n_experts)
    n_keys = n_layers * n_experts
    table = torch.full((n_keys,), -1, dtype=torch.int32)
    pool = torch.zeros(slots, 8, dtype=torch.uint8)
    rows = torch.arange(n_keys * 8, dtype=torch.int64).remainder(251).to(torch.uint8).view(n_keys, 8)
    state = ResidencyState(
        n_layers=n_layers,
        n_experts=n_experts,
        n_slots=slots,
        slot_bytes=8,
        max_ids=k,
        device="cpu",
        table=table,
        pool_ptr=pool.data_ptr(),
        arena_ptr=rows.data_ptr(),
        arena_rows=n_keys,
        arena_stride=8,
    )
    arena = np.random.default_rng(seed).random(n_keys) < 0.9  # row of key = key
    state.arena_row.copy_(torch.as_tensor(np.where(arena, np.arange(n_keys), -1).astype(np.int32)))
    oracle = ClockOracle(n_layers, n_experts, slots, arena_keys=np.flatnonzero(arena))
    rng = np.random.default_rng(seed)
    for _ in range(12):
        layer = int(rng.integers(n_layers))
        ids = rng.integers(-1, n_experts + 1, size=k)
        state.decide_host(layer, _ids(ids))
        plan = oracle.decide(layer, ids)
        got = state.plan.numpy()[: 2 * len(plan)].reshape(-1, 2).tolist()
        assert got == [list(p) for p in plan]
        state.view.gather_host()  # the page-in publishes the plan
        assert np.array_equal(table.numpy(), oracle.table_array(n_keys))
        for key, slot in oracle.table.items():
            assert torch.equal(pool[slot], rows[key])
        assert state.owner.numpy()[:slots].tolist() == oracle.owner
        assert state.ref.numpy()[:slots].tolist() == oracle.ref
        c = state.counters()
        assert all(c[name] == v for name, v in oracle.c.items())


def test_locked_keys_never_evicted_and_pool_too_small_counts_no_slot(tmp_path):
    pack, store = residency_store(tmp_path, n_layers=2, n_experts=8, slots=4)
    with store, store.device_residency(max_ids=8) as res:
        res.page_in(0, _ids([0, 1]))
        assert res.lock_keys([(0, 0), (0, 1)]) == 2
        for e in range(2, 8):  # a stream of misses: only 2 slots turn over
            res.page_in(1, _ids([e]))
            assert store.slot_table[0, 0] >= 0 and store.slot_table[0, 1] >= 0
        # 4 distinct ids into the 2 unlocked slots: two fit, two find no victim
        res.page_in(1, _ids([4, 5, 6, 7]))
        c = res.counters()
        assert c["no_slot"] == 2 and (store.slot_table[1, 4:] >= 0).sum() == 2
        res.check()


def test_key_missing_from_arena_is_not_placed(tmp_path):
    pack, store = residency_store(
        tmp_path, n_layers=1, n_experts=8, slots=4, arena_keys=[(0, e) for e in range(4)]
    )
    with store, store.device_residency(max_ids=4) as res:
        res.page_in(0, _ids([2, 6]))
        c = res.counters()
        assert (c["placed"], c["no_arena"]) == (1, 1)
        assert store.slot_table[0, 6] == -1 and store.slot_table[0, 2] >= 0
        assert res.refill([(0, 6)]) == 1  # the host reads it in ahead of need
        res.page_in(0, _ids([6]))
        slot = int(store.slot_table[0, 6])
        assert slot >= 0 and np.array_equal(store.pool[slot].numpy(), pack.read_row(0, 6))
        evicted = [e for e in range(4) if store.tier("arena").resident_slot(e) < 0]
        assert len(evicted) == 1  # the arena was full: one row made room
        assert int(res.state.arena_row[evicted[0]]) == -1  # and the device no longer maps it


def test_store_refuses_pool_changes_while_attached_and_takes_pool_back(tmp_path):
    pack, store = residency_store(tmp_path, n_layers=2, n_experts=8, slots=6)
    with store:
        store.fire([(0, 0), (0, 1)])  # resident before: kept by the residency
        store.release(store.fire([(0, 0)]))
        res = store.device_residency(max_ids=4)
        assert sorted(res.state.owner.numpy()[res.state.owner.numpy() >= 0].tolist()) == [0, 1]
        res.page_in(1, _ids([3, 4]))
        for call, args in ((store.fire, ([(1, 5)],)), (store.evict, ([(0, 0)],))):
            with pytest.raises(ConfigError, match="device-side residency"):
                call(*args)
        with pytest.raises(ConfigError, match="already has one"):
            store.device_residency(max_ids=4)
        store.step()  # lazy promotions stay off the pool
        res.close()
        store.check_invariants()
        keys = {tuple(k) for k in store.resident_keys().tolist()}
        assert keys == {(0, 0), (0, 1), (1, 3), (1, 4)}
        store.release(store.fire([(1, 5)]))  # the host has the pool again


def test_bad_arguments_are_one_config_error(tmp_path):
    pack, store = residency_store(tmp_path, n_layers=1, n_experts=8, slots=4)
    with store:
        with pytest.raises(ConfigError) as info:
            store.device_residency(max_ids=0, slots=9, chunk_bytes=100)
        text = str(info.value)
        assert "max_ids" in text and "slots" in text and "chunk_bytes" in text
        with store.device_residency(max_ids=2) as res:
            with pytest.raises(ConfigError, match="at most max_ids"):
                res.page_in(0, _ids(range(9)))
            with pytest.raises(ValueError, match="layer 3 out of range"):
                res.page_in(3, _ids([0]))


def test_fold_heat_hands_counts_to_the_store(tmp_path):
    pack, store = residency_store(tmp_path, n_layers=2, n_experts=8, slots=4)
    with store, store.device_residency(max_ids=4) as res:
        res.page_in(1, _ids([2, 2, 3]))
        assert res.fold_heat() == 3
        assert int(res.state.heat.sum()) == 0
        store.stats()  # the store folds what it was handed
        scores = store.pool_policy.scores()
        assert scores[8 + 2] > scores[8 + 3] > 0 == scores[0]
