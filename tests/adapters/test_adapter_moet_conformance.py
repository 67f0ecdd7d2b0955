"""Conformance: tierstore's FP4 tier driven exactly as vLLM-Moet's glue, gate, V1/V2 runners
and worker drive theirs (tierstore.testing.moet_engine), on the CPU pool; pool bytes are
checked against the pack after every step boundary."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from moet_surface_helpers import SLOT, E, L, env, moet_env, pack_reference, planes

from tierstore.testing.moet_engine import MoetEngine


def _serve(m, runner, steps=8, store=True, **kw):
    eng = MoetEngine(m, planes(), n_experts=E, dev="cpu", top_k=2, tokens=2, runner=runner, **kw).boot()
    ref = pack_reference(m._TIER) if store else None
    checks = []

    def on_step(phase):
        checks.append((phase, eng.check(ref)))

    for _ in range(steps):
        rec = eng.step(fire=True, on_step=on_step)
        assert rec["out"] == eng.expected_out()
    return eng, checks


@pytest.mark.parametrize("runner", ["v1", "v2"])
@pytest.mark.parametrize("store", [True, False], ids=["pack", "host"])
def test_boot_serve_shutdown_keeps_pool_bytes_equal_to_the_pack(monkeypatch, tmp_path, runner, store):
    with moet_env(monkeypatch, env(tmp_path if store else None, slots=14)) as m:
        eng, checks = _serve(m, runner, store=store)
        tier = m._TIER
        assert isinstance(tier.n_slots, int) and tier.n_slots == 14
        assert sum(r["promoted"] for r in eng.history) > 0
        assert max(n for _p, n in checks) > 0
        assert len(tier._store) == L and all(k in tier._store for k in range(L))
        if store:
            assert any(f.endswith(".pack") for f in os.listdir(tmp_path))
    assert m._TIER is None


def test_second_boot_finds_the_pack_and_skips_the_layers(monkeypatch, tmp_path):
    with moet_env(monkeypatch, env(tmp_path)) as m:
        MoetEngine(m, planes(), n_experts=E, dev="cpu").boot()
        path = m._TIER._store.path
        first = open(path, "rb").read()
    mtime = os.stat(path).st_mtime_ns
    with moet_env(monkeypatch, env(tmp_path)) as m:
        tier = m.get_tier(n_experts=E, dev=torch.device("cpu"), w13_bytes=8192, w2_bytes=4096)
        assert len(tier._store) == L and 0 in tier._store  # before any add_layer
        other = planes(seed=9)  # different bytes: skipped
        for k, (a, b) in other.items():
            tier.add_layer_host_planes(k, a, b)
        eng = MoetEngine(m, planes(), n_experts=E, dev="cpu")
        eng.tier = tier
        for _ in range(3):
            eng.step()
            eng.check(pack_reference(tier))
    assert os.stat(path).st_mtime_ns == mtime and open(path, "rb").read() == first


def test_an_interrupted_first_boot_resumes(monkeypatch, tmp_path):
    p = planes()
    with moet_env(monkeypatch, env(tmp_path)) as m:
        tier = m.get_tier(n_experts=E, dev=torch.device("cpu"), w13_bytes=8192, w2_bytes=4096)
        tier.add_layer_host_planes(0, *p[0])  # then the process "dies"
        tier._store.finish()
    with moet_env(monkeypatch, env(tmp_path)) as m:
        eng = MoetEngine(m, p, n_experts=E, dev="cpu").boot()
        assert len(m._TIER._store) == L
        eng.step()
        eng.check(pack_reference(m._TIER))


def _half_pack(monkeypatch, tmp_path, layers):
    """A pack of ``layers`` written by the face, then the process "dies"; its sidecar."""
    import json

    p = planes()
    with moet_env(monkeypatch, env(tmp_path)) as m:
        tier = m.get_tier(n_experts=E, dev=torch.device("cpu"), w13_bytes=8192, w2_bytes=4096)
        for k in layers:
            tier.add_layer_host_planes(k, *p[k])
        tier._store.finish()
        path = tier._store.path
    sidecar = path[: -len(".pack")] + ".json"
    return p, path, sidecar, json.loads(open(sidecar).read())


@pytest.mark.parametrize("how", ["no checksum field", "a layer without sums"])
def test_a_pack_another_engine_wrote_part_of_is_resumed_and_its_rows_summed(monkeypatch, tmp_path, how):
    """vLLM-Moet keeps no row sums: its unfinished pack (no `checksum` at all), or ours it
    extended (a listed layer without sums), is resumed: its layers kept as they are on
    disk and hashed once, the rest written; never renamed or rebuilt."""
    import json

    p, path, sidecar, side = _half_pack(monkeypatch, tmp_path, [0, 1])
    if how == "no checksum field":
        side.pop("checksum"), side.pop("checksums")
    else:
        side["checksums"].pop("1")
    with open(sidecar, "w") as f:
        f.write(json.dumps(side))
    inode = os.stat(path).st_ino
    with moet_env(monkeypatch, env(tmp_path)) as m:
        eng = MoetEngine(m, p, n_experts=E, dev="cpu").boot()
        tier = m._TIER
        assert len(tier._store) == L and os.stat(path).st_ino == inode
        after = json.loads(open(sidecar).read())
        assert sorted(map(int, after["checksums"])) == list(range(L))  # every layer summed
        for _ in range(4):
            eng.step()
            eng.check(pack_reference(tier))
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".damaged")]


def test_a_pack_that_cannot_be_resumed_is_named_never_renamed(monkeypatch, tmp_path):
    from tierstore.errors import ConfigError

    _p, path, sidecar, _side = _half_pack(monkeypatch, tmp_path, [0])
    with open(sidecar, "w") as f:
        f.write("{not json")
    before = sorted(os.listdir(tmp_path))
    with moet_env(monkeypatch, env(tmp_path)) as m:
        with pytest.raises(ConfigError) as info:
            m.get_tier(n_experts=E, dev=torch.device("cpu"), w13_bytes=8192, w2_bytes=4096)
    msg = str(info.value)
    assert "\n" not in msg and path in msg and sidecar in msg and "delete" in msg
    assert sorted(os.listdir(tmp_path)) == before  # nothing renamed or removed


def test_auto_pool_is_sized_after_the_kv_cache(monkeypatch, tmp_path):
    e = env(tmp_path, slots=None, DELTA_RESERVE_GB=0, DELTA_MAX_GB=repr(20 * SLOT / 2**30))
    with moet_env(monkeypatch, e) as m:
        tier = m.get_tier(n_experts=E, dev=torch.device("cpu"), w13_bytes=8192, w2_bytes=4096)
        assert tier.n_slots == 0 and tier.pool.shape == (0, SLOT)
        assert tier.slot_table.shape == (L, E) and bool((tier.slot_table == -1).all())
        eng = MoetEngine(m, planes(), n_experts=E, dev="cpu").boot()  # V1 floor check deferred
        assert tier.n_slots == 20 and tier.pool.shape == (20, SLOT)
        for _ in range(4):
            eng.step()
            eng.check(pack_reference(tier))


def test_auto_pool_without_room_is_an_inert_zero_slot_tier(monkeypatch, tmp_path):
    with moet_env(monkeypatch, env(tmp_path, slots=None, DELTA_RESERVE_GB=1e9, GATE=0)) as m:
        eng = MoetEngine(m, planes(), n_experts=E, dev="cpu").boot()
        tier = m._TIER
        assert tier.n_slots == 0 and len(tier._store) == 0 and tier.pool.shape[0] == 0
        for _ in range(3):
            assert eng.step()["promoted"] == 0
        assert bool((tier.slot_table == -1).all())


@pytest.mark.parametrize("reserve_slots", [1e9, 5])  # 0 slots; 5 slots under a floor of 10
def test_auto_pool_under_the_floor_with_the_gate_armed_is_refused(monkeypatch, tmp_path, reserve_slots):
    """vLLM-Moet refuses an auto pool with the gate armed under the floor; the worker only
    logs what finalize_auto raises, so the tier refuses the first step (and every one)."""
    free = 8 << 30
    reserve = 1e9 if reserve_slots == 1e9 else (free - reserve_slots * SLOT) / 2**30
    with moet_env(monkeypatch, env(tmp_path, slots=None, DELTA_RESERVE_GB=reserve)) as m:
        eng = MoetEngine(m, planes(), n_experts=E, dev="cpu", free_bytes=free)
        with pytest.warns(RuntimeWarning, match="fire floor"):
            eng.boot()
        with pytest.raises(RuntimeError, match="fire floor of 10"):
            eng.step()
        with pytest.raises(RuntimeError, match="refused"):
            m._TIER.force_promote()
    with moet_env(
        monkeypatch, env(tmp_path, slots=None, DELTA_RESERVE_GB=reserve, FORCE_POOL=1)
    ) as m:  # FORCE_POOL: serves on, warned
        eng = MoetEngine(m, planes(), n_experts=E, dev="cpu", free_bytes=free).boot()
        eng.step()


def test_gate_budget_is_per_step_across_rounds(monkeypatch):
    with moet_env(monkeypatch, env(slots=48, GATE_MAX_PROMOTE=3, GATE_FP_MAX=3, DELTA_POLICY="need")) as m:
        eng = MoetEngine(m, planes(), n_experts=E, dev="cpu", tokens=4).boot()
        for _ in range(5):
            rec = eng.step()
            assert rec["promoted"] <= 3 and rec["rounds"] <= 1
            eng.check()
        assert sum(r["promoted"] for r in eng.history) == 15


def test_unlimited_budget_and_fp_max_rounds(monkeypatch):
    with moet_env(monkeypatch, env(slots=48, GATE_MAX_PROMOTE=0, GATE_FP_MAX=2, DELTA_POLICY="need")) as m:
        eng = MoetEngine(m, planes(), n_experts=E, dev="cpu", tokens=4).boot()
        rec = eng.step()
        assert rec["promoted"] == len(np.unique(eng.ids.numpy(), axis=None)) or rec["promoted"] > 3
        assert rec["rounds"] <= 2
        eng.check()


def test_v1_refuses_a_pool_under_the_fire_floor(monkeypatch):
    with moet_env(monkeypatch, env(slots=8)) as m:  # floor: 3 layers x 2 x 1.7 = 10
        with pytest.raises(ValueError, match="fire floor"):
            MoetEngine(m, planes(), n_experts=E, dev="cpu").boot()
    with moet_env(monkeypatch, env(slots=8, FORCE_POOL=1)) as m:  # warned, serves on
        eng = MoetEngine(m, planes(), n_experts=E, dev="cpu").boot()
        assert m._TIER.n_slots == 8 and eng.step()["out"] == eng.expected_out()
    with moet_env(monkeypatch, env(slots=8)) as m:  # the V2 runner never checks
        MoetEngine(m, planes(), n_experts=E, dev="cpu", runner="v2").boot()


def test_deferred_floor_of_an_auto_pool_is_checked_when_sized(monkeypatch, tmp_path):
    e = env(tmp_path, slots=None, DELTA_RESERVE_GB=0, DELTA_MAX_GB=repr(8 * SLOT / 2**30))
    with moet_env(monkeypatch, e) as m:
        with pytest.warns(RuntimeWarning, match="finalize_auto failed: .*fire floor"):
            eng = MoetEngine(m, planes(), n_experts=E, dev="cpu").boot()
        assert m._TIER.n_slots == 8
        with pytest.raises(RuntimeError, match="fire floor"):  # refused, not served sub-floor
            eng.step()


def test_the_pack_is_what_vllm_moets_pack_store_accepts(monkeypatch, tmp_path):
    """vLLM-Moet's rules, restated: name <tag>.v2.<key20>.rank<r>of<w>.pack with key20 =
    sha256 of the sorted, compact JSON identity; sidecar identity fields equal; layers
    unique and in range; file exactly n_layers * E * stride bytes; rows at (l*E+e)*stride."""
    import hashlib
    import json

    with moet_env(monkeypatch, env(tmp_path)) as m:
        MoetEngine(m, planes(), n_experts=E, dev="cpu").boot()
    ident = {
        "ckpt_id": "tierstore-test-ckpt",
        "zero_mode": "auto",
        "quantizer_abi": "tsym4-e8m0-fragmajor-a32-v2",
        "tag": "delta",
        "n_layers": L,
        "E": E,
        "slot_bytes": SLOT,
        "stride": SLOT,
    }
    key = hashlib.sha256(json.dumps(ident, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:20]
    base = f"{tmp_path}/delta.v2.{key}.rank0of1"
    meta = json.loads(open(base + ".json").read())
    assert all(meta[k] == v for k, v in ident.items()) and meta["version"] == 2
    assert sorted(set(meta["layers"])) == meta["layers"] == list(range(L))
    raw = open(base + ".pack", "rb").read()
    assert len(raw) == L * E * SLOT
    p = planes()
    for layer in range(L):
        for e in (0, E - 1):
            off = (layer * E + e) * SLOT
            assert raw[off : off + SLOT] == torch.cat(p[layer], 1)[e].numpy().tobytes()
