"""`tierstore bench io` end to end on the CPU pool with a tiny file: runs, writes its JSON
atomically, and reports every source with a ratio to its ceiling."""

from __future__ import annotations

import json

from tierstore.cli import main


def test_bench_io_cpu_small_run_reports_every_source(tmp_path, capsys):
    out = tmp_path / "io.json"
    rc = main(
        [
            "bench",
            "io",
            "--pack",
            str(tmp_path / "rows.bin"),
            "--create-gb",
            "0.02",
            "--row-bytes",
            "1048576",
            "--device",
            "cpu",
            "--fires",
            "1,4",
            "--threads",
            "2",
            "--repeats",
            "2",
            "--cold-repeats",
            "1",
            "--ceiling-gb",
            "0.01",
            "--h2d-gb",
            "0.01",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    res = json.loads(out.read_text())
    assert set(res["tierstore"]) == {f"{s}_{n}" for s in ("arena", "pagecache", "cold") for n in (1, 4)}
    for r in res["tierstore"].values():
        assert r["gbps_p50"] > 0 and r["ratio_to_ceiling"] > 0 and r["p99_ms"] >= r["p50_ms"]
    assert res["baselines"]["kvikio"].startswith("skipped")
    assert "python8t_pagecache_4" in res["baselines"]
    assert "ceilings:" in capsys.readouterr().out


def test_bench_io_missing_file_without_create_is_one_line_error(tmp_path, capsys):
    assert main(["bench", "io", "--pack", str(tmp_path / "absent.bin")]) == 1
    assert "absent.bin" in capsys.readouterr().err


def test_bench_io_fire_larger_than_file_is_rejected(tmp_path, capsys):
    rc = main(
        [
            "bench",
            "io",
            "--pack",
            str(tmp_path / "r.bin"),
            "--create-gb",
            "0.005",
            "--row-bytes",
            "1048576",
            "--device",
            "cpu",
            "--fires",
            "64",
        ]
    )
    assert rc == 1 and "largest fire needs 64" in capsys.readouterr().err


def test_bench_io_given_a_sidecar_reads_its_pack(tmp_path):
    """A sidecar names its pack (as Pack.open takes it): the rows come from the .pack, not
    from the JSON file (which was read as rows and failed at its end of file)."""
    from tierstore.testing.packs import make_random_pack

    with make_random_pack(tmp_path / "p", 2, 4, 4096, seed=0) as p:
        sidecar = p.sidecar_path
    out = tmp_path / "io.json"
    rc = main(
        [
            "bench",
            "io",
            "--pack",
            sidecar,
            "--device",
            "cpu",
            "--fires",
            "1,4",
            "--repeats",
            "1",
            "--cold-repeats",
            "1",
            "--no-baselines",
            "--ceiling-gb",
            "0.001",
            "--h2d-gb",
            "0.001",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["file"] == p.path and res["row_bytes"] == 4096 and res["file_bytes"] == 8 * 4096
