"""The direct promote path (rows straight into pool slots), on the host: the slot-index
destination math, ``read_rows(rows=)`` into a scattered host pool from every source,
the path decision, and the FP4 tier's direct loads with failures (a CPU pool run
with VLLM_MOE_W2_TIERSTORE_PROMOTE=direct; the CUDA runs are in
test_adapter_moet_direct_gpu.py)."""
from __future__ import annotations

import errno

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import tierstore as ts
from moet_surface_helpers import (E, SLOT, W13, W2, env, moet_env, pack_reference, planes,
                                  serve_checked)
from store_helpers import assert_store_consistent
from tierstore.adapters.moet_copy import promote_path
from tierstore.adapters.moet_store import HostRowStore
from tierstore.errors import ConfigError, TierIOError
from tierstore.store.host_rows import destinations
from tierstore.testing.moet_engine import MoetEngine
from tierstore.testing.packs import make_random_pack

L_PACK, E_PACK, SB = 3, 16, 5000
CPU = torch.device("cpu")


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 24), st.integers(1, 3), st.integers(0, 40), st.randoms(use_true_random=False))
def test_slot_destinations_are_the_rows_of_the_slots(n_slots, pad, sb, rnd):
    out = torch.zeros(n_slots, sb + pad, dtype=torch.uint8)[:, : sb + pad]
    n = rnd.randint(1, n_slots)
    slots = np.array(rnd.sample(range(n_slots), n), dtype=rnd.choice([np.int64, np.int32]))
    got, on_device = destinations(out, n, sb, "t", rows=slots)
    assert not on_device and got.dtype == np.uint64
    assert got.tolist() == [out[int(s)].data_ptr() for s in slots]
    plain, _ = destinations(out, n, sb, "t")
    assert plain.tolist() == [out[i].data_ptr() for i in range(n)]


@pytest.mark.parametrize("rows, message", [
    ([0, 4], r"pack.x: read_rows: rows\[1\] = 4 is outside out's 4 rows"),
    ([-1, 2], r"rows\[0\] = -1 is outside"),
    ([1, 1], "rows must be unique"),
    ([0], "rows must be 2 integer row indices, found 1"),
    (np.array([0.0, 1.0]), "of dtype float64"),
])
def test_bad_slot_indices_are_refused_naming_the_file(rows, message):
    with pytest.raises(ConfigError, match=message):
        destinations(torch.zeros(4, 16, dtype=torch.uint8), 2, 16, "pack.x: read_rows", rows=rows)


@pytest.fixture
def pack(tmp_path):
    return make_random_pack(tmp_path, L_PACK, E_PACK, SB, seed=3)


@pytest.mark.parametrize("ram_rows, scan", [(0, False), (6, False), (6, True), (40, False)])
def test_read_rows_into_scattered_slots_is_byte_exact_from_every_source(pack, ram_rows, scan):
    with ts.ExpertStore(pack, vram_slots=1, ram_gb=ram_rows * pack.stride / 2**30,
                        device="cpu", threads=2) as store:
        rng = np.random.default_rng(ram_rows)
        pool = torch.from_numpy(rng.integers(0, 256, (30, SB + 8), dtype=np.uint8))
        first = rng.choice(L_PACK * E_PACK, 12, replace=False)
        rounds = [first, rng.permutation(first), rng.choice(L_PACK * E_PACK, 12, replace=False)]
        for i, keys in enumerate(rounds):          # round 1 re-reads round 0's rows
            before = pool.clone()
            pairs = np.stack([keys // E_PACK, keys % E_PACK], axis=1)
            slots = rng.permutation(30)[:12]
            hits = store.read_rows(pairs, pool, scan=scan, rows=slots)
            if i == 1:   # the rows round 0 read through the arena come from it now
                assert hits == (0 if scan else min(ram_rows, 12))
            want = before.clone()
            for (li, ei), s in zip(pairs, slots):
                want[s, :SB] = torch.from_numpy(pack.read_row(int(li), int(ei)).copy())
            assert torch.equal(pool, want)   # the slots exactly; other slots, row tails kept
            assert_store_consistent(store)
            assert not store._arena.key_pins.any()


def test_failed_read_into_slots_leaves_the_arena_as_it_was(pack):
    with ts.ExpertStore(pack, vram_slots=1, ram_gb=8 * pack.stride / 2**30, device="cpu",
                        threads=2) as store:
        pool = torch.zeros(10, SB, dtype=torch.uint8)
        store.read_rows([(0, 1), (0, 2)], pool, rows=[7, 3])     # into the arena
        resident = store._arena.resident_slot.copy()
        store.engine._inject_faults(fail_offset=pack.row_offset(1, 5) + 10, errno=errno.EIO)
        with pytest.raises(TierIOError, match="layer 1 expert 5"):
            store.read_rows([(0, 1), (1, 5), (0, 2)], pool, rows=[0, 1, 2])
        store.engine._inject_faults()
        assert np.array_equal(store._arena.resident_slot, resident)   # nothing admitted
        assert not store._arena.key_pins.any()
        assert_store_consistent(store)
        assert store.read_rows([(1, 5)], pool, rows=[9]) == 0
        assert np.array_equal(pool[9].numpy(), pack.read_row(1, 5))


def test_a_device_out_needs_an_engine_that_copies_to_it(pack):
    from tierstore.store.host_rows import _device_check
    with ts.ExpertStore(pack, vram_slots=1, device="cpu", threads=1) as store:
        with pytest.raises(ConfigError, match="engine writes host memory only"):
            _device_check(store.engine, torch.zeros(2, SB, dtype=torch.uint8), "read_rows")


class _PackLike:
    def rows_into(self, *a, **k):
        return 0


@pytest.mark.parametrize("mode, dev, store, cuda_engine, want", [
    ("auto", "cuda", _PackLike(), True, "direct"),
    ("auto", "cuda", _PackLike(), False, "staged"),      # tierstore built without CUDA
    ("auto", "cpu", _PackLike(), False, "staged"),       # a CPU pool keeps the batched copy
    ("auto", "cuda", HostRowStore(1, 2, 8), True, "staged"),
    ("staged", "cuda", _PackLike(), True, "staged"),
    ("direct", "cpu", _PackLike(), False, "direct"),
    ("direct", "cuda", _PackLike(), True, "direct"),
])
def test_promote_path_decision(mode, dev, store, cuda_engine, want):
    assert promote_path(mode, torch.device(dev), store, cuda_engine) == want


@pytest.mark.parametrize("dev, store, cuda_engine, message", [
    ("cpu", HostRowStore(1, 2, 8), False, "needs|no direct path.*STORE_DIR"),
    ("cuda", _PackLike(), False, "cannot copy to CUDA"),
])
def test_direct_mode_that_cannot_be_served_fails_loudly(dev, store, cuda_engine, message):
    with pytest.raises(ConfigError, match=f"TIERSTORE_PROMOTE=direct: .*({message})"):
        promote_path("direct", torch.device(dev), store, cuda_engine)


def test_promote_variable_is_validated_and_needs_a_pack_store(monkeypatch, tmp_path):
    from tierstore.adapters.moet_config import from_env
    with pytest.raises(ConfigError, match="TIERSTORE_PROMOTE=sideways: unknown promote path"):
        from_env(env(tmp_path, TIERSTORE_PROMOTE="sideways"))
    assert from_env(env(tmp_path, TIERSTORE_PROMOTE="Direct")).ts_promote == "direct"
    with moet_env(monkeypatch, env(None, TIERSTORE_PROMOTE="direct")) as m:
        with pytest.raises(ConfigError, match="set VLLM_MOE_W2_STORE_DIR"):
            m.get_tier(n_experts=E, dev=CPU, w13_bytes=W13, w2_bytes=W2)
    with moet_env(monkeypatch, env(tmp_path)) as m:
        assert m.get_tier(n_experts=E, dev=CPU, w13_bytes=W13, w2_bytes=W2)._promote_path == "staged"


def _no_stage(tier, monkeypatch):
    def staged(*a, **k):
        raise AssertionError("the direct path used the host stage")
    monkeypatch.setattr(tier, "_read_staged", staged)


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_direct_loads_serve_the_pack_exactly(monkeypatch, tmp_path, runner):
    with moet_env(monkeypatch, env(tmp_path, slots=14, TIERSTORE_PROMOTE="direct",
                                   TIERSTORE_RAM_GB=repr(20 * SLOT / 2**30))) as m:
        eng = MoetEngine(m, planes(), n_experts=E, dev="cpu", top_k=2, tokens=2,
                         runner=runner).boot()
        tier, ref = m._TIER, pack_reference(m._TIER)
        assert tier._promote_path == "direct"
        _no_stage(tier, monkeypatch)
        serve_checked(eng, 10, ref)
        assert tier._store.stats()["arena"]["rows"] > 0


def _loaded(m, dev=CPU):
    tier = m.get_tier(n_experts=E, dev=dev, w13_bytes=W13, w2_bytes=W2)
    for k, (a, b) in planes().items():
        tier.add_layer_host_planes(k, a.to(dev), b.to(dev))
    return tier


def _fill_layer0(m, tier):
    m.mark_seen(tier.seen[0], torch.arange(8))
    assert tier.force_promote() == 8
    tier.step_end()
    tier.wait_manager_idle()


@pytest.mark.parametrize("arena", [True, False])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_failed_direct_read_quarantines_the_victims_and_serves_nothing_wrong(
        monkeypatch, tmp_path, where, arena):
    ram = {"TIERSTORE_RAM_GB": repr(24 * SLOT / 2**30)} if arena else {}
    with moet_env(monkeypatch, env(tmp_path, slots=8, FORCE_POOL=1, DELTA_POLICY="need",
                                   TIERSTORE_PROMOTE="direct", **ram)) as m:
        tier = _loaded(m)
        ref = pack_reference(tier)
        _no_stage(tier, monkeypatch)
        bad = {"first": 0, "middle": 4, "last": 7}[where]
        others = torch.tensor([e for e in range(8) if e != bad])
        m.mark_seen(tier.seen[1], others)                     # layer 1's others into the arena
        assert tier.force_promote() == 7
        tier.step_end()
        tier.wait_manager_idle()
        _fill_layer0(m, tier)                                 # now every slot holds layer 0
        victims = tier.slot_table[0, :8].clone()
        assert bool((victims >= 0).all())
        store = tier._store.expert_store()
        store.engine._inject_faults(fail_offset=store.pack.row_offset(1, bad) + 100)
        m.mark_seen(tier.seen[1], torch.arange(8))            # 7 land (arena hits), 1 fails
        with pytest.raises(TierIOError, match=f"layer 1 expert {bad}"):
            tier.force_promote()
        store.engine._inject_faults()
        # The arena rows' copies landed in the victims' slots: every victim is unmapped,
        # every slot is free again, no slot serves a byte that is not its key's.
        assert bool((tier.slot_table == -1).all()) and bool((tier._mirror == -1).all())
        assert sorted(tier._free) == list(range(8))
        assert (tier._owners.owner == -1).all()
        assert not store._arena.key_pins.any()                # sources unpinned after copies
        tier.step_end()
        m.mark_seen(tier.seen[1], torch.arange(8))
        assert tier.force_promote() == 8                      # no slot was lost
        for e in range(8):
            assert torch.equal(tier.pool[int(tier.slot_table[1, e])], ref(1, e))


def test_a_verify_mismatch_on_the_direct_path_publishes_nothing(monkeypatch, tmp_path):
    p = planes()   # what _loaded wrote
    with moet_env(monkeypatch, env(tmp_path, slots=20)) as m:
        path = _loaded(m)._store.path
    with open(path, "r+b") as f:                             # bit rot in layer 1, expert 2
        f.seek((1 * E + 2) * SLOT + 100)
        f.write(b"\xff" * 8)
    with moet_env(monkeypatch, env(tmp_path, slots=20, TIERSTORE_VERIFY=1,
                                   TIERSTORE_PROMOTE="direct")) as m:
        t = m.get_tier(n_experts=E, dev=CPU, w13_bytes=W13, w2_bytes=W2)
        m.mark_seen(t.seen[1], torch.tensor([1, 2, 3]))
        with pytest.raises(TierIOError, match="layer 1 expert 2"):
            t.force_promote()
        assert bool((t.slot_table == -1).all()) and len(t._free) == 20
        m.mark_seen(t.seen[1], torch.tensor([1, 3]))
        assert t.force_promote() == 2
        assert torch.equal(t.pool[int(t.slot_table[1, 3])], torch.cat(p[1], 1)[3])


def test_pack_store_without_a_cuda_engine_reads_on_the_host(monkeypatch, tmp_path):
    from tierstore.adapters import moet_store
    from tierstore.adapters.moet_config import from_env
    monkeypatch.setattr(moet_store, "cuda_engine", lambda: False)   # CUDA torch, CPU tierstore
    store = moet_store.make_store(from_env(env(tmp_path)), "delta", 3, E, SLOT, True,
                                  device=torch.device("cuda", 0))
    assert store._engine_device() == "cpu" and store.writes_into(torch.zeros(1, SLOT,
                                                                              dtype=torch.uint8))
    with pytest.raises(ConfigError, match=r"rows_into: 2 rows for 1 slots"):
        store.rows_into([(0, 1), (0, 2)], torch.zeros(4, SLOT, dtype=torch.uint8), [0])
    store.release()
