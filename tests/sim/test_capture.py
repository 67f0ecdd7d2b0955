"""Routing capture (tierstore/sim/capture.py): bounded, atomic, and the file it writes feeds
``tierstore bench hits``, ``tierstore plan`` and warm start; the vLLM-Moet face writes one."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from moet_surface_helpers import E, L, env, moet_env, planes

from tierstore.cli import main as cli_main
from tierstore.errors import ConfigError, TierIOError
from tierstore.sim.capture import ROW_BYTES, RoutingCapture
from tierstore.sim.traces import load_trace
from tierstore.testing.moet_engine import MoetEngine


def _leftovers(directory) -> list[str]:
    return [n for n in os.listdir(directory) if ".tmp-" in n]


def test_capture_stops_at_max_steps_and_writes_whole_steps(tmp_path):
    cap = RoutingCapture(tmp_path / "t.npy", max_steps=5, meta={"num_experts": 8})
    for step in range(9):
        for layer in (2, 5):
            cap.record(layer, np.array([[step % 8, (step + 3) % 8]]))
        cap.step()
    assert cap.full_reason == "max_steps" and cap.tick == 5
    path = cap.close()
    trace = load_trace(path)
    assert trace.n_ticks == 5 and trace.n_rows == 5 * 2 * 2
    assert list(trace.layer_ids) == [2, 5]
    assert trace.meta["truncated"] == "max_steps" and trace.meta["layers_present"] == [2, 5]
    rows = np.load(path)
    assert rows[:4].tolist() == [[0, 2, 0], [0, 2, 3], [0, 5, 0], [0, 5, 3]]  # order kept
    assert not _leftovers(tmp_path)


def test_capture_stops_before_a_step_that_passes_max_bytes(tmp_path):
    # 6 rows a step: 4 steps are 288 bytes, a 5th would be 360 > 300
    cap = RoutingCapture(tmp_path / "t.npy", max_steps=1000, max_bytes=300)
    for _ in range(10):
        cap.record(0, np.arange(6))
        cap.step()
    path = cap.close()
    assert cap.full_reason == "max_bytes"
    assert np.load(path).shape == (24, 3) and 24 * ROW_BYTES <= 300


def test_counts_tables_keep_token_weight(tmp_path):
    cap = RoutingCapture(tmp_path / "c.npy", max_steps=10)
    table = np.zeros((3, 4), np.int32)
    table[0, 1], table[2, 3], table[2, 0] = 2, 1, 3
    cap.record_counts(table)
    cap.step()
    rows = np.load(cap.close())
    assert rows.tolist() == [[0, 0, 1], [0, 0, 1], [0, 2, 0], [0, 2, 0], [0, 2, 0], [0, 2, 3]]
    assert load_trace(tmp_path / "c.npy").n_experts == 4  # meta num_experts from the table


def test_an_unfinished_step_and_an_empty_capture_write_nothing(tmp_path):
    cap = RoutingCapture(tmp_path / "e.npy", max_steps=10)
    cap.record(0, np.array([1, 2]))  # no step() after it
    assert cap.close() is None and not os.listdir(tmp_path)


def test_a_failed_write_names_the_file_and_leaves_nothing(tmp_path):
    sub = tmp_path / "gone"
    sub.mkdir()
    cap = RoutingCapture(sub / "t.npy", max_steps=3)
    cap.record(0, np.array([1]))
    cap.step()
    os.chmod(sub, 0o500)  # the directory turned read-only
    try:
        if os.access(sub, os.W_OK):  # root ignores modes: remove it instead
            os.chmod(sub, 0o700)
            os.rmdir(sub)
        with pytest.raises(TierIOError, match="t.npy"):
            cap.close()
    finally:
        if sub.exists():
            os.chmod(sub, 0o700)
    assert not sub.exists() or not os.listdir(sub)


@pytest.mark.parametrize(
    "path, message", [("t.txt", "must end in .npy"), ("no/such/dir/t.npy", "does not exist")]
)
def test_bad_capture_paths_are_refused(tmp_path, path, message):
    with pytest.raises(ConfigError, match=message):
        RoutingCapture(tmp_path / path)


@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=st.lists(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9)), max_size=6), max_size=12),
    max_steps=st.integers(1, 15),
    max_rows=st.integers(1, 40),
)
def test_capture_is_a_prefix_of_whole_steps_within_both_bounds(tmp_path, steps, max_steps, max_rows):
    path = tmp_path / "p.npy"
    if path.exists():
        path.unlink()
    cap = RoutingCapture(path, max_steps=max_steps, max_bytes=max_rows * ROW_BYTES)
    for pairs in steps:
        for layer, expert in pairs:
            cap.record(layer, np.array([expert]))
        cap.step()
    out = cap.close()
    kept, rows = 0, 0
    for pairs in steps:  # the reference: whole steps while both hold
        if kept == max_steps or rows + len(pairs) > max_rows:
            break
        kept, rows = kept + 1, rows + len(pairs)
    if kept == 0:
        assert out is None
        return
    got = np.load(out)
    want = [[t, l, e] for t, pairs in enumerate(steps[:kept]) for l, e in pairs]
    assert got.tolist() == want and cap.tick == kept


# -- the vLLM-Moet face, and what the captured file feeds ------------------------------------
@pytest.fixture
def moet_capture(monkeypatch, tmp_path):
    """A vLLM-Moet serving run with DELTA_CAPTURE set: 12 gated steps, then shutdown."""
    path = tmp_path / "routing.npy"
    with moet_env(monkeypatch, env(tmp_path, slots=14, DELTA_CAPTURE=path, DELTA_CAPTURE_TICKS=10)) as m:
        eng = MoetEngine(m, planes(), n_experts=E, dev="cpu", top_k=2, tokens=2).boot()
        for _ in range(12):
            eng.step(fire=True)
    assert path.exists(), "shutdown must write the capture"
    return path


def test_moet_face_captures_its_routing_bounded(moet_capture):
    trace = load_trace(moet_capture)
    meta = json.loads(moet_capture.with_suffix(".meta.json").read_text())
    assert trace.n_experts == E and meta["engine"].startswith("vLLM-Moet")
    assert meta["truncated"] == "max_steps" and trace.n_ticks <= 10
    assert set(trace.layer_ids.tolist()) <= set(range(L))
    # DELTA_CAPTURE makes seen int32 counts: 2 tokens x top-2 = 4 rows a layer a step (the
    # first step also holds the boot's profile forward, folded with it)
    per_tick = np.diff(trace.tick_starts)
    assert trace.n_ticks == 10 and per_tick[0] == 2 * L * 4 and set(per_tick[1:]) == {L * 4}


def test_captured_file_feeds_bench_hits(moet_capture, capsys):
    assert (
        cli_main(
            [
                "bench",
                "hits",
                "--trace",
                str(moet_capture),
                "--slots",
                "4,8",
                "--policies",
                "lru,belady",
                "--json",
            ]
        )
        == 0
    )
    results = json.loads(capsys.readouterr().out)
    assert {r["policy"] for r in results} == {"lru", "belady"}


def test_captured_file_feeds_plan_and_warm_start(moet_capture, tmp_path, capsys):
    warm = tmp_path / "poolmon.json"
    assert (
        cli_main(
            [
                "plan",
                "--layers",
                str(L),
                "--experts",
                str(E),
                "--top-k",
                "2",
                "--hidden",
                "64",
                "--moe-intermediate",
                "32",
                "--card-gb",
                "1",
                "--trace",
                str(moet_capture),
                "--warm-out",
                str(warm),
                "--json",
            ]
        )
        == 0
    )
    plan = json.loads(capsys.readouterr().out)
    assert plan["curve"]["recommended"]["slots"] >= 1
    from tierstore.warm import read_warm_file

    wf = read_warm_file(warm)
    assert len(wf.pool) == plan["curve"]["recommended"]["slots"]
    assert wf.identity.n_layers == L and wf.identity.n_experts == E


def test_tierstore_capture_setting_works_without_delta_capture(monkeypatch, tmp_path):
    from tierstore import settings

    path = tmp_path / "ts.npy"
    monkeypatch.setenv("TIERSTORE_CAPTURE", str(path))
    monkeypatch.setenv("TIERSTORE_CAPTURE_MAX_STEPS", "3")
    settings.reset()
    try:
        assert RoutingCapture.from_settings() is not None
        with moet_env(monkeypatch, env(tmp_path, slots=14)) as m:
            eng = MoetEngine(m, planes(), n_experts=E, dev="cpu", top_k=2, tokens=2).boot()
            for _ in range(5):
                eng.step(fire=False)
        trace = load_trace(path)
        # uint8 seen (no DELTA_CAPTURE): one row per routed expert a step
        assert trace.n_ticks == 3 and trace.meta["weights"].startswith("one row")
    finally:
        monkeypatch.delenv("TIERSTORE_CAPTURE")
        settings.reset()
    assert RoutingCapture.from_settings() is None
