"""The moe_w2_delta module surface and the tier object, call by call (CPU pool)."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from moet_surface_helpers import SLOT, W2, W13, E, L, env, moet_env, planes

from tierstore import settings
from tierstore.adapters import vllm_moet as vm
from tierstore.errors import TierIOError

CPU = torch.device("cpu")


def _tier(m):
    return m.get_tier(n_experts=E, dev=CPU, w13_bytes=W13, w2_bytes=W2)


def _loaded(m, p=None):
    tier = _tier(m)
    for k, (a, b) in (p or planes()).items():
        tier.add_layer_host_planes(k, a, b)
    return tier


def test_get_tier_first_call_wins_and_the_store_opens_once_loaded(monkeypatch):
    with moet_env(monkeypatch, env()) as m:
        assert m.enabled() and m._TIER is None
        t = _tier(m)
        assert m._TIER is t and t.expert_store is None and t._thread is None  # nothing loaded
        assert m.get_tier(n_layers=99, n_experts=8, dev=CPU, w13_bytes=1, w2_bytes=1) is t
        assert (t.n_layers, t.E, t.w13_bytes, t.w2_bytes, t.slot_bytes) == (L, E, W13, W2, SLOT)
        assert t.dev == CPU and t._tag == "delta"
        table = t.slot_table
        for k, (a, b) in planes().items():
            t.add_layer_host_planes(k, a, b)
        t.wait_manager_idle()  # the first serving call
        es = t.expert_store
        assert es is not None and es.slot_table is table and t._thread.is_alive()
        assert es.pool is t.pool and t.pool.shape == (t.n_slots, SLOT)


def test_get_tier_is_none_when_off(monkeypatch):
    with moet_env(monkeypatch, env(DELTA_GB=0)) as m:
        assert not m.enabled() and _tier(m) is None and m._TIER is None
    with moet_env(monkeypatch, env(DELTA="0")) as m:
        assert _tier(m) is None


def test_tensors_exist_from_construction(monkeypatch):
    with moet_env(monkeypatch, env(slots=None)) as m:
        t = _tier(m)
        assert type(t.n_slots) is int and t.n_slots == 0 and not t.n_slots > 0
        assert t.slot_table.dtype == torch.int32 and t.slot_table.shape == (L, E)
        assert bool((t.slot_table == -1).all())
        assert t.pool.dtype == torch.uint8 and tuple(t.pool.shape) == (0, SLOT)
        assert t.seen.dtype == torch.uint8 and t.seen.shape == (L, E)
        assert t.seen_w.dtype == torch.float32 and t.mutate_hooks == [] and t.E == E
        assert len(t._store) == 0 and 0 not in t._store


def test_seen_counts_when_tracing(monkeypatch):
    with moet_env(monkeypatch, env(DELTA_TRACE=1)) as m:
        t = _tier(m)
        assert t.seen.dtype == torch.int32
        m.mark_seen(t.seen[1], torch.tensor([3, 3, 5]))
        assert t.seen[1, 3] == 2 and t.seen[1, 5] == 1


def test_mark_seen_flags(monkeypatch):
    with moet_env(monkeypatch, env()) as m:
        t = _tier(m)
        m.mark_seen(t.seen[2], torch.tensor([1, 1, 7]))
        assert t.seen[2].nonzero().flatten().tolist() == [1, 7] and t.seen[2, 1] == 1


def test_force_promote_maps_pins_and_returns_an_int(monkeypatch):
    with moet_env(monkeypatch, env(slots=8, FORCE_POOL=1)) as m:
        p = planes()
        t = _loaded(m, p)
        assert t.force_promote() == 0  # nothing seen
        m.mark_seen(t.seen[0], torch.tensor([1, 2, 3]))
        m.mark_seen(t.seen[2], torch.tensor([4]))
        n = t.force_promote(layers=[0], max_promote=2, pin=True)
        assert type(n) is int and n == 2
        assert int((t.slot_table[0] >= 0).sum()) == 2 and int((t.slot_table[2] >= 0).sum()) == 0
        assert not bool(t.seen.any())  # seen is consumed
        m.mark_seen(t.seen[0], torch.tensor([1, 2, 3]))
        assert t.force_promote(max_promote=None) == 1  # None = no cap
        for e in (1, 2, 3):
            s = int(t.slot_table[0, e])
            assert torch.equal(t.pool[s], torch.cat(p[0], 1)[e])
        # pinned until step_end: 8 slots, 3 pinned, so 6 more routed experts get only 5
        m.mark_seen(t.seen[1], torch.arange(6))
        assert t.force_promote() == 5
        assert all(int(t.slot_table[0, e]) >= 0 for e in (1, 2, 3))
        t.step_end()  # pins released: now they may go
        m.mark_seen(t.seen[2], torch.arange(8))
        assert t.force_promote() == 8 and int((t.slot_table[0] >= 0).sum()) == 0


def test_failed_read_returns_every_slot_and_publishes_nothing(monkeypatch, tmp_path):
    p = planes()
    with moet_env(monkeypatch, env(tmp_path, slots=8, FORCE_POOL=1)) as m:
        _loaded(m, p)
        path = m._TIER._store.path
    with open(path, "r+b") as f:  # bit rot in layer 1, expert 5
        f.seek((1 * E + 5) * SLOT + 100)
        f.write(b"\xff" * 8)
    with moet_env(monkeypatch, env(tmp_path, slots=8, FORCE_POOL=1, TIERSTORE_VERIFY=1)) as m:
        t = _tier(m)
        m.mark_seen(t.seen[0], torch.arange(8))
        assert t.force_promote() == 8
        t.step_end()
        m.mark_seen(t.seen[1], torch.arange(8))  # needs all 8 slots (evictions)
        with pytest.raises(TierIOError, match="layer 1 expert 5"):
            t.force_promote()
        assert int((t.slot_table[1] >= 0).sum()) == 0  # nothing of the batch published
        t.expert_store.check_invariants()  # every slot it took is back
        table = t.slot_table.reshape(-1)
        for key in torch.nonzero(table >= 0).flatten().tolist():  # what stays is right
            assert torch.equal(t.pool[int(table[key])], torch.cat(p[key // E], 1)[key % E])
        t.step_end()
        m.mark_seen(t.seen[1], torch.tensor([0, 1, 2, 3, 4, 6, 7]))
        assert t.force_promote() == 7  # nothing was lost


def test_background_promotions_publish_only_at_step_end_and_spare_the_step(monkeypatch):
    """vLLM-Moet's manager never changes the table between a fired step's forward and
    its replay; the store's worker only reads, and step_end publishes, never evicting an
    expert that step routed."""
    with moet_env(monkeypatch, env(slots=8, FORCE_POOL=1, DELTA_PROMOTE=4)) as m:
        t = _loaded(m)
        m.mark_seen(t.seen[1], torch.arange(8))
        t.step_end()  # queues 4 background reads
        t.expert_store.wait_idle()
        assert int((t.slot_table >= 0).sum()) == 0  # read, not published
        m.mark_seen(t.seen[2], torch.arange(8))  # the next step's forward...
        assert t.force_promote() == 8  # ...fires: the pool is full
        before = t.slot_table.clone()
        m.mark_seen(t.seen[2], torch.arange(8))  # the replay routes layer 2 again
        t.step_end()  # publish: no victim in layer 2
        assert torch.equal(t.slot_table[2] >= 0, before[2] >= 0)
        t.expert_store.check_invariants()


def test_the_next_steps_boundary_publishes_what_the_worker_read(monkeypatch):
    """vLLM-Moet publishes its manager's batch at wait_manager_idle, before the next
    forward: so does the face, from the store's staged reads."""
    with moet_env(monkeypatch, env(slots=20, FORCE_POOL=1, DELTA_PROMOTE=4)) as m:
        t = _loaded(m)
        m.mark_seen(t.seen[1], torch.arange(6))
        t.step_end()  # queues 4 background reads
        t.expert_store.wait_idle()
        assert int((t.slot_table >= 0).sum()) == 0
        t.wait_manager_idle()  # the next step's boundary
        assert int((t.slot_table[1] >= 0).sum()) == 4
        t.expert_store.check_invariants()


def test_notify_capture_makes_no_cuda_call(monkeypatch):
    with moet_env(monkeypatch, env()) as m:
        t = _tier(m)

        def boom(*a, **k):
            raise AssertionError("CUDA call in notify_capture")

        for name in ("synchronize", "current_stream", "is_current_stream_capturing", "Event"):
            monkeypatch.setattr(torch.cuda, name, boom)
        assert t.notify_capture() is None


def test_manager_promotes_lazily_and_never_under_need(monkeypatch):
    with moet_env(monkeypatch, env(slots=20, DELTA_PROMOTE=3)) as m:
        t = _loaded(m)
        m.mark_seen(t.seen[1], torch.tensor([0, 1, 2, 3, 4]))
        t.step_end()
        t.expert_store.wait_idle()
        t.step_end()  # publishes what was read
        assert int((t.slot_table[1] >= 0).sum()) == 3 and float(t._freq[1, 0]) > 0
    with moet_env(monkeypatch, env(slots=20, DELTA_POLICY="need")) as m:
        t = _loaded(m)
        m.mark_seen(t.seen[1], torch.tensor([0, 1, 2]))
        for _ in range(2):
            t.step_end()
            t.expert_store.wait_idle()
        assert int((t.slot_table >= 0).sum()) == 0 and float(t._need[1, 0]) == 0
        m.mark_seen(t.seen[1], torch.tensor([0]))
        t.force_promote(max_promote=0)  # need counts fires, not routing
        assert float(t._need[1, 0]) == pytest.approx(1.0, rel=1e-3)


def test_ensure_resident_and_mark_need_only(monkeypatch):
    with moet_env(monkeypatch, env(slots=20, DELTA_POLICY="need")) as m:
        t = _loaded(m)
        assert t.ensure_resident(1, torch.tensor([[5, 6], [6, 7]])) == 3
        assert sorted(t.slot_table[1].ge(0).nonzero().flatten().tolist()) == [5, 6, 7]
        m.mark_seen(t.seen[0], torch.tensor([2]))
        assert t.mark_need_only(layers=[0]) == 1
        assert float(t._need[0, 2]) == pytest.approx(1.0, rel=1e-3)
        assert int((t.slot_table[0] >= 0).sum()) == 0  # counted, not promoted


def test_step_begin_stats_precision(monkeypatch):
    with moet_env(monkeypatch, env(slots=20)) as m:
        t = _loaded(m)
        m.mark_seen(t.seen[0], torch.tensor([1]))
        t.force_promote()
        t.step_begin()
        assert t.stats()["cached"] == 1 and t.precision_of(0, 1) == "fp4"
        assert t.precision_of(0, 2) == "base" and t.precision_map()[0][1] == 1


def test_shutdown_clears_the_singleton_and_raises_when_close_fails(monkeypatch):
    with moet_env(monkeypatch, env()) as m:
        t = _loaded(m)
        t.wait_manager_idle()

        def stuck():
            raise RuntimeError("worker did not stop")

        monkeypatch.setattr(t, "close", stuck)
        with pytest.raises(RuntimeError, match="shutdown failed: worker did not stop"):
            m.shutdown()
        assert m._TIER is t  # not cleared: close failed
        monkeypatch.undo()
        m.shutdown()
        assert m._TIER is None and t.expert_store is None


def test_check_pool_floor_refuses_a_gate_without_a_tier_and_small_prefill_t(monkeypatch):
    with moet_env(monkeypatch, env(DELTA_GB=0)) as m:
        with pytest.raises(ValueError, match="no FP4 tier"):
            m.check_pool_floor(6, 0, 1)
    with moet_env(monkeypatch, env(PREFILL_T=4, FORCE_POOL=1)) as m:
        _loaded(m)
        with pytest.raises(ValueError, match="PREFILL_T=4"):
            m.check_pool_floor(1, 1, 4)


def test_force_promote_step_follows_the_gate(monkeypatch):
    with moet_env(monkeypatch, env(slots=20)) as m:
        assert m.force_promote_step() == 0  # no tier yet
        t = _loaded(m)
        m.mark_seen(t.seen[0], torch.tensor([1, 2]))
        assert m.force_promote_step(max_promote=0) == 0
        assert m.force_promote_step() == 2
    with moet_env(monkeypatch, env(slots=20, GATE_CAPTURE=1, DELTA_POLICY="need")) as m:
        t = _loaded(m)
        m.mark_seen(t.seen[0], torch.tensor([1, 2]))
        assert m.force_promote_step() == 0
        assert float(t._need[0, 1]) == pytest.approx(1.0, rel=1e-3)


# -- the plugin ------------------------------------------------------------------------------
def _fake_moet(monkeypatch):
    mod = types.ModuleType(vm.MOET_MODULE)
    mod._TIER, mod._BASE_TIER = None, None
    mod.calls = []
    mod.get_tier = lambda *a, **k: mod.calls.append("their get_tier")
    mod.shutdown = lambda: mod.calls.append(("their shutdown", mod._TIER))
    mod.check_pool_floor = lambda *a: mod.calls.append("their floor")
    monkeypatch.setitem(sys.modules, vm.MOET_MODULE, mod)
    return mod


def test_plugin_without_the_variable_does_nothing(monkeypatch):
    mod = _fake_moet(monkeypatch)
    monkeypatch.delenv("VLLM_MOE_W2_TIERSTORE", raising=False)
    vm.register()
    assert vm._TARGET is None and mod.get_tier is not vm.get_tier


@pytest.mark.parametrize(
    "bad",
    [
        {"ZERO_MODE": "abc"},
        {"DELTA_RESERVE_GB": "nan"},
        {"DELTA_MAX_GB": "inf"},
        {"STORE_THREADS": "abc"},
        {"ZERO_MODE": "abc", "DELTA_RESERVE_GB": "nan"},
    ],
)
def test_plugin_off_reads_no_other_variable_and_on_names_the_bad_one(monkeypatch, bad):
    """vLLM-Moet ignores these values with its tier off; the plugin off must too (every
    vLLM process loads it). With it on, one line names each bad variable."""
    from tierstore.errors import ConfigError

    mod = _fake_moet(monkeypatch)
    for k, v in bad.items():
        monkeypatch.setenv("VLLM_MOE_W2_" + k, v)
    monkeypatch.delenv("VLLM_MOE_W2_TIERSTORE", raising=False)
    vm.register()
    assert vm._TARGET is None and mod.get_tier is not vm.get_tier
    monkeypatch.setenv("VLLM_MOE_W2_TIERSTORE", "1")
    try:
        with pytest.raises(ConfigError) as info:
            vm.register()
        msg = str(info.value)
        assert "\n" not in msg and all("VLLM_MOE_W2_" + k in msg for k in bad)
        assert vm._TARGET is None
    finally:
        vm.reset_env()


def test_plugin_installs_the_tier_into_moe_w2_delta(monkeypatch):
    mod = _fake_moet(monkeypatch)
    e = env(TIERSTORE=1)
    with moet_env(monkeypatch, e):
        vm.register()
        try:
            assert vm._TARGET is mod and mod.get_tier is vm.get_tier
            t = mod.get_tier(n_experts=E, dev=CPU, w13_bytes=W13, w2_bytes=W2)
            assert mod._TIER is t and vm._TIER is t  # callers read moe_w2_delta._TIER
            mod.shutdown()
            assert mod._TIER is None and ("their shutdown", None) in mod.calls
        finally:
            vm.uninstall()
    assert mod.calls[0] == ("their shutdown", None)  # theirs closes the base tier only


def test_plugin_warns_once_that_the_base_cache_stays_vllm_moets(monkeypatch):
    _fake_moet(monkeypatch)
    with moet_env(monkeypatch, env(TIERSTORE=1, BASE_CACHE_GB=8, DELTA_GB=1)):
        vm.register()
        try:
            with pytest.warns(RuntimeWarning, match="base-cache tier stays") as caught:
                t = vm.get_tier(n_experts=E, dev=CPU, w13_bytes=W13, w2_bytes=W2)
                assert vm.get_tier(n_experts=E, dev=CPU) is t
            assert len([w for w in caught if "base-cache" in str(w.message)]) == 1
            assert t._tag == "fp4" and t._policy == "need"
        finally:
            vm.uninstall()


def test_entry_point_is_declared():
    from pathlib import Path

    import tomllib

    with open(Path(__file__).resolve().parents[2] / "pyproject.toml", "rb") as f:
        eps = tomllib.load(f)["project"]["entry-points"]["vllm.general_plugins"]
    assert eps["tierstore_moet"] == "tierstore.adapters.vllm_moet:register"


def test_verify_refuses_a_corrupted_row_and_publishes_nothing(monkeypatch, tmp_path):
    p = planes()
    with moet_env(monkeypatch, env(tmp_path, slots=20)) as m:
        t = _loaded(m, p)
        path = t._store.path
    with open(path, "r+b") as f:  # bit rot in layer 1, expert 2
        f.seek((1 * E + 2) * SLOT + 100)
        f.write(b"\xff" * 8)
    with moet_env(monkeypatch, env(tmp_path, slots=20, TIERSTORE_VERIFY=1)) as m:
        t = _tier(m)
        m.mark_seen(t.seen[1], torch.tensor([1, 2, 3]))
        with pytest.raises(TierIOError, match="layer 1 expert 2"):
            t.force_promote()
        assert bool((t.slot_table == -1).all())
        t.expert_store.check_invariants()
        m.mark_seen(t.seen[1], torch.tensor([1, 3]))
        assert t.force_promote() == 2  # the good rows still serve
        assert torch.equal(t.pool[int(t.slot_table[1, 3])], torch.cat(p[1], 1)[3])
    with moet_env(monkeypatch, env(tmp_path, slots=20)) as m:  # without VERIFY: the store's
        t = _tier(m)  # default (first read checked)
        m.mark_seen(t.seen[1], torch.tensor([2]))
        with pytest.raises(TierIOError, match="layer 1 expert 2"):
            t.force_promote()
    with settings.override(verify="off"), moet_env(monkeypatch, env(tmp_path, slots=20)) as m:
        t = _tier(m)  # verify off: served as is
        m.mark_seen(t.seen[1], torch.tensor([2]))
        assert t.force_promote() == 1
