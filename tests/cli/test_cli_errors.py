"""The command line refuses bad input like a well-kept tool: one line naming the thing
and what to do, a non-zero exit, no traceback, nothing left behind.

A hypothesis property drives ``tierstore.cli.main`` in-process with generated bad
arguments and paths; a few cases run as real subprocesses, signals included."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from cli_process import child_env, interrupt_after_line
from conftest import private_temp_root
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from tierstore.cli import main
from tierstore.testing.packs import make_random_pack

ROOT = Path(__file__).resolve().parents[2]


def run_main(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def listing(root: Path) -> set:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def demo_dirs() -> set:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("tierstore-demo-")}


private_tmp = pytest.fixture(autouse=True)(private_temp_root)  # conftest: own TMPDIR


def assert_clean_failure(rc, out, err, before, root, demos):
    assert rc not in (0, None), (rc, out, err)
    assert "Traceback" not in err and "Traceback" not in out, err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("tierstore"), err
    assert listing(root) == before, "a refused command left files behind"
    assert demo_dirs() <= demos, "a refused demo left its temp directory"


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """A scratch tree of the kinds of wrong paths users give."""
    root = tmp_path_factory.mktemp("cli-bad")
    (root / "afile").write_bytes(b"not what you think")
    (root / "adir").mkdir()
    (root / "empty.npy").write_bytes(b"")
    (root / "text.npy").write_text("hello\n")
    np.save(root / "trace.npy", np.array([[0, 0, 1], [1, 1, 2]], np.int32))
    (root / "warm.json").write_text('{"version": 1, "keys": [[0, 1]]}')
    pack = make_random_pack(root / "packs", 2, 4, 4096, seed=0)
    pack.close()
    trunc = root / "trunc" / os.path.basename(pack.path)
    trunc.parent.mkdir()
    trunc.write_bytes(Path(pack.path).read_bytes()[:5000])
    Path(str(trunc)[:-5] + ".json").write_bytes(Path(pack.path[:-5] + ".json").read_bytes())
    return root, pack.path, str(trunc)


BAD_INTS = ["0", "-5", "x", "", "1.5", "nan", "1e3", "99999999999999999999"]
BAD_FLOATS = ["-1", "nan", "inf", "x", ""]


def bad_paths(root: Path):
    return {
        "file_as_dir": [str(root / "afile" / "x"), str(root / "afile" / "x.pack")],
        "file": [str(root / "afile")],
        "dir": [str(root / "adir")],
        "missing": [str(root / "nope" / "nope.json"), str(root / "nope.npy")],
        "unwritable": ["/proc/tierstore-x/out.png", "/proc/out.png"],
    }


def cases(root: Path, pack: str, trunc: str):
    """(valid base argv, option, bad values): each example corrupts one option."""
    p = bad_paths(root)
    warm, trace = str(root / "warm.json"), str(root / "trace.npy")
    small_hits = [
        "bench",
        "hits",
        "--synthetic",
        "--ticks",
        "8",
        "--layers",
        "2",
        "--experts",
        "8",
        "--top-k",
        "2",
        "--prefill-tokens",
        "0",
    ]
    io_base = [
        "bench",
        "io",
        "--pack",
        pack,
        "--fires",
        "1",
        "--repeats",
        "1",
        "--no-baselines",
        "--h2d-gb",
        "0.001",
        "--ceiling-gb",
        "0.001",
        "--device",
        "cpu",
    ]
    return [
        (
            ["pack", "build", "{v}", "--synthetic", "2,4,4096"],
            None,
            p["file"] + p["file_as_dir"] + ["/proc/tierstore-x"],
        ),
        (
            ["pack", "build", str(root / "o"), "--synthetic", "{v}"],
            None,
            ["2,4", "0,4,4096", "a,b,c", "", "2,4,-1", "1,1,99999999999"],
        ),
        (["pack", "build", str(root / "o"), "--from-safetensors", "{v}"], None, p["file"] + p["missing"]),
        (["pack", "build", str(root / "o"), "--synthetic", "2,4,4096", "--seed", "{v}"], None, ["-1", "x"]),
        (
            ["pack", "build", str(root / "o"), "--synthetic", "2,4,4096", "--tag", "{v}"],
            None,
            ["a b", "", "x/y"],
        ),
        (["pack", "inspect", "{v}"], None, p["missing"] + p["file"]),
        (["pack", "verify", "{v}"], None, p["missing"]),
        (small_hits + ["--ticks", "{v}"], None, BAD_INTS),
        (small_hits + ["--slots", "{v}"], None, ["0", "", ",", "a", "4,-1"]),
        (small_hits + ["--policies", "{v}"], None, ["", ",", "fifo", "lru,nope"]),
        (small_hits + ["--plot", "{v}"], None, p["dir"] + p["file_as_dir"] + p["unwritable"]),
        (small_hits + ["--half-life", "{v}"], None, BAD_FLOATS + ["0"]),
        (small_hits + ["--top-k", "{v}"], None, ["0", "9", "x"]),
        (
            ["bench", "hits", "--trace", "{v}"],
            None,
            [str(root / "empty.npy"), str(root / "text.npy")] + p["missing"] + p["dir"],
        ),
        (["bench", "hits", "--trace", trace, "--split", "{v}"], None, ["half", ""]),
        (io_base + ["--repeats", "{v}"], None, BAD_INTS),
        (io_base + ["--row-bytes", "{v}"], None, BAD_INTS),
        (io_base + ["--sweep", "{v}"], None, ["garbage", "16", "16:x", "0:4", "16:4:fast", ","]),
        (io_base + ["--sources", "{v}"], None, ["bogus", "", "arena,bogus"]),
        (io_base + ["--fires", "{v}"], None, ["0", "", "x"]),
        (io_base + ["--out", "{v}"], None, p["dir"] + p["file_as_dir"] + p["unwritable"]),
        (io_base[:3] + ["{v}"] + io_base[4:], None, [trunc, str(root / "nope.bin")] + p["dir"]),
        # --device cpu everywhere: no case may depend on whether this host has a GPU
        (["demo", "--quick", "--device", "cpu", "--steps", "{v}"], None, BAD_INTS),
        (
            ["demo", "--quick", "--device", "cpu", "--out", "{v}"],
            None,
            p["file"] + p["file_as_dir"] + ["/proc/x"],
        ),
        (["demo", "--quick", "--device", "cpu", "--plot", "{v}"], None, p["dir"] + p["unwritable"]),
        (["demo", "--quick", "--device", "cpu", "--seed", "{v}"], None, ["-1", "x"]),
        (["warm", "inspect", warm, "--top", "{v}"], None, ["-3", "0", "x"]),
        (["warm", "inspect", "{v}"], None, p["missing"] + p["dir"]),
        (["warm", "inspect", warm, "--pack", "{v}"], None, p["missing"]),
        (["warm", "merge", warm, "-o", "{v}"], None, p["dir"] + p["file_as_dir"] + p["unwritable"]),
        (
            ["warm", "merge", warm, "-o", str(root / "m.json"), "--half-life-s", "{v}"],
            None,
            BAD_FLOATS + ["0"],
        ),
        (["warm", "convert", warm, "--to", "poolmon", "-o", "{v}"], None, p["dir"] + p["file_as_dir"]),
        (["warm", "convert", warm, "--to", "{v}", "-o", str(root / "c.json")], None, ["json", ""]),
    ]


@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_bad_arguments_fail_cleanly(place, data):
    root, pack, trunc = place
    table = cases(root, pack, trunc)
    base, _unused, values = data.draw(st.sampled_from(table), label="case")
    value = data.draw(st.sampled_from(values), label="value")
    argv = [value if a == "{v}" else a for a in base]
    before, demos = listing(root), demo_dirs()
    rc, out, err = run_main(argv)
    assert_clean_failure(rc, out, err, before, root, demos)


@pytest.mark.parametrize(
    "argv, expect",
    [
        (["bench", "hits", "--synthetic", "--ticks", "0"], "argument --ticks: expected an integer >= 1"),
        (["bench", "hits", "--synthetic", "--policies", ""], "expected one or more policy names"),
        (["bench", "io", "--pack", "x", "--sources", "bogus"], "unknown source 'bogus'"),
        (["bench", "io", "--pack", "x", "--sweep", "garbage"], "item 'garbage'"),
        (["demo", "--steps", "0"], "argument --steps: expected an integer >= 1"),
        (["demo", "--steps", "-5"], "found '-5'"),
    ],
)
def test_messages_name_the_option_and_what_is_expected(argv, expect, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, _, err = run_main(argv)
    assert rc == 2 and expect in err and err.count("\n") == 1 and "--help" in err
    assert not os.listdir(tmp_path)


def test_device_cuda_without_a_gpu_is_one_line(tmp_path, monkeypatch, place):
    from tierstore import cuda_available

    if cuda_available():
        pytest.skip("a GPU is present")
    monkeypatch.chdir(tmp_path)
    for argv in (
        ["demo", "--quick", "--device", "cuda"],
        ["bench", "io", "--pack", place[1], "--device", "cuda"],
    ):
        rc, _, err = run_main(argv)
        assert rc == 1 and "--device cuda: no CUDA device" in err and err.count("\n") == 1
    assert not os.listdir(tmp_path)


def test_truncated_pack_is_an_error_not_a_raw_file(place):
    rc, _, err = run_main(["bench", "io", "--pack", place[2], "--device", "cpu"])
    assert rc == 1 and "file size 5000 bytes, expected" in err


def test_warm_convert_refuses_out_of_range_entries_like_merge(tmp_path):
    src = tmp_path / "p.json"
    # a pool-heat file of a 2 x 4 pack naming expert 9
    src.write_text(
        '{"meta": {"version": "pool-heat-v1", "tag": "fp4", "n_layers": 2, "E": 4, '
        '"slot_bytes": 4096}, "owners": [[0, 1], [1, 9]]}'
    )
    for cmd in (["convert", str(src), "--to", "poolmon"], ["merge", str(src)]):
        out = tmp_path / "o.json"
        rc, _, err = run_main(["warm", *cmd, "-o", str(out)])
        assert rc == 1 and "layer 1 expert 9" in err and not out.exists(), err


def test_bad_environment_variable_is_one_line_naming_it(monkeypatch):
    from tierstore import settings

    monkeypatch.setenv("TIERSTORE_POOL_POLICY", "foo")
    settings.reset()
    try:
        rc, _, err = run_main(["bench", "hits", "--synthetic", "--ticks", "4"])
    finally:
        monkeypatch.delenv("TIERSTORE_POOL_POLICY")
        settings.reset()
    assert (
        rc == 1
        and err.count("\n") == 1
        and err.startswith(
            "tierstore: error: TIERSTORE_POOL_POLICY=foo: unknown policy 'foo'; expected one of lru, heat"
        )
    )


def test_expert_store_caps_explicit_sizes_at_the_pack_rows(tmp_path):
    from tierstore.store.expert_store import ExpertStore

    pack = make_random_pack(tmp_path, 2, 4, 4096, seed=1)
    with ExpertStore(pack, vram_gb=6, ram_gb=0.001, device="cpu") as store:
        assert store.stats().pool.capacity == 8
    pack.close()


# -- real processes: exit status, signals, nothing left behind ----------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "hits", "--synthetic", "--ticks", "0"],
        ["pack", "build", "/proc/tierstore-x", "--synthetic", "2,4,4096"],
        ["demo", "--out", "/proc/version"],
    ],
)
def test_subprocess_bad_arguments(argv, tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "tierstore", *argv],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1
    assert not os.listdir(tmp_path)


def _interrupt(argv, cwd, sig, wait_for: str, timeout=120):
    p = subprocess.Popen(
        [sys.executable, "-m", "tierstore", *argv],
        cwd=cwd,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and p.poll() is None:
            if any(wait_for in n for n in os.listdir(cwd)) or any(
                wait_for in n for d in Path(cwd).glob("*/") for n in os.listdir(d)
            ):
                break
            time.sleep(0.02)
        time.sleep(0.2)
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    return p.returncode, out, err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_interrupted_create_leaves_no_temp_file(tmp_path, sig):
    rc, _, err = _interrupt(
        ["bench", "io", "--pack", "rows.bin", "--create-gb", "50", "--device", "cpu"], tmp_path, sig, ".tmp-"
    )
    if rc == 1 and "GB free" in err:
        pytest.skip("not enough disk for the interrupted create")
    assert rc == 128 + sig and "Traceback" not in err and "nothing partial" in err, err
    assert os.listdir(tmp_path) == []


def _interrupt_after_line(argv, cwd, sig, line: str, timeout=120):
    """Run the command and send ``sig`` the moment its stderr shows ``line``."""
    p = subprocess.Popen(
        [sys.executable, "-m", "tierstore", *argv],
        cwd=cwd,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return interrupt_after_line(p, line, sig, timeout)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_interrupted_fresh_pack_build_removes_what_it_wrote(tmp_path, sig):
    # The first progress line comes after layer 1 of 2000 is on disk; the other 1999
    # layers (each a pwrite, an fdatasync and a sidecar publish) cannot all be written
    # before the signal lands, on any machine.
    rc, out, err, seen = _interrupt_after_line(
        ["pack", "build", "out", "--synthetic", "2000,4,65536"], tmp_path, sig, "layer 1/2000"
    )
    assert seen, f"no progress line: {err}"
    assert rc == 128 + sig and "Traceback" not in err and "nothing partial" in err, err
    assert out == ""  # the path of a finished pack is never printed
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")


def test_terminated_demo_removes_its_temp_directory(tmp_path, private_tmp):
    before = set(os.listdir(private_tmp))
    # sent the moment the decode starts: the whole quick demo now takes ~4 s, so a fixed
    # delay could land after main() returned (Python's own SIGTERM then)
    rc, _, err, seen = _interrupt_after_line(
        ["demo", "--quick", "--device", "cpu", "--no-plot"],
        tmp_path,
        signal.SIGTERM,
        "[demo] decode, learning run",
    )
    assert seen and rc == 128 + signal.SIGTERM and "Traceback" not in err, err
    assert set(os.listdir(private_tmp)) <= before and os.listdir(tmp_path) == []


def test_an_unrecognized_argument_holding_a_newline_is_still_one_line():
    # argparse quotes the argument back; a newline in it must not split the error
    # (found by the hostile suite's glued-fragment hypothesis test).
    rc, _, err = run_main(["bench", "hits", "--synthetic", "--ticks", "4", "a\nb"])
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith("tierstore: error: unrecognized arguments: a\\nb"), err
