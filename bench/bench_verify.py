"""Cost of checksums on load at the store's public API (issue 15).

    python3 bench/bench_verify.py --dir /tmp/benchverify [--device cuda] [--rows 64] [--json out.json]

One pack of ``--rows`` rows of 12 MiB (random bytes, xxh3 per row in the sidecar), page
cache warm. For each mode (off, always, first) a fresh store fires all rows ``--repeats``
times (evicting between fires so every fire reads the file); the median fire time of each
mode is reported with its ratio to ``off`` measured in the same run. ``first`` hashes only
its first fire, so its median is the steady state. Every published row is byte-checked
once per mode.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

import tierstore as ts
from tierstore.testing.packs import make_random_pack, random_layer_rows

ROW = 12 << 20


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def run(args) -> dict:
    import glob
    import os
    os.makedirs(args.dir, exist_ok=True)
    found = glob.glob(os.path.join(args.dir, "*.pack"))
    pack = ts.Pack.open(found[0]) if found else make_random_pack(args.dir, 1, args.rows, ROW, seed=3)
    keys = [(0, e) for e in range(args.rows)]
    with open(pack.path, "rb") as f:          # warm the page cache
        while f.read(64 << 20):
            pass
    out = {"rows": args.rows, "row_bytes": ROW, "device": args.device, "modes": {}}
    for mode in ("off", "always", "first", "off"):
        times = []
        with ts.ExpertStore(pack, vram_slots=args.rows, ram_gb=0, device=args.device,
                            verify=mode, lazy_per_step=0, threads=16) as store:
            for i in range(args.repeats):
                store.evict(keys)
                _sync(args.device)
                t0 = time.perf_counter()
                fr = store.fire(keys, max_promote=args.rows)
                _sync(args.device)
                times.append(time.perf_counter() - t0)
                store.release(fr)
            table = store.slot_table.cpu().numpy()
            for e in (0, args.rows // 2, args.rows - 1):
                got = store.pool[int(table[0, e])].cpu().numpy()[:ROW]
                assert np.array_equal(got, random_layer_rows(3, 0, args.rows, ROW)[e]), (mode, e)
            stats = store.engine.stats()
        med = statistics.median(times)
        out["modes"].setdefault(mode, []).append(
            {"median_ms": med * 1e3, "gbps": args.rows * ROW / med / 1e9,
             "first_ms": times[0] * 1e3, "verified_rows": stats.get("verified_rows")})
    base = min(r["median_ms"] for r in out["modes"]["off"])
    for mode, runs in out["modes"].items():
        for r in runs:
            r["ratio_to_off"] = r["median_ms"] / base
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True)
    p.add_argument("--device", default="cuda" if ts.cuda_available() else "cpu")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json")
    args = p.parse_args()
    res = run(args)
    text = json.dumps(res, indent=1)
    if args.json:
        from tierstore.files.atomic import write_atomic
        write_atomic(args.json, text.encode())
    print(text)


if __name__ == "__main__":
    main()
