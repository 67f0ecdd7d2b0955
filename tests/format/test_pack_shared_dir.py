"""Writers that share a directory: a build owns what it creates and, failed or
interrupted, removes only that; a second writer of the same pack is refused naming the
holder's pid; nothing another process finished (or left resumable) is ever removed.
Real processes: concurrent `tierstore pack build`s, SIGINT and SIGKILL mid-build, and
PackWriter users in subprocesses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from cli_process import child_env

from tierstore import Pack, PackWriter
from tierstore.testing.packs import random_layer_rows


def _build(argv, cwd) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tierstore", "pack", "build", *argv],
        cwd=cwd,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_line(p: subprocess.Popen, line: str, timeout: float = 120) -> str:
    seen = []
    deadline = time.monotonic() + timeout
    for text in p.stderr:
        seen.append(text)
        if line in text or time.monotonic() > deadline:
            break
    assert any(line in t for t in seen), f"never saw {line!r}: {''.join(seen)}"
    return "".join(seen)


def _stems(d) -> set[str]:
    return {n.split(".rank")[0] for n in os.listdir(d) if not n.startswith(".")}


def _verify_listed(path) -> tuple[int, ...]:
    with Pack.open(str(path)) as p:
        p.verify()
        return p.layers


@pytest.mark.slow  # real processes (~10 s on 2 shared cores)
def test_an_interrupted_build_removes_only_its_own_files_not_a_neighbours(tmp_path):
    out = tmp_path / "out"
    # B: a long fresh build (3000 layers), interrupted once A and K have run beside it
    b = _build(["out", "--synthetic", "3000,4,4096"], tmp_path)
    try:
        _wait_for_line(b, "layer 1/3000")
        b_stems = _stems(out)
        assert len(b_stems) == 1
        # A: a whole other pack (same tag, other geometry) finished while B runs
        a = subprocess.run(
            [sys.executable, "-m", "tierstore", "pack", "build", "out", "--synthetic", "3,4,4096"],
            cwd=tmp_path,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert a.returncode == 0, a.stderr
        a_pack = tmp_path / a.stdout.strip()
        # K: a third build, SIGKILLed mid-way: its partial pack is resumable work
        k = _build(["out", "--synthetic", "30,4,4096", "--seed", "7"], tmp_path)
        try:
            _wait_for_line(k, "layer 1/30")
        finally:
            k.kill()
            k.wait()
        k_stems = _stems(out) - b_stems - {a_pack.name.split(".rank")[0]}
        assert len(k_stems) == 1
        before_b_ends = sorted(n for n in os.listdir(out) if not n.startswith("."))
        b.send_signal(signal.SIGINT)
        _, err = b.communicate(timeout=60)
    finally:
        if b.poll() is None:
            b.kill()
            b.wait()
    assert b.returncode == 130 and "Traceback" not in err, err
    left = sorted(n for n in os.listdir(out) if not n.startswith("."))
    # B's pack, sidecar and lock are gone; A's and K's files are all still there
    assert left == [n for n in before_b_ends if not n.startswith(tuple(b_stems))], left
    assert not [n for n in left if n.startswith(tuple(b_stems))]
    assert _verify_listed(a_pack) == (0, 1, 2)
    (k_stem,) = k_stems
    k_pack = out / next(n for n in left if n.startswith(k_stem) and n.endswith(".pack"))
    k_layers = _verify_listed(k_pack)
    assert k_layers and k_layers == tuple(range(len(k_layers)))
    # the killed build resumes where it stopped (its lock died with it)
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "tierstore",
            "pack",
            "build",
            "out",
            "--synthetic",
            "30,4,4096",
            "--seed",
            "7",
        ],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0 and again.stdout.strip() == str(k_pack.relative_to(tmp_path)), again.stderr
    assert _verify_listed(k_pack) == tuple(range(30))


def test_a_second_writer_of_the_same_pack_is_refused_naming_the_holder(tmp_path):
    out = tmp_path / "out"
    first = _build(["out", "--synthetic", "3000,4,4096"], tmp_path)
    try:
        _wait_for_line(first, "layer 1/3000")
        mine = sorted(os.listdir(out))
        second = subprocess.run(
            [sys.executable, "-m", "tierstore", "pack", "build", "out", "--synthetic", "3000,4,4096"],
            cwd=tmp_path,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = second.stderr.strip().splitlines()
        assert second.returncode == 1 and len(lines) == 1, second.stderr
        assert "another writer" in lines[0] and f"pid {first.pid}" in lines[0], lines[0]
        assert ".lock" in lines[0]
        assert sorted(os.listdir(out)) == mine  # the refused run removed nothing
        assert first.poll() is None  # and the holder goes on
        first.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    # killed: nothing cleaned, the listed layers are whole, the lock is free again
    pack = next(out.glob("*.pack"))
    assert _verify_listed(pack)


_WRITER = textwrap.dedent("""
    import sys, time
    from tierstore import PackWriter
    from tierstore.testing.packs import random_layer_rows
    out, ckpt, fail_after = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with PackWriter(out, tag="fp4", n_layers=4, n_experts=2, slot_bytes=4096, ckpt_id=ckpt,
                    discard_on_error=True) as w:
        print(w.path, flush=True)
        for layer in range(4):
            if not w.is_written(layer):
                w.write_layer(layer, random_layer_rows(0, layer, 2, 4096))
            if layer + 1 == fail_after:
                sys.stdin.readline()          # the parent lets the other writer finish
                raise SystemExit("failing on purpose")
""")


def _writer(out, ckpt, fail_after) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(out), ckpt, str(fail_after)],
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_failed_packwriter_discards_its_own_pack_and_keeps_one_finished_beside_it(tmp_path):
    failing = _writer(tmp_path, "ckpt-a", fail_after=2)
    a_path = failing.stdout.readline().strip()
    done = _writer(tmp_path, "ckpt-b", fail_after=0)
    b_path = done.stdout.readline().strip()
    assert done.wait(60) == 0, done.stderr.read()
    failing.communicate("\n", timeout=60)
    assert failing.returncode == 1
    names = sorted(os.listdir(tmp_path))
    stem_a, stem_b = (os.path.basename(p)[: -len(".pack")] for p in (a_path, b_path))
    assert not [n for n in names if n.startswith(stem_a)], names
    assert sorted(n for n in names if n.startswith(stem_b)) == [
        f"{stem_b}.json",
        f"{stem_b}.lock",
        f"{stem_b}.pack",
    ]
    assert _verify_listed(b_path) == (0, 1, 2, 3)


def test_a_failed_resume_keeps_the_pack_it_found(tmp_path):
    with PackWriter(tmp_path, tag="fp4", n_layers=4, n_experts=2, slot_bytes=4096, ckpt_id="c") as w:
        w.write_layer(0, random_layer_rows(0, 0, 2, 4096))
        path = w.path
    with pytest.raises(RuntimeError):
        with PackWriter(
            tmp_path, tag="fp4", n_layers=4, n_experts=2, slot_bytes=4096, ckpt_id="c", discard_on_error=True
        ) as w:
            w.write_layer(1, random_layer_rows(0, 1, 2, 4096))
            raise RuntimeError("stop")
    assert _verify_listed(path) == (0, 1)  # the resumed pack and its new layer stay


# -- the lock file: never created or opened through a planted link -------------------


def _small_pack(d) -> str:
    with PackWriter(d, tag="fp4", n_layers=2, n_experts=2, slot_bytes=4096, ckpt_id="c") as w:
        for layer in range(2):
            w.write_layer(layer, random_layer_rows(0, layer, 2, 4096))
        return w.path


@pytest.mark.parametrize("target", ["missing", "existing"])
def test_a_planted_lock_symlink_is_refused_and_nothing_is_created_through_it(tmp_path, target):
    import tierstore as ts

    pack = _small_pack(tmp_path / "packs")
    lock = pack[: -len(".pack")] + ".lock"
    os.unlink(lock)
    victim = tmp_path / "victim"
    if target == "existing":
        victim.write_bytes(b"precious")
    os.symlink(victim, lock)
    # a planting process: the link is made by another process, as an attacker would
    subprocess.run(["ls", "-l", lock], check=True, capture_output=True)
    with Pack.open(pack) as p:
        with pytest.raises(ts.TierstoreError, match=r"\.lock: .*symbolic link"):
            ts.ExpertStore(p, vram_slots=2, device="cpu")
    with pytest.raises(ts.TierstoreError, match=r"\.lock: .*symbolic link"):
        PackWriter(tmp_path / "packs", tag="fp4", n_layers=2, n_experts=2, slot_bytes=4096, ckpt_id="c")
    assert os.path.islink(lock)
    if target == "missing":
        assert not victim.exists()
    else:
        assert victim.read_bytes() == b"precious"


def test_a_foreign_lock_file_in_a_sticky_shared_directory_is_refused(tmp_path):
    import tierstore as ts

    if os.geteuid() != 0:
        pytest.skip("needs root to make a file owned by another user")
    shared = tmp_path / "shared"
    pack = _small_pack(shared)
    lock = pack[: -len(".pack")] + ".lock"
    os.chown(lock, 4242, 4242)
    # an ordinary (not sticky) directory: whoever may write there could replace the pack
    # itself, so a lock of another owner is just a shared one
    with Pack.open(pack) as p, ts.ExpertStore(p, vram_slots=2, device="cpu"):
        pass
    os.chmod(shared, 0o1777)  # /tmp-like: anyone may plant a file there
    with Pack.open(pack) as p:
        with pytest.raises(ts.TierstoreError, match=r"\.lock: .*owned by uid 4242"):
            ts.ExpertStore(p, vram_slots=2, device="cpu")
    with pytest.raises(ts.TierstoreError, match=r"\.lock: .*owned by uid 4242"):
        PackWriter(shared, tag="fp4", n_layers=2, n_experts=2, slot_bytes=4096, ckpt_id="c")
    os.chown(lock, 0, 0)
    with Pack.open(pack) as p, ts.ExpertStore(p, vram_slots=2, device="cpu") as s:
        assert s.fire([(0, 1)]) is not None


def test_a_lock_file_that_is_not_a_regular_file_is_refused(tmp_path):
    import tierstore as ts

    pack = _small_pack(tmp_path)
    lock = pack[: -len(".pack")] + ".lock"
    os.unlink(lock)
    os.mkfifo(lock)
    with Pack.open(pack) as p:
        with pytest.raises(ts.TierstoreError, match=r"\.lock: .*not a regular file"):
            ts.ExpertStore(p, vram_slots=2, device="cpu")
    with pytest.raises(ts.TierstoreError, match=r"\.lock: .*not a regular file"):
        PackWriter(tmp_path, tag="fp4", n_layers=2, n_experts=2, slot_bytes=4096, ckpt_id="c")
    assert np.array_equal(Pack.open(pack).read_row(1, 1), random_layer_rows(0, 1, 2, 4096)[1])


@pytest.mark.parametrize("who", ["writer", "reader"])
def test_a_lock_file_removed_between_open_and_flock_is_not_trusted(tmp_path, monkeypatch, who):
    # A failed fresh writer removes its lock file while holding it; a party that opened
    # that file just before must not keep a lock on the nameless inode (a third party
    # would create a new file and lock it too): the window, injected once.
    from tierstore.format import packlock

    lock = str(tmp_path / "fp4.rank0of1.lock")
    real_open = packlock._open_lock_file
    calls = []

    def open_then_lose_the_name(path, create):
        fd, created = real_open(path, create)
        if not calls:
            os.unlink(path)  # the failed writer's discard, meanwhile
        calls.append(os.fstat(fd).st_ino)
        return fd, created

    monkeypatch.setattr(packlock, "_open_lock_file", open_then_lose_the_name)
    if who == "writer":
        fd, _ = packlock.lock_for_writing(lock)
    else:
        fd = packlock.lock_for_reading(lock[: -len(".lock")] + ".pack", lock)
    try:
        assert len(calls) == 2  # the first file was dropped, a new one locked
        assert os.fstat(fd).st_ino == os.stat(lock).st_ino
    finally:
        os.close(fd)
