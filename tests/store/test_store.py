"""ExpertStore public API on a real pack and the real engine (CPU pool; CUDA when present)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from store_helpers import assert_store_consistent

import tierstore as ts
from tierstore.errors import ClosedError, ConfigError, FormatError
from tierstore.testing.packs import make_random_pack

L, E, SLOT = 4, 16, 5000  # stride 8192; layer 3 is left unwritten
WRITTEN = [0, 1, 2]


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return make_random_pack(tmp_path_factory.mktemp("store"), L, E, SLOT, seed=5, layers=WRITTEN)


@pytest.fixture
def make_store(pack, device):
    opened = []

    def make(**kw):
        kw.setdefault("vram_slots", 8)
        kw.setdefault("device", device)
        store = ts.ExpertStore(pack, **kw)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def heat(store, layer, experts, times=1):
    for _ in range(times):
        store.record(layer, np.asarray(experts).reshape(-1, 1))


def test_fire_makes_routed_keys_resident_pinned_and_byte_exact(make_store, pack):
    store = make_store(ram_gb=0)
    routed = [(0, 1), (0, 2), (1, 3), (0, 1)]  # a repeat counts once
    fr = store.fire(routed)
    assert isinstance(fr, ts.FireResult)
    assert (fr.promoted, fr.already_resident, fr.over_cap, fr.no_slot) == (3, 0, 0, 0)
    assert fr.sources == {"pool": 0, "arena": 0, "read": 3} and fr.latency_s > 0
    assert np.all(store.tier("pool").pins(fr.keys) == 1)
    assert_store_consistent(store)
    again = store.fire(np.array([[0, 1], [2, 7]]))
    assert (again.promoted, again.already_resident) == (1, 1)
    store.release(fr)
    store.release(again)
    assert store.stats().pool.pinned == 0
    with pytest.raises(ConfigError, match="already released"):
        store.release(fr)


def test_fire_caps_new_promotions_hottest_first_and_reports_over_cap(make_store):
    store = make_store(ram_gb=0)
    heat(store, 1, [5, 6, 7, 8], times=1)
    heat(store, 1, [7], times=5)
    heat(store, 1, [5], times=3)
    fr = store.fire([(1, e) for e in (5, 6, 7, 8)], max_promote=2)
    assert fr.promoted == 2 and fr.over_cap == 2
    assert sorted(store.resident_keys("pool")[:, 1].tolist()) == [5, 7]
    assert sorted((fr.keys % E).tolist()) == [5, 7]  # over-cap keys are not left pinned
    store.release(fr)
    assert_store_consistent(store)


def test_pinned_keys_survive_any_later_promotion(make_store):
    store = make_store(ram_gb=0)
    fr = store.fire([(0, e) for e in range(6)])
    heat(store, 2, range(16), times=4)  # much hotter than the pinned keys
    store.promote([(2, e) for e in range(16)]).wait(10)
    resident = {tuple(k) for k in store.resident_keys("pool").tolist()}
    assert {(0, e) for e in range(6)} <= resident  # 6 pinned + only 2 new fitted
    assert len(resident) == 8
    store.release(fr)
    store.promote([(2, e) for e in range(16)]).wait(10)
    assert {k[0] for k in store.resident_keys("pool").tolist()} == {2}
    assert_store_consistent(store)


def test_fire_with_every_slot_pinned_reports_no_slot(make_store):
    store = make_store(ram_gb=0)
    first = store.fire([(0, e) for e in range(8)])
    second = store.fire([(1, 0), (0, 3)])
    assert second.no_slot == 1 and second.already_resident == 1
    assert second.keys.tolist() == [3]
    store.release(first)
    store.release(second)
    assert_store_consistent(store)


def test_promote_is_asynchronous_and_ticket_reports_promoted(make_store):
    store = make_store(ram_gb=0)
    ticket = store.promote(torch.tensor([[2, 1], [2, 2], [2, 2]]))
    assert ticket.wait(10) is True and ticket.done() and ticket.promoted == 2
    assert store.promote([(2, 1)]).wait(10)  # already resident: nothing to do
    assert_store_consistent(store)


def test_bad_keys_and_unwritten_layers_are_rejected_with_clear_errors(make_store, pack):
    store = make_store(ram_gb=0)
    with pytest.raises(ConfigError, match=r"layer 0, expert 16\) out of range"):
        store.fire([(0, 16)])
    with pytest.raises(ConfigError, match=r"layer 9"):
        store.promote([(9, 0)])
    with pytest.raises(FormatError, match=f"layer 3 is not written in {pack.path}"):
        store.fire([(3, 0)])
    with pytest.raises(ConfigError, match="record: layer 4 out of range"):
        store.record(4, np.zeros((1, 2), np.int64))
    assert store.stats().pool.pinned == 0
    assert_store_consistent(store)


def test_record_of_out_of_range_ids_drops_counts_and_logs_them_once(make_store, caplog):
    store = make_store(ram_gb=0)
    store.record(1, np.array([[0, 16], [17, 2]]))
    store.record(2, [[3, 99]])
    with caplog.at_level("WARNING", logger="tierstore.store"):
        st = store.stats()
    assert st.record_dropped == 3 and st.pool.misses == 3
    assert "dropped 3 expert id(s) out of range [0, 16), first: layer 1 expert id 16" in caplog.text
    store.record(0, np.array([[20]]))
    with caplog.at_level("WARNING", logger="tierstore.store"):
        assert store.stats().record_dropped == 4
    assert caplog.text.count("dropped") == 1
    assert store.pool_policy.scores()[1 * E + 0] > 0 and store.pool_policy.scores()[2 * E + 3] > 0


def test_record_counts_token_weighted_and_distinct_hits_per_tier(make_store):
    store = make_store(ram_gb=8 * 8192 / 2**30)
    store.fire([(0, 0)])
    store.load_arena([(0, 1)])
    store.record(0, np.array([[0, 1], [0, 2], [0, 0]]))  # 0 x4 (pool), 1 x1 (arena), 2 x1 (miss)
    store.record(0, np.array([[-1, 0]]))  # -1 = padding, ignored; 0 x5
    st = store.stats()
    assert isinstance(st, ts.StoreStats)
    assert (st.pool.hits, st.pool.misses, st.pool.distinct_hits, st.pool.distinct_misses) == (5, 2, 1, 2)
    assert (st.arena.hits, st.arena.misses, st.arena.distinct_hits) == (1, 1, 1)
    assert st.pool.hit_rate == pytest.approx(5 / 7) and st.pool.distinct_hit_rate == pytest.approx(1 / 3)
    assert st.fires == 1 and st.fire_p99_ms >= st.fire_p50_ms > 0


def test_step_counts_steps_not_fire_rounds_and_queues_lazy_promotions(make_store):
    store = make_store(ram_gb=0, lazy_per_step=3)
    heat(store, 1, [1, 2, 3, 4, 5], times=2)
    store.fire([(0, 0)])
    store.fire([(0, 1)])
    assert store.step_count == 0
    store.step()
    assert store.step_count == 1
    assert store.wait_idle(10)
    st = store.stats()
    assert st.lazy_queued == 3 and st.step_count == 1
    assert len({tuple(k) for k in store.resident_keys("pool").tolist()} & {(1, e) for e in range(1, 6)}) == 3
    assert_store_consistent(store)


def test_lazy_promotion_does_not_displace_hotter_residents(make_store):
    store = make_store(vram_slots=8, ram_gb=0, lazy_per_step=8)
    heat(store, 0, range(8), times=10)
    store.promote([(0, e) for e in range(8)]).wait(10)
    heat(store, 2, [9], times=1)  # one cold newcomer
    store.step()
    store.wait_idle(10)
    assert store.stats().lazy_rejected == 1
    assert {tuple(k) for k in store.resident_keys("pool").tolist()} == {(0, e) for e in range(8)}


def test_resident_keys_are_hottest_first(make_store):
    store = make_store(ram_gb=0)
    store.promote([(1, 1), (1, 2), (1, 3)]).wait(10)
    heat(store, 1, [2], times=3)
    heat(store, 1, [3], times=1)
    store.stats()  # folds the records
    assert store.resident_keys("pool").tolist()[:2] == [[1, 2], [1, 3]]
    with pytest.raises(ConfigError, match="tier must be"):
        store.resident_keys("disk")


def test_policy_per_tier_and_no_knob_leaks_across_tiers(pack):
    pol = {"pool": {"name": "heat", "half_life": 10}, "arena": "hybrid"}
    with ts.ExpertStore(pack, vram_slots=8, ram_gb=4 * 8192 / 2**30, device="cpu", policy=pol) as s:
        assert s.pool_policy.name == "heat" and s.arena_policy.name == "hybrid"
        assert s.pool_policy.half_life == 10 and s.arena_policy.half_life != 10
        assert s.pool_policy is not s.arena_policy
    # a half-life the pool policy cannot use is an error, not silently dropped
    with pytest.raises(ConfigError, match="half_life=3 given, but the pool policy 'lru' has no"):
        ts.ExpertStore(pack, vram_slots=8, device="cpu", policy="lru", half_life=3)


def test_bad_options_are_reported_together(pack):
    with pytest.raises(ConfigError) as err:
        ts.ExpertStore(pack, vram_slots=8, device="cpu", policy="mru", threads=0, direct="maybe", bogus=1)
    msg = str(err.value)
    for part in (
        "unknown option(s) bogus",
        "pool policy 'mru' unknown",
        "threads must be an integer >= 1 and <= 512, found 0",
        "direct='maybe': unknown O_DIRECT mode 'maybe'; expected one of auto, on, off",
    ):
        assert part in msg


def test_close_makes_later_calls_raise_closed_error(make_store):
    store = make_store(ram_gb=0)
    fr = store.fire([(0, 0)])
    store.close()
    store.close()  # idempotent
    for call in (
        lambda: store.fire([(0, 1)]),
        lambda: store.promote([(0, 1)]),
        lambda: store.record(0, np.zeros((1, 1), np.int64)),
        store.step,
        store.stats,
        lambda: store.release(fr),
        lambda: store.load_arena([(0, 2)]),
    ):
        with pytest.raises(ClosedError, match="closed store"):
            call()


def test_context_manager_closes(pack):
    with ts.ExpertStore(pack, vram_slots=8, device="cpu") as store:
        store.fire([(0, 0)])
    assert store.closed


def test_shared_engine_is_not_closed_by_the_store(pack):
    engine = ts.Engine(pack.path, threads=2)
    with ts.ExpertStore(pack, vram_slots=8, device="cpu", engine=engine) as store:
        store.fire([(1, 1)])
    assert not engine.closed
    engine.close()


def test_an_unclosed_store_is_closed_when_collected(pack):
    import gc

    store = ts.ExpertStore(pack, vram_slots=8, device="cpu")
    store.release(store.fire([(0, 1)]))
    store.step()
    assert store.wait_idle(10)
    engine = store.engine
    del store
    gc.collect()
    assert engine.closed  # the worker thread did not keep the store (and its engine) alive


def test_save_poolmon_and_preheat_round_trip_through_the_store_methods(pack, tmp_path):
    out = tmp_path / "pm.json"
    with ts.ExpertStore(pack, vram_slots=8, device="cpu") as a:
        heat(a, 2, [4, 5, 6], times=3)
        a.release(a.fire([(2, 4), (2, 5), (2, 6)]))
        a.save_poolmon(out)
        want = sorted(map(tuple, a.resident_keys("pool").tolist()))
    with ts.ExpertStore(pack, vram_slots=8, device="cpu", warm_start=str(out)) as b:
        assert sorted(map(tuple, b.resident_keys("pool").tolist())) == want
        assert_store_consistent(b)
    with ts.ExpertStore(pack, vram_slots=8, device="cpu") as c:
        summary = c.preheat(str(out), pool_fill=0.25)
        assert summary.pool_rows == 2 and len(c.resident_keys("pool")) == 2


def test_policy_spec_errors_are_clear(pack):
    with pytest.raises(ConfigError, match="arena policy given twice"):
        ts.ExpertStore(pack, vram_slots=8, device="cpu", policy={"arena": "lru"}, arena_policy="heat")
    with pytest.raises(ConfigError, match="pool policy must be a name"):
        ts.ExpertStore(pack, vram_slots=8, device="cpu", policy={"pool": 3})
    with pytest.raises(ConfigError, match="half_life given both"):
        ts.ExpertStore(
            pack, vram_slots=8, device="cpu", policy={"pool": {"name": "heat", "half_life": 4}}, half_life=5
        )


def test_release_refuses_another_stores_result_and_both_keep_their_pins(tmp_path):
    """A FireResult names the store that made it: another store's release() refuses it
    (it would drop its own pin on the same key and leak the owner's)."""
    from tierstore.errors import ConfigError
    from tierstore.testing.packs import make_random_pack

    pack_a = make_random_pack(tmp_path / "a", 2, 8, 512, seed=1)
    pack_b = make_random_pack(tmp_path / "b", 2, 8, 512, seed=2)
    with (
        ts.ExpertStore(pack_a, vram_slots=4, device="cpu", lazy_per_step=0) as a,
        ts.ExpertStore(pack_b, vram_slots=4, device="cpu", lazy_per_step=0) as b,
    ):
        fa, fb = a.fire([(0, 1)]), b.fire([(0, 1)])
        with pytest.raises(ConfigError, match="belongs to another store"):
            b.release(fa)
        assert b.evict([(0, 1)]) == 0 and a.evict([(0, 1)]) == 0  # both still pinned
        a.release(fa)
        b.release(fb)
        a.check_invariants(idle=True)
        b.check_invariants(idle=True)
