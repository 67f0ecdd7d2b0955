"""A writer and a live reader coordinate, so a torn row is impossible (docs/FORMAT.md,
"Readers and writers"): a live ExpertStore holds LOCK_SH on the pack's `.lock`, a
PackWriter LOCK_EX. A rewrite attempted under a serving store is refused with a
PackBusyError naming the pack and the holder, also with verify="off" and under a full
concurrent load; a replacement by rename is refused by the store (inode check) and never
served; once the store is closed the rewrite goes through and a new store serves the new
bytes, every published slot checked against the rows of the generation it opened."""

from __future__ import annotations

import os
import shutil
import time

import numpy as np
import pytest
from stress_helpers import Crew, check_published_bytes, leaked_pack_fds, stress_seconds

import tierstore as ts
from tierstore.format import Pack, PackBusyError, PackWriter
from tierstore.testing.packs import RANDOM_QUANTIZER_ABI, make_random_pack, random_layer_rows

L, E, SLOT, SEED = 3, 16, 3000, 8


def _writer(out):
    return PackWriter(
        out,
        tag="fp4",
        n_layers=L,
        n_experts=E,
        slot_bytes=SLOT,
        ckpt_id=f"random-seed{SEED}",
        quantizer_abi=RANDOM_QUANTIZER_ABI,
    )


def _rows(gens):
    """Expected rows when layer l holds generation gens[l] (generation g = seed SEED + g)."""
    return np.stack([random_layer_rows(SEED + g, l, E, SLOT) for l, g in enumerate(gens)]).reshape(
        L * E, SLOT
    )


@pytest.fixture
def pack_dir(tmp_path):
    make_random_pack(tmp_path / "p", L, E, SLOT, seed=SEED).close()
    return tmp_path / "p"


def _path(pack_dir):
    return Pack.open(str(pack_dir)).path


def test_writer_under_a_live_store_is_refused_naming_the_reader(pack_dir):
    path = _path(pack_dir)
    with ts.ExpertStore(path, vram_slots=4, device="cpu", verify="off") as store:
        with pytest.raises(
            PackBusyError,
            match=rf"\.lock: a live reader \(ExpertStore\) "
            rf"\(pid {os.getpid()}\) is serving",
        ):
            _writer(pack_dir)
        store.release(store.fire([(1, 2)]))
    with _writer(pack_dir) as w:  # closed: the lock is free
        w.write_layer(1, random_layer_rows(SEED + 1, 1, E, SLOT))
    with ts.ExpertStore(path, vram_slots=4, device="cpu", verify="off") as store:
        store.release(store.fire([(1, 2), (0, 3)]))
        check_published_bytes(store, _rows([0, 1, 0]))


def test_store_on_a_pack_being_written_is_refused_naming_the_writer(pack_dir):
    path = _path(pack_dir)
    with _writer(pack_dir):
        with pytest.raises(
            PackBusyError,
            match=rf"is being written by a PackWriter "
            rf"\(pid {os.getpid()}\)",
        ):
            ts.ExpertStore(path, vram_slots=4, device="cpu")
    assert not leaked_pack_fds(path)
    ts.ExpertStore(path, vram_slots=4, device="cpu").close()


def test_rewrite_between_pack_open_and_the_store_is_caught_within_one_mtime_tick(pack_dir):
    pack = Pack.open(str(pack_dir))
    st = os.stat(pack.path)
    with _writer(pack_dir) as w:
        w.write_layer(0, random_layer_rows(SEED + 1, 0, E, SLOT))
    os.utime(pack.path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the same clock tick
    with pytest.raises(ts.FormatError, match="sidecar was republished since Pack.open"):
        ts.ExpertStore(pack, vram_slots=4, device="cpu", verify="off")
    pack.close()


def test_two_stores_share_the_reader_lock(pack_dir):
    path = _path(pack_dir)
    with (
        ts.ExpertStore(path, vram_slots=4, device="cpu") as a,
        ts.ExpertStore(path, vram_slots=4, device="cpu") as b,
    ):
        a.release(a.fire([(0, 1)]))
        b.release(b.fire([(0, 1)]))
        a.close()
        with pytest.raises(PackBusyError, match="live reader"):
            _writer(pack_dir)  # b still serves it


def _replace_by_rename(pack_dir, tmp_path, gen):
    """A new pack (every layer at generation ``gen``) written elsewhere, renamed over
    the served one: what a deploy script does; it takes no lock."""
    side = tmp_path / f"gen{gen}"
    if side.exists():
        shutil.rmtree(side)
    new = make_random_pack(side, L, E, SLOT, seed=SEED)
    with _writer(side) as w:
        for l in range(L):
            w.write_layer(l, random_layer_rows(SEED + gen, l, E, SLOT))
    new.close()
    old = Pack.open(str(pack_dir))
    target, target_side = old.path, old.sidecar_path
    old.close()
    os.replace(new.sidecar_path, target_side)
    os.replace(new.path, target)


def test_concurrent_rewrites_never_publish_a_torn_row(pack_dir, tmp_path):
    """Rounds: a store (verify="off", nothing but the lock and the file check stand
    between it and a writer) under three firing threads and a promoter while a rewriter
    thread keeps trying PackWriter rewrites (each must be refused) and, in some rounds, a
    replacement by rename lands mid-round (the store must refuse it, never serve it).
    After each round every published slot holds the rows of the generation the store
    opened; between rounds the rewrite goes through and the generation moves on."""
    budget = stress_seconds(8.0)
    gens, counts = [0] * L, dict(fires=0, refused=0, rewrites=0, replaced=0, rounds=0)
    rng = np.random.default_rng(1)
    t0 = time.monotonic()
    while time.monotonic() - t0 < budget:
        r = counts["rounds"]
        path = _path(pack_dir)
        expect = _rows(gens)
        store = ts.ExpertStore(
            path,
            vram_slots=10,
            ram_gb=12 * 3072 / 2**30,
            device="cpu",
            verify="off",
            threads=2,
            lazy_per_step=2,
        )
        crew, replaced = Crew(), r % 3 == 2

        def forward(tid):
            frng = np.random.default_rng([r, tid])
            while not crew.stop.is_set():
                keys = [(int(k // E), int(k % E)) for k in frng.choice(L * E, 3, replace=False)]
                try:
                    fr = store.fire(keys, max_promote=2, pipelined=bool(frng.random() < 0.3))
                    fr.wait_all()
                except ts.FormatError as exc:  # replaced under us: refused, not served
                    assert replaced and "since Pack.open" in str(exc), exc
                    continue
                counts["fires"] += 1
                table = store.tier("pool").device_table()
                for k in fr.keys.tolist():
                    assert np.array_equal(store.pool[int(table[k])].numpy()[:SLOT], expect[k]), (
                        f"key {k}: torn or foreign row"
                    )
                store.release(fr)
                if tid == 0:
                    store.step()

        def rewriter():
            wrng = np.random.default_rng([r, 7])
            while not crew.stop.is_set():
                try:
                    with _writer(pack_dir) as w:
                        w.write_layer(int(wrng.integers(L)), random_layer_rows(999, 0, E, SLOT))
                    raise AssertionError("a PackWriter rewrote the pack under a live store")
                except PackBusyError:
                    counts["refused"] += 1
                time.sleep(0.002)

        for tid in range(3):
            crew.spawn(forward, tid, name=f"forward{tid}")
        crew.spawn(rewriter)
        time.sleep(0.25)
        if replaced:
            gens = [gens[0] + 1] * L
            _replace_by_rename(pack_dir, tmp_path, gens[0])
            counts["replaced"] += 1
            time.sleep(0.15)
        crew.stop.set()
        crew.join(30)
        check_published_bytes(store, expect)  # the generation it opened, never torn
        store.close()
        assert not leaked_pack_fds(path)
        if not replaced:  # closed: now the rewrite goes through
            layer = int(rng.integers(L))
            gens[layer] += 1
            with _writer(pack_dir) as w:
                w.write_layer(layer, random_layer_rows(SEED + gens[layer], layer, E, SLOT))
            counts["rewrites"] += 1
        counts["rounds"] += 1
    with ts.ExpertStore(_path(pack_dir), vram_slots=L * E, device="cpu", verify="always") as s:
        s.release(s.fire([(l, e) for l in range(L) for e in range(E)]))
        assert check_published_bytes(s, _rows(gens)) == L * E  # the last generation, whole
    print(f"\nrewrite stress: {counts}")
    assert counts["refused"] > 0 and counts["rewrites"] > 0 and counts["replaced"] > 0
