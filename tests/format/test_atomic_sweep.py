"""Stale temp files: a writer SIGKILLed mid-write leaves its hidden temp file;
the next atomic write to that directory removes it -- only files of tierstore's own
temp naming, only when their writer is dead (or they are old) -- and never a live
writer's. Real processes, each killed inside a real write (save_poolmon, `tierstore
warm merge`, write_atomic), blocked at the fsync of its temp file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from cli_process import child_env

from tierstore.files import atomic
from tierstore.files.atomic import TEMP_MARK, write_atomic

_MID_WRITE = textwrap.dedent("""
    import os, sys, time
    def fsync(fd):                    # the temp file is written, not yet renamed
        print("mid-write", flush=True)
        time.sleep(300)
    kind, target = sys.argv[1], sys.argv[2]
    if kind == "save_poolmon":
        import tierstore as ts
        store = ts.ExpertStore(sys.argv[3], vram_slots=2, device="cpu")
        store.release(store.fire([(0, 1), (1, 0)]))
        os.fsync = fsync
        store.save_poolmon(target)
    elif kind == "warm-merge":
        from tierstore.cli import main
        os.fsync = fsync
        main(["warm", "merge", sys.argv[3], sys.argv[4], "-o", target])
    else:
        from tierstore.files.atomic import write_atomic
        os.fsync = fsync
        write_atomic(target, b"x" * 100000)
""")


def _mid_write(kind, target, *extra) -> subprocess.Popen:
    p = subprocess.Popen(
        [sys.executable, "-c", _MID_WRITE, kind, str(target), *map(str, extra)],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = p.stdout.readline()
    assert line.strip() == "mid-write", p.stderr.read()
    return p


def _temps(d) -> list[str]:
    return sorted(n for n in os.listdir(d) if TEMP_MARK in n)


@pytest.fixture
def pack_and_heat(tmp_path):
    import tierstore as ts
    from tierstore import PackWriter
    from tierstore.testing.packs import random_layer_rows

    with PackWriter(tmp_path / "pack", tag="fp4", n_layers=2, n_experts=4, slot_bytes=4096, ckpt_id="c") as w:
        for layer in range(2):
            w.write_layer(layer, random_layer_rows(0, layer, 4, 4096))
        pack = w.path
    heat = []
    for i, keys in enumerate(([(0, 1)], [(1, 2), (0, 3)])):
        with ts.ExpertStore(pack, vram_slots=2, device="cpu") as s:
            s.release(s.fire(keys))
            heat.append(tmp_path / f"heat{i}.json")
            s.save_poolmon(heat[-1])
    return pack, heat


def test_temps_of_writers_killed_mid_write_are_swept_by_the_next_write(tmp_path, pack_and_heat):
    pack, (heat_a, heat_b) = pack_and_heat
    d = tmp_path / "warm"
    d.mkdir()
    killed = [
        _mid_write("save_poolmon", d / "poolmon.json", pack),
        _mid_write("warm-merge", d / "merged.json", heat_a, heat_b),
        _mid_write("write_atomic", d / "blob.bin"),
    ]
    live = _mid_write("write_atomic", d / "live.bin")
    try:
        for p in killed:
            p.send_signal(signal.SIGKILL)
            p.wait()  # reaped: its pid is free
        left = _temps(d)
        assert len(left) == 4, left  # three dead writers' temps + the live one
        assert {n.split(TEMP_MARK)[1].split("-")[0] for n in left} == {str(p.pid) for p in killed + [live]}
        # files that are not ours, or whose writer cannot be judged dead from here
        not_ours = [".notes.tmp-12-abc", ".x.tmp-abc-deadbeef", "plain.tmp-1-deadbeef"]
        for name in not_ours:
            (d / name).write_bytes(b"keep")
        dead = killed[0].pid
        other_host = f".y.json{TEMP_MARK}{dead}-00000000-0123abcd"  # another pid namespace
        old_style = f".z.json{TEMP_MARK}{dead}-89abcdef"  # an older tierstore's
        old_other = f".w.json{TEMP_MARK}{dead}-00000000-feedf00d"
        for name in (other_host, old_style, old_other):
            (d / name).write_bytes(b"?")
        day_ago = time.time() - 2 * 86400
        os.utime(d / old_other, (day_ago, day_ago))  # untouched for two days: stale anyway

        write_atomic(d / "next.json", b"{}")  # the next write to this directory

        left = sorted(os.listdir(d))
        assert sorted(set(_temps(d)) - set(not_ours)) == sorted(
            [n for n in left if n.startswith(".live.bin")] + [other_host, old_style]
        ), left
        assert all(n in left for n in not_ours)
        assert "next.json" in left and not [
            n for n in left if n.startswith((".poolmon.json", ".merged.json", ".blob.bin"))
        ], left
        assert live.poll() is None
    finally:
        live.kill()
        live.wait()
    write_atomic(d / "again.json", b"{}")  # the live writer died too: now swept
    assert sorted(set(_temps(d)) - set(not_ours)) == sorted([other_host, old_style])


def test_a_pack_build_sigkilled_in_its_sparse_create_leaves_a_temp_the_next_write_sweeps(tmp_path):
    # create_sized_atomic's temp (the pack file before its rename) from a killed build
    code = textwrap.dedent("""
        import os, sys, time
        def fsync(fd):
            if os.fstat(fd).st_size > 4096:       # the sparse pack temp, not the sidecar
                print("mid-write", flush=True)
                time.sleep(300)
        os.fsync = fsync
        from tierstore import PackWriter
        PackWriter(sys.argv[1], tag="fp4", n_layers=8, n_experts=4, slot_bytes=4096,
                   ckpt_id="c")
    """)
    p = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdout.readline().strip() == "mid-write", p.stderr.read()
    p.kill()
    p.wait()
    assert [n for n in _temps(tmp_path) if n.endswith(tuple("0123456789abcdef"))]
    write_atomic(tmp_path / "notes.json", b"{}")
    assert _temps(tmp_path) == []


def test_the_sweep_judges_only_its_own_names(tmp_path):
    mine = os.path.basename(atomic.temp_path_for(tmp_path / "a.json"))
    assert mine.startswith(f".a.json{TEMP_MARK}{os.getpid()}-")
    (tmp_path / mine).write_bytes(b"")
    write_atomic(tmp_path / "b.json", b"{}")
    assert (tmp_path / mine).exists()  # this process is alive: never swept
