"""Hostile command lines (hostile/cli.py): every case exits non-zero with ONE line on
stderr naming the file or option, no traceback, in bounded time, nothing on disk
changed (a FIFO is never opened by the digest, and must not block the command). They
run in-process (``tierstore.cli.main``) under a per-case timer; a few run as real
processes, SIGINT landing mid-command included; a hypothesis test glues argv
fragments from the corpus together."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import signal
import stat
import subprocess
import sys
import time

import pytest
from cli_process import child_env, interrupt_after_line
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from hostile.cli import NO_PERMISSION, cli_cases, make_place
from hostile.common import tree_digest, without_new_locks
from tierstore.cli import main

BIG = 16 << 20  # the sparse one-TiB files: compared by size and mtime, not read


def digest(root: str) -> dict:
    """tree_digest, except that files over BIG are (size, mtime) only."""
    big = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode) and st.st_size > BIG:
                big[os.path.relpath(p, root)] = ("big", st.st_size, st.st_mtime_ns)
    small = tree_digest(root, skip=set(big)) if big else tree_digest(root)
    return {**small, **big}


RED_TEAM_CLI = 70
CASE_SECONDS = 10.0  # a refused command answers at once; a FIFO must not block it


class CaseTimeout(BaseException):
    """Raised by the per-case timer (not an Exception: the CLI must not swallow it)."""


@contextlib.contextmanager
def deadline(seconds: float):
    def fire(signum, frame):
        raise CaseTimeout()

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_main(argv: list[str], seconds: float = CASE_SECONDS):
    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    try:
        with deadline(seconds), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(argv)
    except CaseTimeout:
        rc = "timeout"
    return rc, out.getvalue(), err.getvalue(), time.perf_counter() - t0


def judge(name: str, argv, names, rc, out, err, elapsed) -> str | None:
    if rc == "timeout":
        return f"{name}: no answer within {CASE_SECONDS} s (blocked?)"
    if rc in (0, None):
        return f"{name}: exit {rc}: {err.strip()[:200]!r}"
    if "Traceback" in err or "Traceback" in out:
        return f"{name}: a traceback: {err[-300:]!r}"
    lines = [l for l in err.splitlines() if l.strip()]
    if len(lines) != 1 or not lines[0].startswith("tierstore"):
        return f"{name}: stderr is not one 'tierstore...' line: {lines[:4]}"
    missing = [n for n in names if n not in lines[0]]
    if missing:
        return f"{name}: does not name {missing}: {lines[0]!r}"
    return None


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    return make_place(str(tmp_path_factory.mktemp("hostile-cli")))


def test_the_cli_class_is_larger_than_the_red_team_s(place):
    cases = cli_cases(place)
    assert len({n for n, *_ in cases}) == len(cases), "case names must be unique"
    assert len(cases) == 389 > 2 * RED_TEAM_CLI  # tests/hostile/README.md
    commands = {tuple(a for a in argv[:2] if not a.startswith("-")) for _, argv, _ in cases}
    for cmd in (
        ("pack", "build"),
        ("pack", "inspect"),
        ("pack", "verify"),
        ("warm", "inspect"),
        ("warm", "merge"),
        ("warm", "convert"),
        ("bench", "hits"),
        ("bench", "io"),
        ("bench", "fire"),
    ):
        assert cmd in commands, f"no case for tierstore {' '.join(cmd)}"


def test_every_hostile_command_line_is_refused_in_one_line(place, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # a command that writes to its cwd writes here
    bad = []
    cases = cli_cases(place)
    denied = [place[k] for k in NO_PERMISSION]
    assert sum(bool(set(denied) & set(argv)) for _, argv, _ in cases) == 22
    for name, argv, names in cases:
        before = digest(place.root)
        with denied_to_root(*denied):  # as any user but root meets them
            res = run_main(argv)
        problem = judge(name, argv, names, *res)
        after = without_new_locks(before, digest(place.root))
        if problem is None and after != before:
            changed = sorted(set(before.items()) ^ set(after.items()))[:3]
            problem = f"{name}: changed files on disk: {changed}"
        if problem is None and os.listdir(tmp_path):
            problem = f"{name}: left {os.listdir(tmp_path)} in the working directory"
        if problem:
            bad.append(problem)
    assert not bad, f"{len(bad)} of {len(cases)} command lines:\n" + "\n".join(bad[:40])
    with denied_to_root(*denied):
        for path in denied:
            with pytest.raises(PermissionError):
                open(path, "rb")


@contextlib.contextmanager
def denied_to_root(*paths: str):
    """``paths`` (mode 000) unreadable to root too: root's open() ignores the mode, so the
    file functions Python's readers use refuse it by hand (EACCES, as for any other user)."""
    if os.geteuid() != 0:
        yield
        return
    import builtins

    targets = {os.path.realpath(p) for p in paths}

    def is_it(p) -> bool:
        return isinstance(p, (str, bytes, os.PathLike)) and os.path.realpath(os.fsdecode(p)) in targets

    def refuse(p):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fsdecode(p))

    real_open, real_os_open, real_access = builtins.open, os.open, os.access
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(builtins, "open", lambda p, *a, **k: refuse(p) if is_it(p) else real_open(p, *a, **k))
        mp.setattr(io, "open", builtins.open)
        mp.setattr(os, "open", lambda p, *a, **k: refuse(p) if is_it(p) else real_os_open(p, *a, **k))
        mp.setattr(
            os,
            "access",
            lambda p, mode, **k: False if is_it(p) and mode & os.R_OK else real_access(p, mode, **k),
        )
        yield


FRAGMENTS = [
    "nan",
    "inf",
    "-1",
    "0",
    "1e400",
    "",
    "x",
    "--json",
    "--help-me",
    "--tag",
    "a b",
    "--device",
    "cpu",
    "-o",
    "--pack",
    "--",
    "-",
    "\x00",
    "é",
    "99999999999999999999",
]


@hsettings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_a_hostile_command_line_with_fragments_glued_in_stays_one_clean_line(
    place, data, monkeypatch, tmp_path
):
    monkeypatch.chdir(tmp_path)
    cases = cli_cases(place)
    name, argv, _ = data.draw(st.sampled_from(cases), label="case")
    pool = FRAGMENTS + sorted(place.p.values())
    for _ in range(data.draw(st.integers(1, 3), label="n")):
        at = data.draw(st.integers(1, len(argv)), label="at")  # never before the command
        argv = argv[:at] + [data.draw(st.sampled_from(pool), label="fragment")] + argv[at:]
    rc, out, err, elapsed = run_main(argv)
    assert rc != "timeout", f"{argv}: blocked"
    assert "Traceback" not in err + out, f"{argv}: {err[-400:]}"
    if rc not in (0, None):
        lines = [l for l in err.splitlines() if l.strip()]
        assert len(lines) == 1 and lines[0].startswith("tierstore"), f"{argv}: {lines[:3]}"


# -- real processes: a FIFO never blocks, SIGINT mid-command leaves nothing half-written --
def _tierstore(argv, cwd, **kw):
    return subprocess.Popen(
        [sys.executable, "-m", "tierstore", *argv],
        cwd=cwd,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


@pytest.mark.parametrize(
    "argv, kind",
    [
        (["warm", "inspect"], "fifo"),
        (["pack", "inspect"], "pack_fifo"),
        (["bench", "hits", "--trace"], "fifo"),
        (["pack", "build", "out", "--from-safetensors"], "st_fifo"),
    ],
)
def test_a_fifo_given_to_a_real_process_is_refused_at_once(place, tmp_path, argv, kind):
    p = _tierstore(argv + [place[kind]], tmp_path)
    try:
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    lines = [l for l in err.splitlines() if l.strip()]
    assert p.returncode in (1, 2) and len(lines) == 1 and "Traceback" not in err, err
    assert place[kind] in lines[0], lines[0]
    assert not os.listdir(tmp_path)


def _interrupt_after(argv, cwd, line: str, sig=signal.SIGINT, timeout=120):
    """Send ``sig`` once stderr shows ``line`` (a point in the run, not a guess at speed)."""
    return interrupt_after_line(_tierstore(argv, cwd), line, sig, timeout)


def test_sigint_in_a_fresh_build_removes_it_and_leaves_the_neighbour_intact(tmp_path):
    from tierstore.files.atomic import TEMP_MARK
    from tierstore.format import Pack

    geo = "1500,4,65536"
    first = subprocess.run(
        [sys.executable, "-m", "tierstore", "pack", "build", "out", "--synthetic", "3,4,65536"],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert first.returncode == 0, first.stderr
    # SIGINT lands after layer 1 of 1500 of a fresh pack is on disk
    rc, out, err, seen = _interrupt_after(
        ["pack", "build", "big", "--synthetic", geo], tmp_path, "layer 1/1500"
    )
    assert seen and rc == 130 and "Traceback" not in err and "nothing partial" in err, err
    assert out == ""
    left = [n for d in ("out", "big") if (tmp_path / d).exists() for n in os.listdir(tmp_path / d)]
    assert not [n for n in left if TEMP_MARK in n], left
    assert not (tmp_path / "big").exists() or not os.listdir(tmp_path / "big")
    with Pack.open(str(next((tmp_path / "out").glob("*.pack")))) as p:  # untouched
        assert p.written.all() and p.verify().rows_checked == 12


def test_sigint_in_a_long_bench_hits_writes_no_plot_and_no_temp(tmp_path):
    p = _tierstore(["bench", "hits", "--synthetic", "--ticks", "200000", "--plot", "hits.png"], tmp_path)
    try:
        time.sleep(4.0)  # imports done, the replay running
        assert p.poll() is None, "the long replay ended before the signal"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130 and "Traceback" not in err, err
    assert [l for l in err.splitlines() if l.strip()][-1].startswith("tierstore: interrupted")
    assert os.listdir(tmp_path) == []
