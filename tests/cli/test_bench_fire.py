"""`tierstore bench fire` on the CPU pool, small sizes: every section runs, every row
is byte-checked, the ratios are there, bad arguments are one-line errors; and the C++
read bound (_C.measure_read_bound) reads what it says."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tierstore import _C
from tierstore.cli import main


def test_bench_fire_cpu_end_to_end(tmp_path, capsys):
    out, png = tmp_path / "fire.json", tmp_path / "fire.png"
    rc = main(
        [
            "bench",
            "fire",
            "--dir",
            str(tmp_path / "d"),
            "--device",
            "cpu",
            "--layers",
            "4",
            "--experts",
            "6",
            "--row-bytes",
            "32768",
            "--sizes",
            "1,4,12",
            "--cold-sizes",
            "1,4",
            "--repeats",
            "2",
            "--h2d-gb",
            "0.01",
            "--baseline-rows",
            "4",
            "--threads",
            "2",
            "--skip",
            "bookkeeping",
            "--out",
            str(out),
            "--png",
            str(png),
        ]
    )
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["checks"]["mismatches"] == []
    assert res["checks"]["rows_checked"] >= 2 * (1 + 4 + 12) * 3
    assert set(res["fires"]) == {"arena", "pagecache", "cold"}
    for by_n in res["fires"].values():
        for n, v in by_n.items():
            assert v["store"]["rows"] == int(n) and v["store"]["p50_ms"] > 0
            assert v["store_vs_engine"] > 0 and v["engine"]["repeats"] >= 1
    assert res["ceilings"]["pagecache_gbps"] > 0 and res["ceilings"]["h2d_gbps"] > 0
    assert "python8t" in res["baselines"]["pagecache"] and "vs_plain_python" in res["fires"]["pagecache"]["4"]
    p = res["pipelined"]
    assert p["layers"] == 4 and p["serial_ms"] > 0 and p["pipelined_ms"] > 0
    assert res["io_uring"].startswith(("available", "unavailable"))
    assert png.stat().st_size > 1000
    assert "byte checks" in capsys.readouterr().out


def test_bench_fire_pool_sized_for_pipelined_step_larger_than_every_fire(tmp_path, capsys):
    # --sizes 1,4 sizes a 4-slot pool; the pipelined step fires 4 layers x 3 misses = 12
    # rows. The pool must hold the step (before: 8 rows never read, "byte check at
    # offset 0x0 failed: EIO" on a healthy pack).
    out = tmp_path / "fire.json"
    rc = main(
        [
            "bench",
            "fire",
            "--dir",
            str(tmp_path / "d"),
            "--device",
            "cpu",
            "--layers",
            "4",
            "--experts",
            "6",
            "--row-bytes",
            "8192",
            "--sizes",
            "1,4",
            "--cold-sizes",
            "1",
            "--sources",
            "pagecache",
            "--step-misses",
            "3",
            "--step-groups",
            "0",
            "--repeats",
            "1",
            "--h2d-gb",
            "0.001",
            "--threads",
            "2",
            "--skip",
            "baselines,bookkeeping,window",
            "--out",
            str(out),
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    res = json.loads(out.read_text())
    assert res["checks"]["mismatches"] == [] and "EIO" not in captured.err
    assert res["pipelined"]["misses_per_layer"] == 3 and res["pipelined"]["pipelined_ms"] > 0


def test_check_placed_names_the_benchmark_sizing_not_the_disk(tmp_path):
    import tierstore as ts
    from tierstore.cli import bench_fire_measure as fm
    from tierstore.errors import CapacityError

    pack = ts.Pack.open(fm.create_pack(str(tmp_path), 2, 4, 8192))
    with ts.ExpertStore(pack, vram_slots=2, ram_gb=0, device="cpu", lazy_per_step=0) as store:
        fr = store.fire([(0, 0), (0, 1), (1, 2)], max_promote=3)
        with pytest.raises(CapacityError, match=r"pool of 2 slots left 1 of 3 routed rows unplaced"):
            fm.check_placed(store, fr, 3, "cold fire")
        store.release(fr)
        fr = store.fire([(0, 0), (0, 1)], max_promote=2)
        fm.check_placed(store, fr, 2, "cold fire")  # all placed: no error
        store.release(fr)


@pytest.mark.parametrize(
    "argv, words, status",
    [
        (["--sizes", "0"], "--sizes", 2),
        (["--row-bytes", "100"], "multiple of 8", 1),
        (["--layers", "2", "--experts", "2", "--sizes", "8"], "largest fire", 1),
        (["--sources", "tape"], "--sources", 2),
        (
            ["--layers", "2", "--experts", "4", "--sizes", "1", "--cold-sizes", "1", "--step-misses", "5"],
            "--step-misses 5",
            1,
        ),
    ],
)
def test_bench_fire_bad_arguments_are_one_line_errors(tmp_path, capsys, argv, words, status):
    try:
        rc = main(["bench", "fire", "--dir", str(tmp_path), "--device", "cpu"] + argv)
    except SystemExit as exc:  # usage errors: argparse exits with 2
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == status and words in err and "Traceback" not in err


def test_read_bound_reads_every_byte_and_reports_errors(tmp_path):
    path = tmp_path / "rows.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 8 * 65536, dtype=np.uint8).tobytes())
    offsets = np.arange(8, dtype=np.int64) * 65536
    r = _C.measure_read_bound(str(path), offsets, 65536, 3, False, 16384, 2)
    assert r["bytes"] == 8 * 65536 and 0 < r["best_s"] <= r["median_s"]
    with pytest.raises(OSError):  # past the end of the file: a short read is an error
        _C.measure_read_bound(str(path), offsets + 65536, 65536, 2, False, 16384, 1)
    with pytest.raises(OSError):
        _C.measure_read_bound(str(tmp_path / "missing"), offsets, 65536, 2, False, 16384, 1)
