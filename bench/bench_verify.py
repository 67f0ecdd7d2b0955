"""Cost of checksums on load at the store's public API.

    python3 bench/bench_verify.py --dir /tmp/benchverify [--device cuda] [--rows 64] [--json out.json]
    python3 bench/bench_verify.py --dir /tmp/benchverify --row-mib 40 --rows 24   # big rows

One pack of ``--rows`` rows of ``--row-mib`` MiB (default 12; random bytes, xxh3 per row in
the sidecar), page cache warm. Rows bigger than one 16 MiB stage (``--row-mib 17``, ``40``)
are verified segment by segment as they land (streaming xxh3); with ``--ram-gb 0`` (the
default) a CUDA pool reads them through the pinned staging ring. For each mode (``off``,
and ``always``: every read hashed, the default: a row re-read after an eviction is checked
again) a fresh store fires all
rows ``--repeats`` times (evicting between fires so every fire reads the file), the two
modes' stores open together and fired in alternating order each round; each mode reports
its median fire time and the median of its per-round ratio to ``off``'s fire in the same
round. Round 0 is a warm-up (its time is ``first_ms``), so medians are the steady state.
Every published row is byte-checked once per mode. The GPU run: bench/device/verify.sh.
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


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def run(args) -> dict:
    import glob
    import os

    ROW = int(args.row_mib * (1 << 20))
    where = os.path.join(args.dir, f"rows{args.rows}x{ROW}")  # one pack per shape
    os.makedirs(where, exist_ok=True)
    found = glob.glob(os.path.join(where, "*.pack"))
    pack = ts.Pack.open(found[0]) if found else make_random_pack(where, 1, args.rows, ROW, seed=3)
    keys = [(0, e) for e in range(args.rows)]
    with open(pack.path, "rb") as f:  # warm the page cache
        while f.read(64 << 20):
            pass
    out = {"rows": args.rows, "row_bytes": ROW, "device": args.device, "modes": {}}
    modes = ("off", "always")
    # One store per mode, open together, fired in rotating order within each round: a
    # drift of the machine (page cache, clocks, other tenants) hits every mode alike,
    # and each mode's cost is its median ratio to the ``off`` fire of the same round.
    stores = {
        m: ts.ExpertStore(
            pack,
            vram_slots=args.rows,
            ram_gb=args.ram_gb,
            device=args.device,
            verify=m,
            lazy_per_step=0,
            threads=args.threads,
        )
        for m in modes
    }
    times: dict[str, list[float]] = {m: [] for m in modes}
    try:
        for i in range(args.repeats + 1):  # round 0 warms up
            for m in modes[i % len(modes) :] + modes[: i % len(modes)]:
                store = stores[m]
                store.evict(keys)
                _sync(args.device)
                t0 = time.perf_counter()
                fr = store.fire(keys, max_promote=args.rows)
                _sync(args.device)
                times[m].append(time.perf_counter() - t0)
                store.release(fr)
        for m, store in stores.items():
            table = store.slot_table.cpu().numpy()
            for e in (0, args.rows // 2, args.rows - 1):
                got = store.pool[int(table[0, e])].cpu().numpy()[:ROW]
                assert np.array_equal(got, random_layer_rows(3, 0, args.rows, ROW)[e]), (m, e)
            steady = times[m][1:]
            ratios = [t / o for t, o in zip(steady, times["off"][1:])]
            med = statistics.median(steady)
            out["modes"][m] = [
                {
                    "median_ms": med * 1e3,
                    "gbps": args.rows * ROW / med / 1e9,
                    "first_ms": times[m][0] * 1e3,
                    "ratio_to_off": statistics.median(ratios),
                    "verified_rows": store.engine.stats().get("verified_rows"),
                }
            ]
    finally:
        for store in stores.values():
            store.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True)
    p.add_argument("--device", default="cuda" if ts.cuda_available() else "cpu")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument(
        "--row-mib", type=float, default=12.0, help="row size in MiB (17, 40: bigger than one 16 MiB stage)"
    )
    p.add_argument("--ram-gb", type=float, default=0.0, help="arena size (0: no arena rows)")
    p.add_argument("--threads", type=int, default=16, help="engine reader threads")
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
