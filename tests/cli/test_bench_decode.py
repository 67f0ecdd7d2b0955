"""`tierstore bench decode` on the CPU pool at a tiny geometry: the JSON's invariants.

Every run of a pool counts what the trace makes it do under the CLOCK rule (the Python
oracle of tests/residency_helpers.py replays the same routing), the device-side and the
host-planned runs count the same, every read is counted (bytes = rows placed x row size;
placed + no_arena + no_slot = misses), every pool row left is byte-checked, and the
all-resident bound reads nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest
from residency_helpers import ClockOracle

from tierstore.cli import bench_decode_loop as dl
from tierstore.cli import main

L, E, K, H, I = 3, 16, 2, 64, 32
STEPS, WARMUP = 6, 3


@pytest.fixture(scope="module")
def decode_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench_decode")
    out, png = d / "decode.json", d / "decode.png"
    rc = main(
        [
            "bench",
            "decode",
            "--dir",
            str(d / "pack"),
            "--device",
            "cpu",
            "--layers",
            str(L),
            "--experts",
            str(E),
            "--hidden",
            str(H),
            "--inter",
            str(I),
            "--top-k",
            str(K),
            "--steps",
            str(STEPS),
            "--warmup",
            str(WARMUP),
            "--pools",
            "100,50,20",
            "--out",
            str(out),
            "--png",
            str(png),
            "--seed",
            "3",
        ]
    )
    assert rc == 0
    return json.loads(out.read_text()), png


def _oracle_counts(routing: np.ndarray, slots: int) -> dict:
    oracle = ClockOracle(L, E, slots)
    for step in routing:
        for layer in range(L):
            oracle.decide(layer, step[layer])
    return oracle.c


def test_counts_equal_the_oracle_and_the_two_planners_agree(decode_run):
    res, _ = decode_run
    routing = dl.synthetic_routing(STEPS + WARMUP, L, E, K, 1, seed=3)
    distinct = dl.distinct_per_decide(routing, E).sum()
    row_bytes = res["geometry"]["row_bytes"]
    for row in res["pools"]:
        dev, host = row["modes"]["device"], row["modes"]["host_planned"]
        assert dev["counters_run"] == host["counters_run"]  # the same decide, twice
        c = dev["counters_run"]
        assert c["routed"] == routing.size  # every routed id seen
        assert c["bytes"] == c["placed"] * row_bytes  # every read counted
        assert c["placed"] + c["no_arena"] + c["no_slot"] == c["misses"]
        if dev["warm"]:  # every routed key preloaded: nothing misses, nothing is read
            assert (c["misses"], c["bytes"], c["hits"]) == (0, 0, distinct)
            continue
        assert c["hits"] + c["misses"] == distinct
        want = _oracle_counts(routing, row["slots"])
        assert {k: c[k] for k in want} == want, row["pct"]
    small = [r for r in res["pools"] if not r["modes"]["device"]["warm"]]
    assert small and all(r["modes"]["device"]["counters_run"]["misses"] > 0 for r in small)


def test_all_resident_bound_and_all_miss_run(decode_run):
    res, _ = decode_run
    allres = res["all_resident"]
    assert allres["counters_timed"]["misses"] == 0 and allres["counters_timed"]["bytes"] == 0
    assert allres["counters_timed"]["decides"] == 0  # attention + MoE only: no residency
    # The bound does the least work: it reads nothing, a cold pool reads. (Its tokens/s are
    # not compared here: steps of a few ms on 2 shared cores vary 100-fold under load.)
    for row in res["pools"]:
        for mode, m in row["modes"].items():
            assert m["tok_s"] > 0 and m["counters_run"]["bytes"] >= 0
            if mode != "uva_static" and not m["warm"]:  # a cold pool (uva: preloaded)
                assert m["counters_run"]["bytes"] > 0, (row["pct"], mode)
    am = res["all_miss"]["modes"]["device"]
    assert am["miss_rate"] == 1.0 and am["counters_timed"]["hits"] == 0
    assert res["all_miss"]["modes"]["host_planned"]["counters_run"] == am["counters_run"]


def test_rows_checked_png_and_report_fields(decode_run):
    res, png = decode_run
    assert res["checks"]["mismatches"] == [] and res["checks"]["rows_checked"] > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert res["geometry"] == {
        "layers": L,
        "experts": E,
        "top_k": K,
        "batch": 1,
        "hidden": H,
        "inter": I,
        "row_bytes": res["geometry"]["row_bytes"],
        "stride": res["geometry"]["stride"],
        "keys": L * E,
    }
    assert [r["pct"] for r in res["pools"]] == [100, 50, 20]
    assert "device_vs_all_resident_100pct" in res["goals"]


def test_gate_reruns_are_counted(tmp_path):
    out = tmp_path / "g.json"
    rc = main(
        [
            "bench",
            "decode",
            "--dir",
            str(tmp_path / "pack"),
            "--device",
            "cpu",
            "--layers",
            "2",
            "--experts",
            "8",
            "--hidden",
            str(H),
            "--inter",
            str(I),
            "--top-k",
            "2",
            "--steps",
            "8",
            "--warmup",
            "0",
            "--pools",
            "50",
            "--modes",
            "device",
            "--gate-rate",
            "0.5",
            "--skip",
            "all_resident,all_miss",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    m = json.loads(out.read_text())["pools"][0]["modes"]["device"]
    assert m["reruns"] > 0
    assert m["counters_timed"]["routed"] == 2 * 2 * (8 + m["reruns"])
    assert m["counters_timed"]["decides"] == 2 * (8 + m["reruns"])


def test_pack_source_is_required(capsys):
    assert main(["bench", "decode", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--dir" in err[0] and "--pack" in err[0]


@pytest.mark.parametrize(
    "argv, text",
    [
        (["--dir", "D", "--hidden", "48", "--device", "cpu"], "multiples of 32"),
        (
            [
                "--dir",
                "D",
                "--top-k",
                "9",
                "--experts",
                "8",
                "--layers",
                "1",
                "--hidden",
                "64",
                "--inter",
                "32",
                "--device",
                "cpu",
            ],
            "--top-k 9",
        ),
    ],
)
def test_bad_arguments_one_line(tmp_path, capsys, argv, text):
    argv = [a.replace("D", str(tmp_path / "p")) if a == "D" else a for a in argv]
    assert main(["bench", "decode", *argv]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and text in err[0] and "Traceback" not in err[0]
