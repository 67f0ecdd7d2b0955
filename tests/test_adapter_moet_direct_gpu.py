"""The direct promote path on a real GPU: the pack store's engine writes every row of a
force_promote straight into its CUDA pool slot (no host stage), byte-exact from the
arena, the page cache and a cold disk; its copies wait for queued readers of the
slots; a failed read quarantines the victims and nothing wrong is served."""
from __future__ import annotations

import errno
import os

import numpy as np
import pytest
import torch

import tierstore as ts
from moet_surface_helpers import E, SLOT, W13, W2, env, moet_env, pack_reference, planes
from tierstore.errors import ConfigError, TierIOError
from tierstore.testing.packs import make_random_pack


def _cuda() -> bool:
    try:
        return torch.cuda.is_available() and ts.cuda_available()
    except Exception:  # noqa: BLE001 - no extension with CUDA
        return False


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda(), reason="no CUDA device")]
CUDA = torch.device("cuda", 0)


def _loaded(m):
    tier = m.get_tier(n_experts=E, dev=CUDA, w13_bytes=W13, w2_bytes=W2)
    for k, (a, b) in planes().items():
        tier.add_layer_host_planes(k, a.to(CUDA), b.to(CUDA))
    return tier


def _direct_only(tier, monkeypatch):
    def staged(*a, **k):
        raise AssertionError("the direct path went through a host stage")
    assert tier._promote_path == "direct"          # auto's choice on a CUDA pack tier
    monkeypatch.setattr(tier, "_read_staged", staged)
    monkeypatch.setattr(tier._store, "rows_block", staged)


def _served_exactly(tier, ref) -> int:
    """Every mapped slot holds its key's pack row; returns how many are mapped."""
    torch.cuda.synchronize()
    table = tier.slot_table.cpu().numpy().reshape(-1)
    mapped = np.flatnonzero(table >= 0)
    pool = tier.pool.cpu()
    for key in mapped.tolist():
        layer, expert = divmod(key, tier.E)
        assert torch.equal(pool[int(table[key])], ref(layer, expert)), \
            f"slot {int(table[key])} serves a wrong byte for layer {layer} expert {expert}"
    return len(mapped)


def _drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _warm_cache(path):
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass


@pytest.mark.parametrize("ram_rows, scan", [(0, False), (6, False), (6, True), (40, False)])
def test_store_reads_rows_into_scattered_cuda_slots_exactly(tmp_path, ram_rows, scan):
    pack = make_random_pack(tmp_path, 3, 16, 12288, seed=5)
    with ts.ExpertStore(pack, vram_slots=1, ram_gb=ram_rows * pack.stride / 2**30,
                        device="cuda", threads=2) as store:
        rng = np.random.default_rng(ram_rows)
        host = torch.from_numpy(rng.integers(0, 256, (30, 12288), dtype=np.uint8))
        pool = host.to(CUDA)
        first = rng.choice(48, 12, replace=False)
        for i, keys in enumerate([first, rng.permutation(first), rng.choice(48, 12, replace=False)]):
            pairs = np.stack([keys // 16, keys % 16], axis=1)
            slots = rng.permutation(30)[:12]
            hits = store.read_rows(pairs, pool, scan=scan, rows=slots)
            if i == 1:
                assert hits == (0 if scan else min(ram_rows, 12))
            for (li, ei), sl in zip(pairs, slots):
                host[sl] = torch.from_numpy(pack.read_row(int(li), int(ei)).copy())
            assert torch.equal(pool.cpu(), host)      # no sync needed: read_rows waited
            assert not store._arena.key_pins.any()


def test_a_host_store_refuses_a_cuda_out_naming_the_file(tmp_path):
    pack = make_random_pack(tmp_path, 1, 4, 4096, seed=1)
    with ts.ExpertStore(pack, vram_slots=1, device="cpu", threads=1) as store:
        with pytest.raises(ConfigError, match=r"\.pack: read_rows: out is on cuda:0 but the "
                                              r"store's engine writes host memory only"):
            store.read_rows([(0, 1)], torch.zeros(2, 4096, dtype=torch.uint8, device=CUDA),
                            rows=[1])


@pytest.mark.parametrize("source", ["arena", "pagecache", "disk"])
def test_direct_fires_are_byte_exact_in_every_slot(monkeypatch, tmp_path, source):
    extra = {"arena": {"TIERSTORE_RAM_GB": repr(40 * SLOT / 2**30)}, "pagecache": {},
             "disk": {"TIERSTORE_DIRECT": "auto"}}[source]
    with moet_env(monkeypatch, env(tmp_path, slots=E, FORCE_POOL=1, DELTA_POLICY="need",
                                   **extra)) as m:
        tier = _loaded(m)
        ref = pack_reference(tier)
        _direct_only(tier, monkeypatch)
        store = tier._store.expert_store()
        assert store.engine.device == "cuda"
        for layer in (0, 1, 0, 2, 0):                 # E slots: each fire evicts the last
            if source == "disk":
                _drop_cache(tier._store.path)
            elif source == "pagecache":
                _warm_cache(tier._store.path)
            m.mark_seen(tier.seen[layer], torch.arange(E, device=CUDA))
            assert tier.force_promote() == E
            assert bool((tier.slot_table[layer] >= 0).all())
            assert _served_exactly(tier, ref) == E
            tier.step_end()
            tier.wait_manager_idle()
        s = store.engine.stats()
        assert s["h2d_bytes"] >= 5 * E * SLOT            # the engine copied every row H2D
        if source == "arena":                         # layer 0's 2nd fire at least
            assert s["arena"]["rows"] >= E
        elif source == "pagecache":
            assert s["pagecache"]["rows"] > 0 and s["arena"]["rows"] == 0
        elif store.engine.direct_active:              # O_DIRECT allowed here (not tmpfs)
            assert s["disk"]["rows"] > 0


def test_direct_prefill_loads_are_exact_and_do_not_fill_the_arena(monkeypatch, tmp_path):
    with moet_env(monkeypatch, env(tmp_path, slots=20,
                                   TIERSTORE_RAM_GB=repr(40 * SLOT / 2**30))) as m:
        tier = _loaded(m)
        ref = pack_reference(tier)
        _direct_only(tier, monkeypatch)
        assert tier.ensure_resident(1, torch.arange(0, 12, device=CUDA)) == 12
        assert _served_exactly(tier, ref) == 12
        arena = tier._store.expert_store()._arena
        assert not (arena.resident_slot >= 0).any()   # scan=True: a sweep admits nothing


def test_direct_copies_wait_for_queued_readers_of_the_slot(monkeypatch, tmp_path):
    with moet_env(monkeypatch, env(tmp_path, slots=16)) as m:
        tier = _loaded(m)
        ref = pack_reference(tier)
        old = torch.full((SLOT,), 7, dtype=torch.uint8, device=CUDA)
        tier.pool[3].copy_(old)
        tier._store.expert_store()                    # opened (allocations) before the test
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)                # ~0.1 s of work queued first
        read_by_kernel = tier.pool[3].clone()         # a reader of slot 3 behind it
        tier._store.rows_into([(1, 5)], tier.pool, [3])   # after=None: the current stream
        torch.cuda.synchronize()
        assert torch.equal(read_by_kernel.cpu(), old.cpu())   # it read the old bytes
        assert torch.equal(tier.pool[3].cpu(), ref(1, 5))


@pytest.mark.parametrize("arena", [True, False])
@pytest.mark.parametrize("bad", [0, 4, 7])
def test_a_failed_direct_read_quarantines_the_victims(monkeypatch, tmp_path, arena, bad):
    ram = {"TIERSTORE_RAM_GB": repr(24 * SLOT / 2**30)} if arena else {}
    with moet_env(monkeypatch, env(tmp_path, slots=8, FORCE_POOL=1, DELTA_POLICY="need",
                                   **ram)) as m:
        tier = _loaded(m)
        ref = pack_reference(tier)
        _direct_only(tier, monkeypatch)
        others = torch.tensor([e for e in range(8) if e != bad], device=CUDA)
        m.mark_seen(tier.seen[1], others)             # layer 1's others into the arena
        assert tier.force_promote() == 7
        tier.step_end()
        tier.wait_manager_idle()
        m.mark_seen(tier.seen[0], torch.arange(8, device=CUDA))
        assert tier.force_promote() == 8              # every slot holds layer 0 now
        tier.step_end()
        tier.wait_manager_idle()
        assert _served_exactly(tier, ref) == 8
        store = tier._store.expert_store()
        store.engine._inject_faults(fail_offset=store.pack.row_offset(1, bad) + SLOT // 2,
                                    errno=errno.EIO)
        m.mark_seen(tier.seen[1], torch.arange(8, device=CUDA))   # 7 land, 1 fails
        with pytest.raises(TierIOError, match=f"layer 1 expert {bad}"):
            tier.force_promote()
        store.engine._inject_faults()
        assert _served_exactly(tier, ref) == 0        # the victims are unmapped, not stale
        assert bool((tier._mirror == -1).all()) and sorted(tier._free) == list(range(8))
        assert not store._arena.key_pins.any()        # sources unpinned after the copies
        tier.step_end()
        m.mark_seen(tier.seen[1], torch.arange(8, device=CUDA))
        assert tier.force_promote() == 8              # no slot was lost
        assert _served_exactly(tier, ref) == 8


def test_a_verify_mismatch_on_the_direct_path_publishes_nothing(monkeypatch, tmp_path):
    with moet_env(monkeypatch, env(tmp_path, slots=20)) as m:
        path = _loaded(m)._store.path
    with open(path, "r+b") as f:                      # bit rot in layer 1, expert 2
        f.seek((1 * E + 2) * SLOT + 100)
        f.write(b"\xff" * 8)
    with moet_env(monkeypatch, env(tmp_path, slots=20, TIERSTORE_VERIFY=1)) as m:
        tier = m.get_tier(n_experts=E, dev=CUDA, w13_bytes=W13, w2_bytes=W2)
        ref = pack_reference(tier)
        _direct_only(tier, monkeypatch)
        m.mark_seen(tier.seen[1], torch.tensor([1, 2, 3], device=CUDA))
        with pytest.raises(TierIOError, match="layer 1 expert 2"):
            tier.force_promote()
        assert _served_exactly(tier, ref) == 0 and len(tier._free) == 20
        m.mark_seen(tier.seen[1], torch.tensor([1, 3], device=CUDA))
        assert tier.force_promote() == 2 and _served_exactly(tier, ref) == 2
