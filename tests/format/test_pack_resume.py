"""A resumed build asks only for the space it still needs; a pack whose mtime
changed but whose inode, size and sidecar did not (`touch`) keeps serving, its rows still
checked against their sums; a changed one is still refused or caught."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import xxhash
from cli_process import child_env

import tierstore as ts
from tierstore import Pack, PackWriter
from tierstore.files.atomic import write_atomic
from tierstore.format.sidecar import encode_sidecar, load_sidecar
from tierstore.testing.packs import random_layer_rows


class _Stop(Exception):
    pass


@pytest.mark.slow  # real processes (~10 s on 2 shared cores)
def test_a_resumed_build_on_a_nearly_full_disk_asks_only_for_what_is_left(tmp_path):
    from tierstore.format.build import build_synthetic

    free = shutil.disk_usage(tmp_path).free
    E = 1  # the smallest layer that still lets the
    slot = -(-2 * free // 60000 // (1 << 20)) << 20  # pack be twice the free space
    L = 2 * (free // (E * slot) + 1)
    if L > 1 << 16 or slot > 1 << 30:
        pytest.skip(f"{free / 1e9:.0f} GB free: no pack geometry is larger than the disk")
    out = tmp_path / "out"

    def stop_after_first(done, total):
        raise _Stop()

    with pytest.raises(_Stop):  # layer 0 written for real, then stopped
        build_synthetic(str(out), L, E, slot, on_layer=stop_after_first)
    pack = next(out.glob("*.pack"))
    side = pack.with_suffix(".json")
    sc, _ = load_sidecar(str(side), key20_in_name=True)
    assert sc.layers == [0]
    # every layer but the last "written": holes, which read as zero rows, with the sums of
    # zero rows -- so the disk holds one real layer of a pack larger than the disk
    zero = xxhash.xxh3_64_intdigest(bytes(slot))
    sc.layers = list(range(L - 1))
    sc.checksums.update({layer: [zero] * E for layer in range(1, L - 1)})
    write_atomic(side, encode_sidecar(sc))
    r = subprocess.run(
        [sys.executable, "-m", "tierstore", "pack", "build", "out", "--synthetic", f"{L},{E},{slot}"],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(pack.relative_to(tmp_path))
    with Pack.open(str(pack)) as p:
        assert p.written.all()
        assert p.row_checksum(L - 1, 0) == xxhash.xxh3_64_intdigest(p.read_row(L - 1, 0))
        assert p.row_checksum(L - 2, 0) == zero
    # a fresh build of that size is still refused up front, naming what it needs, and
    # leaves nothing behind
    r = subprocess.run(
        [sys.executable, "-m", "tierstore", "pack", "build", "big", "--synthetic", f"{L},{E},{slot}"],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 1 and "the pack needs" in r.stderr and "GB free" in r.stderr, r.stderr
    assert not (tmp_path / "big").exists()


def _pack(d, checksums=True) -> str:
    with PackWriter(d, tag="fp4", n_layers=4, n_experts=4, slot_bytes=4096, ckpt_id="c") as w:
        for layer in range(4):
            w.write_layer(layer, random_layer_rows(0, layer, 4, 4096))
        path = w.path
    if not checksums:  # as vLLM-Moet writes it: no sums
        side = path[: -len(".pack")] + ".json"
        with open(side) as f:
            doc = json.load(f)
        del doc["checksum"], doc["checksums"]
        write_atomic(side, json.dumps(doc).encode())
    return path


def _served(store, pack, keys) -> None:
    r = store.fire(keys)
    try:
        for layer, e in keys:
            slot = int(store.slot_table[layer, e])
            assert np.array_equal(store.pool[slot].numpy(), pack.read_row(layer, e))
    finally:
        store.release(r)


def _touch(path, when="2001-01-01 00:00:00") -> None:
    before = os.stat(path).st_mtime_ns
    subprocess.run(["touch", "-d", when, path], check=True)
    assert os.stat(path).st_mtime_ns != before


def test_a_touched_but_identical_pack_keeps_serving(tmp_path):
    path = _pack(tmp_path)
    with Pack.open(path) as pack, ts.ExpertStore(pack, vram_slots=2, device="cpu", verify="always") as store:
        _served(store, pack, [(0, 1), (1, 2)])
        _touch(path)  # mtime changed; inode, size, sums not
        _served(store, pack, [(2, 3), (3, 0)])  # evicts and reads again from disk
        _served(store, pack, [(0, 1), (1, 2)])
        _touch(path, "2002-02-02 00:00:00")
        _served(store, pack, [(2, 2), (3, 3)])
        assert pack.mtime_changes == 2


def test_a_touched_pack_whose_rows_changed_is_caught_by_their_sums(tmp_path):
    path = _pack(tmp_path)
    with Pack.open(path) as pack, ts.ExpertStore(pack, vram_slots=2, device="cpu", verify="always") as store:
        _served(store, pack, [(0, 1)])
        with open(path, "r+b") as f:  # same size, one byte of a row flipped
            f.seek((2 * 4 + 3) * 4096 + 17)
            b = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([b[0] ^ 0xFF]))
        _touch(path)
        with pytest.raises(ts.TierstoreError, match=r"layer 2 expert 3"):
            store.release(store.fire([(2, 3)]))
        assert int(store.slot_table[2, 3]) < 0  # nothing of it published
        _served(store, pack, [(1, 1)])  # the rest still served


@pytest.mark.parametrize("checksums, verify", [(False, "always"), (True, "off")])
def test_a_touched_pack_whose_reads_are_not_hashed_is_still_refused(tmp_path, checksums, verify):
    path = _pack(tmp_path, checksums=checksums)
    with Pack.open(path) as pack, ts.ExpertStore(pack, vram_slots=2, device="cpu", verify=verify) as store:
        _served(store, pack, [(0, 1)])
        _touch(path)  # nothing can tell a touch from a rewrite
        with pytest.raises(ts.TierstoreError, match=r"modified since Pack\.open"):
            store.release(store.fire([(2, 3)]))


def test_a_pack_whose_size_changed_is_still_refused(tmp_path):
    path = _pack(tmp_path)
    with Pack.open(path) as pack, ts.ExpertStore(pack, vram_slots=2, device="cpu") as store:
        _served(store, pack, [(0, 1)])
        with open(path, "ab") as f:
            f.write(b"x")
        with pytest.raises(ts.TierstoreError, match=r"modified since Pack\.open"):
            store.release(store.fire([(2, 3)]))
