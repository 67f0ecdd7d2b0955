"""bench/bench_verify.py (the lead's GPU measurement of checksums on load) runs on the CPU
pool with rows bigger than one 16 MiB stage: every mode fires, every published row is
byte-checked by the bench itself, and "always" hashes every row of every fire."""

from __future__ import annotations

import argparse
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_verify", ROOT / "bench" / "bench_verify.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_verify_big_rows_on_the_cpu_pool(tmp_path):
    args = argparse.Namespace(
        dir=str(tmp_path), device="cpu", rows=2, repeats=1, row_mib=16.5, ram_gb=0.0, threads=2, json=None
    )
    res = _bench().run(args)
    assert res["row_bytes"] == int(16.5 * (1 << 20))
    modes = {m: runs[0] for m, runs in res["modes"].items()}
    assert set(modes) == {"off", "always"}
    assert modes["off"]["verified_rows"] == 0
    assert modes["always"]["verified_rows"] == 2 * (args.repeats + 1)  # every fire, every row
    assert all(r["median_ms"] > 0 and r["ratio_to_off"] > 0 for r in modes.values())
