"""``tierstore bench hits`` end to end on small traces (real files, real plot)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tierstore.cli import main
from tierstore.sim import synth, traces

SMALL = [
    "--synthetic",
    "--ticks",
    "40",
    "--layers",
    "3",
    "--experts",
    "16",
    "--top-k",
    "2",
    "--prefill-tokens",
    "8",
    "--prefill-every",
    "20",
]


def test_json_lists_every_policy_and_slot_with_required_fields(capsys, tmp_path):
    png = tmp_path / "hits.png"
    rc = main(
        [
            "bench",
            "hits",
            *SMALL,
            "--slots",
            "4,8",
            "--policies",
            "lru,heat,hybrid,reference,belady,predict",
            "--json",
            "--plot",
            str(png),
        ]
    )
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["policy"], r["slots"]) for r in rows][:2] == [("lru", 4), ("heat", 4)]
    assert len(rows) == 12
    for r in rows:
        assert {"policy", "slots", "hit_rate", "distinct_hit_rate", "reads", "wasted_prefetch"} <= set(r)
        assert 0.0 <= r["hit_rate"] <= 1.0
    belady = {r["slots"]: r["hit_rate"] for r in rows if r["policy"] == "belady"}
    # gap_to_min only where MIN is the ceiling (forced-admission demand
    # fill), in the bandwidth view; the filtering and lazy/prefetch models are
    # bounded by the MIN that may skip, which did not run here.
    bw = {r["slots"]: r["bandwidth_hit_rate"] for r in rows if r["policy"] == "belady"}
    for r in rows:
        if r["policy"] in ("lru", "heat"):
            assert r["gap_to_min"] == pytest.approx(bw[r["slots"]] - r["bandwidth_hit_rate"])
            assert r["bandwidth_hit_rate"] <= bw[r["slots"]] + 1e-12
            assert belady[r["slots"]] >= r["hit_rate"]
        else:
            assert r["gap_to_min"] is None
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_output_on_a_trace_file(capsys, tmp_path):
    tr = synth.synthetic_trace(30, n_layers=2, n_experts=8, top_k=2, prefill_tokens=0, seed=3)
    path = traces.save_trace(tmp_path / "t.npy", tr.to_rows(), {"num_experts": 8})
    assert (
        main(
            [
                "bench",
                "hits",
                "--trace",
                str(path),
                "--slots",
                "3",
                "--policies",
                "lru,belady",
                "--split",
                "second",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "lru" in out and "belady" in out and "gap to MIN" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--slots", "0"], "--slots: expected comma-separated integers >= 1, found '0'"),
        (["--policies", "lru,fifo"], "unknown policy 'fifo'"),
    ],
)
def test_bad_arguments_are_one_line_errors(capsys, argv, message):
    assert main(["bench", "hits", *SMALL, *argv]) == 2  # refused by the parser
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_bad_trace_file_is_one_line_error(capsys, tmp_path):
    path = tmp_path / "bad.npy"
    np.save(path, np.array([[1, 0, 0], [0, 0, 0]], dtype=np.int32))
    assert main(["bench", "hits", "--trace", str(path)]) == 1
    assert "bad.npy: row 1: tick 0 after tick 1" in capsys.readouterr().err


def test_policies_all_runs_every_model(capsys):
    from tierstore import sim

    assert main(["bench", "hits", *SMALL, "--slots", "6", "--policies", "all", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == sim.available_models()
    lru = next(r for r in rows if r["policy"] == "lru")
    for r in rows:  # latency share only at no more reads than LRU
        assert r["latency_gap_closed"] is None or r["reads"] <= lru["reads"]


def test_every_run_prints_one_progress_line_on_stderr(capsys):
    """A long replay says where it is: one stderr line per (model, pool, ratio) run,
    numbered against the total, with the ratio in a prefetching model's label."""
    assert (
        main(
            [
                "bench",
                "hits",
                *SMALL,
                "--slots",
                "4,8",
                "--policies",
                "lru,lru+prefetch",
                "--read-ratios",
                "1,0.5",
                "--json",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    json.loads(captured.out)  # stdout stays pure JSON
    lines = [ln for ln in captured.err.splitlines() if ln.startswith("[bench hits] ")]
    assert len(lines) == 6  # 2 models x 2 pools + 1 extra ratio x 2 pools
    assert [ln.split()[2] for ln in lines] == [f"{i}/6" for i in range(1, 7)]
    labels = [(ln.split()[3], ln.split()[5]) for ln in lines]
    assert labels == [
        ("lru", "4"),
        ("lru+prefetch", "4"),
        ("lru", "8"),
        ("lru+prefetch", "8"),
        ("lru+prefetch@0.5", "4"),
        ("lru+prefetch@0.5", "8"),
    ]


def test_policies_help_names_every_registered_model(capsys):
    """The --policies help is generated from the registry: a policy added there is
    listed without anyone editing the help text."""
    from tierstore.sim import available_models

    assert main(["bench", "hits", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # undo argparse's wrapping
    listed = text.split("--policies POLICIES comma-separated:", 1)[1].split("--budget", 1)[0]
    for name in available_models():
        assert f" {name}," in listed, name
    assert "<policy>+prefetch" in listed
