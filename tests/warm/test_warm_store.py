"""Warm start against a real ExpertStore on the CPU pool: snapshots, preheat, faults."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import warnings

import numpy as np
import pytest

store_mod = pytest.importorskip("tierstore.store")

from tierstore import warm as ws  # noqa: E402
from tierstore.testing.packs import make_random_pack  # noqa: E402

L, E, SLOT = 4, 16, 1000  # stride 4096: rows are not page-sized, like real experts
N_SLOTS, ARENA_ROWS = 16, 24


@pytest.fixture
def pack(tmp_path):
    return make_random_pack(tmp_path / "pack", L, E, SLOT, seed=11)


def open_store(pack, device="cpu", **kw):
    kw.setdefault("vram_slots", N_SLOTS)
    kw.setdefault("ram_gb", ARENA_ROWS * pack.stride / 2**30)
    return store_mod.ExpertStore(pack, device=device, **kw)


def poolmon_file(path, pack, pool_owners, arena_owners=(), **pack_over):
    ident = ws.PackIdentity.of_pack(pack)
    d = {
        "version": ws.POOLMON_VERSION,
        "pack": {**{f: getattr(ident, f) for f in ident.__struct_fields__}, **pack_over},
        "tiers": {
            "pool": {"capacity": N_SLOTS, "owners": [list(o) for o in pool_owners]},
            "arena": {"capacity": ARENA_ROWS, "owners": [list(o) for o in arena_owners]},
        },
        "wall_time": 1.0,
        "steps": 3,
    }
    path.write_text(json.dumps(d))
    return str(path)


def hot_owners(n, seed=0):
    rng = np.random.default_rng(seed)
    dense = rng.permutation(L * E)[:n]
    return [(int(k // E), int(k % E), float(n - i)) for i, k in enumerate(dense)]


def assert_pool_rows_match_pack(store, pack):
    if store.pool.is_cuda:  # copies and table writes are ordered on the store's stream
        import torch

        torch.cuda.synchronize()
    keys = store.resident_keys("pool")
    table = store.slot_table.cpu().numpy()
    pool = store.pool.cpu().numpy()
    for l, e in keys.tolist():
        slot = table[l, e]
        assert slot >= 0, (l, e)
        np.testing.assert_array_equal(pool[slot, :SLOT], pack.read_row(l, e))
    return keys


def record_some(store, seed=1, steps=6):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        for layer in range(L):
            # a skewed routing so the heat order is well defined
            topk = rng.choice(E, size=(4, 2), p=np.arange(E, 0, -1) / (E * (E + 1) / 2))
            store.record(layer, topk)
        store.step()
    store.wait_idle()  # step() queues lazy promotions on the store's worker; let them land
    drain(store)


def drain(store):
    """Wait until the worker has run every job queued so far (one FIFO worker)."""
    assert store.promote(np.zeros((0, 2), np.int64)).wait(timeout=30)


def test_preheat_fills_pool_hottest_first_up_to_fill(pack, tmp_path, device):
    owners = hot_owners(40)
    src = poolmon_file(tmp_path / "pm.json", pack, owners)
    with open_store(pack, device) as store:
        summary = ws.preheat(store, src, pool_fill=0.5, progress=False)
        want = int(0.5 * store.n_slots)
        assert not summary.cold and summary.pool_rows == want
        assert summary.pool_bytes == want * SLOT and summary.skipped["pool: beyond pool_fill"] == 40 - want
        keys = assert_pool_rows_match_pack(store, pack)
        assert sorted(map(tuple, keys.tolist())) == sorted((l, e) for l, e, _ in owners[:want])


def test_preheat_arena_then_pool_and_seeds_heat(pack, tmp_path, device):
    pool_owners = hot_owners(10, seed=2)
    arena_owners = hot_owners(30, seed=3)
    src = poolmon_file(tmp_path / "pm.json", pack, pool_owners, arena_owners)
    with open_store(pack, device) as store:
        summary = ws.preheat(store, src, pool_fill=1.0, progress=False)
        # the arena holds the pool's rows, then the recorded arena rows, up to its size
        plan = [(l, e) for l, e, _ in pool_owners]
        plan += [(l, e) for l, e, _ in arena_owners if (l, e) not in plan]
        assert summary.pool_rows == 10 and summary.arena_rows == ARENA_ROWS
        assert summary.skipped["arena: beyond arena capacity"] == len(plan) - ARENA_ROWS
        arena = {tuple(k) for k in store.resident_keys("arena").tolist()}
        assert arena == set(plan[:ARENA_ROWS])
        assert_pool_rows_match_pack(store, pack)
        scores = store.pool_policy.scores()
        dense = [l * E + e for l, e, _ in pool_owners]
        # fresh store, no routing yet: the pool policy's heat is exactly the scaled seed
        top = pool_owners[0][2]
        np.testing.assert_allclose(scores[dense], [h / top for _, _, h in pool_owners])


def test_preheat_progress_callback_sees_every_row(pack, tmp_path):
    src = poolmon_file(tmp_path / "pm.json", pack, hot_owners(12))
    seen = []
    with open_store(pack, ram_gb=0.0) as store:
        ws.preheat(store, src, pool_fill=1.0, progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (12, 12) and all(t == 12 for _, t in seen)


@pytest.mark.parametrize(
    "over, reason",
    [
        ({"ckpt_id": "other-ckpt"}, "ckpt_id 'other-ckpt'"),
        ({"n_experts": 32}, "n_experts 32, pack has 16"),
        ({"slot_bytes": 999}, "slot_bytes 999"),
    ],
)
def test_mismatched_file_warns_and_starts_cold(pack, tmp_path, over, reason):
    src = poolmon_file(tmp_path / "pm.json", pack, hot_owners(8), **over)
    with open_store(pack) as store:
        with pytest.warns(ws.WarmStartWarning) as rec:
            summary = ws.preheat(store, src, progress=False)
        assert summary.cold and len(store.resident_keys("pool")) == 0
    msgs = [str(w.message) for w in rec]
    assert len(msgs) == 1 and msgs[0].startswith(src) and reason in msgs[0]


def test_store_warm_start_argument_preheats(pack, tmp_path):
    owners = hot_owners(8, seed=4)
    src = poolmon_file(tmp_path / "pm.json", pack, owners)
    with open_store(pack, warm_start=src) as store:
        keys = assert_pool_rows_match_pack(store, pack)
        assert {tuple(k) for k in keys.tolist()} == {(l, e) for l, e, _ in owners[:8]}


def test_store_warm_start_truncated_file_is_cold_not_a_crash(pack, tmp_path):
    src = tmp_path / "pm.json"
    poolmon_file(src, pack, hot_owners(8))
    src.write_bytes(src.read_bytes()[:50])
    with pytest.warns(ws.WarmStartWarning, match="truncated"):
        with open_store(pack, warm_start=str(src)) as store:
            assert len(store.resident_keys("pool")) == 0


def test_save_poolmon_roundtrip_warms_a_second_store_identically(pack, tmp_path, device):
    out = tmp_path / "snap.json"
    with open_store(pack, device) as a:
        record_some(a)
        ws.save_poolmon(a, out)
        want = a.resident_keys("pool")
        scores = a.pool_policy.scores()
    snap = ws.read_warm_file(out)
    assert snap.identity == ws.PackIdentity.of_pack(pack) and snap.steps == 6
    assert snap.pool.keys.tolist() == want.tolist()
    np.testing.assert_allclose(snap.pool.heat, scores[want[:, 0] * E + want[:, 1]])
    assert snap.counters.pool.hits + snap.counters.pool.misses > 0
    with open_store(pack, device) as b:
        ws.preheat(b, out, pool_fill=1.0, progress=False)
        got = assert_pool_rows_match_pack(b, pack)
        assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, want.tolist()))


def test_pool_heat_written_for_vllm_moet_reads_back(pack, tmp_path):
    out = tmp_path / ws.pool_heat_name(pack.tag)
    with open_store(pack) as store:
        record_some(store)
        ws.save_pool_heat(store, out)
        ws.save_arena_heat(store, ws.arena_heat_path(tmp_path / "x.pack"))
        want = store.resident_keys("pool").tolist()
    raw = out.read_text()
    assert raw.count("\n") == 0
    meta = json.loads(raw)["meta"]
    assert meta == {"version": "pool-heat-v1", "tag": pack.tag, "n_layers": L, "E": E, "slot_bytes": SLOT}
    assert json.loads(raw)["owners"] == want
    assert ws.read_warm_file(tmp_path / "x.pack.heat.json").kind == "arena-heat"


def test_periodic_snapshot_every_steps_and_final(pack, tmp_path):
    out = tmp_path / "periodic.json"
    with open_store(pack) as store:
        snap = ws.PeriodicSnapshot(store, out, every_s=None, every_steps=2, poll_s=0.005).start()
        record_some(store, steps=1)
        for _ in range(50):
            if out.exists():
                break
            store.step()
            time.sleep(0.01)
        snap.stop(final=True)
        assert out.exists() and snap.writes >= 2 and snap.failures == 0
        assert ws.read_warm_file(out).steps == store.step_count


def test_periodic_snapshot_write_failure_is_logged_not_raised(pack, tmp_path, caplog):
    with open_store(pack) as store:
        snap = ws.PeriodicSnapshot(store, tmp_path / "missing-dir" / "p.json", every_s=100)
        with caplog.at_level(logging.WARNING, logger="tierstore.warmstart"):
            assert snap.snapshot_now() is False and snap.snapshot_now() is False
        assert snap.failures == 2
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 1 and "missing-dir/p.json" in logged[0] and "write" in logged[0]


def test_async_save_and_loop(pack, tmp_path):
    out = tmp_path / "async.json"
    with open_store(pack) as store:
        record_some(store)

        async def go():
            await ws.save_poolmon_async(store, out)
            first = ws.read_warm_file(out)
            os.unlink(out)
            task = asyncio.create_task(ws.async_snapshot_loop(store, out, every_s=0.01))
            for _ in range(200):
                await asyncio.sleep(0.01)
                if out.exists():
                    break
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return first

        first = asyncio.run(go())
        assert first.pool.keys.tolist() == store.resident_keys("pool").tolist()
        assert out.exists() and ws.read_warm_file(out).kind == "poolmon"
        assert [p for p in os.listdir(tmp_path) if ".tmp." in p] == []


def test_preheat_read_error_stops_with_warning_and_no_wrong_rows(pack, tmp_path):
    src = poolmon_file(tmp_path / "pm.json", pack, hot_owners(16, seed=9))
    with open_store(pack, ram_gb=0.0) as store:
        # fault: cut the pack after layer 1, so rows of layers 2-3 fail with a short read
        os.truncate(pack.path, 2 * E * pack.stride)
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            summary = ws.preheat(store, src, pool_fill=1.0, progress=False)
        msgs = [str(w.message) for w in rec if issubclass(w.category, ws.WarmStartWarning)]
        assert any(l >= 2 for l, _, _ in hot_owners(16, seed=9))  # the fault is reached
        assert len(msgs) == 1 and msgs[0].startswith(src + ": preheat stopped early")
        assert pack.path in msgs[0] and summary.reason.startswith("stopped early")
        keys = store.resident_keys("pool")
        assert all(l < 2 for l, _ in keys.tolist())
        os.truncate(pack.path, L * E * pack.stride)  # restore the size for the checks below
        for l, e in keys.tolist():
            slot = store.slot_table.cpu().numpy()[l, e]
            np.testing.assert_array_equal(store.pool.cpu().numpy()[slot, :SLOT], pack.read_row(l, e))


def test_preheat_accepts_an_in_memory_merge_and_rejects_bad_fill(pack, tmp_path):
    from tierstore.errors import ConfigError

    a = poolmon_file(tmp_path / "a.json", pack, hot_owners(6, seed=1))
    b = poolmon_file(tmp_path / "b.json", pack, hot_owners(6, seed=2))
    merged = ws.merge([ws.read_warm_file(a), ws.read_warm_file(b)])
    with open_store(pack, ram_gb=0.0) as store:
        with pytest.raises(ConfigError, match=r"pool_fill must be a fraction in \[0, 1\], found 1.5"):
            ws.preheat(store, merged, pool_fill=1.5)
        summary = ws.preheat(store, merged, pool_fill=1.0, progress=False)
        assert summary.source == "<merged>" and summary.pool_rows == len(merged.pool)
        assert_pool_rows_match_pack(store, pack)
