"""A writer process killed mid-layer leaves a consistent pack: listed layers are whole,
the lock is free, and a rerun resumes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np

from tierstore import Pack, PackWriter
from tierstore.testing.packs import random_layer_rows

L, E, SLOT = 4, 4, 6000

_CHILD = textwrap.dedent("""
    import os, sys
    from tierstore import PackWriter
    from tierstore.testing.packs import random_layer_rows
    die_at, kill_in = int(sys.argv[2]), sys.argv[3]
    writes = {"n": 0}
    real_pwrite, real_replace = os.pwrite, os.replace
    def pwrite(fd, data, off):
        writes["n"] += 1
        if kill_in == "rows" and writes["n"] == die_at:
            real_pwrite(fd, bytes(data)[: len(data) // 2], off)   # half a row, then death
            os._exit(9)
        return real_pwrite(fd, data, off)
    def replace(a, b):
        if kill_in == "publish" and writes["n"] >= die_at:
            os._exit(9)                                          # sidecar temp written, not renamed
        return real_replace(a, b)
    os.pwrite, os.replace = pwrite, replace
    w = PackWriter(sys.argv[1], tag="fp4", n_layers=4, n_experts=4, slot_bytes=6000, ckpt_id="c")
    for layer in range(4):
        w.write_layer(layer, random_layer_rows(0, layer, 4, 6000))
""")


def _run_child(d, die_at, kill_in):
    r = subprocess.run([sys.executable, "-c", _CHILD, str(d), str(die_at), kill_in])
    assert r.returncode == 9


def _check_and_resume(d, expect_layers):
    with Pack.open(d, tag="fp4") as p:
        assert p.layers == expect_layers
        p.verify()  # listed layers are whole
    with PackWriter(d, tag="fp4", n_layers=L, n_experts=E, slot_bytes=SLOT, ckpt_id="c") as w:
        assert w.written_layers == expect_layers  # lock was released by the dead process
        for layer in range(L):
            if not w.is_written(layer):
                w.write_layer(layer, random_layer_rows(0, layer, E, SLOT))
    assert not [n for n in os.listdir(d) if ".tmp-" in n]  # killed writer's temps removed
    with Pack.open(d, tag="fp4") as p:
        assert p.layers == (0, 1, 2, 3)
        p.verify()
        assert np.array_equal(p.read_row(2, 1), random_layer_rows(0, 2, E, SLOT)[1])


def test_killed_mid_row_write_lists_only_complete_layers(tmp_path):
    _run_child(tmp_path, die_at=2 * E + 2, kill_in="rows")  # inside layer 2
    _check_and_resume(tmp_path, (0, 1))


def test_killed_before_sidecar_rename_keeps_previous_sidecar(tmp_path):
    _run_child(tmp_path, die_at=E + 1, kill_in="publish")  # layer 1 written, not published
    assert [n for n in os.listdir(tmp_path) if ".json.tmp-" in n]  # the sidecar's temp
    _check_and_resume(tmp_path, (0,))
