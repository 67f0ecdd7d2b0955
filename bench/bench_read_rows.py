"""``ExpertStore.read_rows`` into a caller's CUDA pool against ``ExpertStore.fire``, same run.

    python3 bench/bench_read_rows.py --dir /tmp/benchrr [--rows 64] [--row-mib 12] [--threads 8 16]

vLLM-Moet's direct ``force_promote`` (tierstore/adapters/moet_store.py ``rows_into``) is
``read_rows(keys, pool, rows=slots)`` on a store with no pool of its own. This bench tells
apart the cost of that call from the tier's own work around it: for each thread count, from
the page cache (warm) and from a pinned arena, it times

* ``fire``: the store's own pool fire of the same rows (the reference);
* ``read_rows/direct``: rows straight into scattered slots of a caller-owned CUDA tensor;
* ``read_rows/staged``: rows into a pinned host stage, then one H2D copy (the old path);

and, in the same run, the H2D bound (one pinned copy of the same bytes). Every case fires
``--repeats`` times in rotating order per round (a drift of the machine hits all alike);
medians. The direct destination is byte-checked once per case. ``--rewarm`` re-reads the
whole pack before every timed call, as bench_moet_promote.py's page-cache case does.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import time

import numpy as np
import torch

import tierstore as ts
from tierstore.testing.packs import make_random_pack, random_layer_rows


def _sync():
    torch.cuda.synchronize()


def _timed(fn) -> float:
    _sync()
    t0 = time.perf_counter()
    fn()
    _sync()
    return (time.perf_counter() - t0) * 1e3


def run(args) -> dict:
    row = int(args.row_mib * (1 << 20))
    where = os.path.join(args.dir, f"rows{args.rows}x{row}")
    os.makedirs(where, exist_ok=True)
    found = glob.glob(os.path.join(where, "*.pack"))
    pack = ts.Pack.open(found[0]) if found else make_random_pack(where, 1, args.rows, row, seed=5)
    n = args.rows
    keys = np.array([(0, e) for e in range(n)])
    slots = np.random.default_rng(0).permutation(2 * n)[:n]        # scattered, like a pool's
    pool = torch.empty(2 * n, pack.stride, dtype=torch.uint8, device="cuda")
    src = torch.empty(n, row, dtype=torch.uint8).pin_memory()
    dst = torch.empty(n, row, dtype=torch.uint8, device="cuda")
    out = {"rows": n, "row_bytes": row, "samples_ms": {}}
    def warm():                               # the whole pack into the page cache
        with open(pack.path, "rb") as f:
            while f.read(64 << 20):
                pass
    warm()
    for threads in args.threads:
        for source, ram_gb in (("pagecache", 0.0), ("arena", 2 * n * pack.stride / 2**30 + 0.01)):
            own = ts.ExpertStore(pack, vram_slots=n, ram_gb=ram_gb, device="cuda", lazy_per_step=0,
                                 threads=threads)
            bare = ts.ExpertStore(pack, vram_slots=1, ram_gb=ram_gb, device="cuda", lazy_per_step=0,
                                  threads=threads)
            stage = bare.engine.alloc_host(n * pack.stride).view(n, pack.stride)
            copies = torch.cuda.ExternalStream(bare.engine.copy_stream)

            def fire():
                own.evict(keys)
                own.release(own.fire(keys, max_promote=n))

            def direct():
                copies.wait_stream(torch.cuda.current_stream())
                bare.read_rows(keys, pool, rows=slots)

            def staged():
                bare.read_rows(keys, stage)
                pool[torch.from_numpy(slots).cuda()] = stage.to("cuda", non_blocking=True)

            cases = {"fire": fire, "read_rows/direct": direct, "read_rows/staged": staged}
            times = {name: [] for name in cases}
            try:
                for name, fn in cases.items():   # warm-up: fills the arena, hashes once
                    fn()
                want = random_layer_rows(5, 0, n, row)
                got = pool[torch.from_numpy(slots).cuda(), :row].cpu().numpy()
                assert np.array_equal(got, want), "read_rows/direct: pool bytes differ from the pack"
                names = list(cases)
                for i in range(args.repeats):
                    for name in names[i % 3:] + names[:i % 3]:
                        if args.rewarm:
                            warm()
                        times[name].append(_timed(cases[name]))
            finally:
                own.close()
                bare.close()
            for name, ts_ in times.items():
                out["samples_ms"][f"{source}/{name}/t{threads}"] = [round(t, 3) for t in ts_]
    out["samples_ms"]["h2d_bound"] = [round(_timed(lambda: dst.copy_(src, non_blocking=True)), 3)
                                      for _ in range(args.repeats)]
    pack.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="pack directory (kept: reused by a later run)")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--row-mib", type=float, default=12.0)
    ap.add_argument("--threads", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--rewarm", action="store_true",
                    help="re-read the whole pack before every timed call (as bench_moet_promote does)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_read_rows: needs a CUDA device")
    res = run(args)
    gb = res["rows"] * res["row_bytes"] / 1e9
    bound = gb / (statistics.median(res["samples_ms"]["h2d_bound"]) / 1e3)
    print(f"{res['rows']} rows x {res['row_bytes'] / 2**20:.2f} MiB ({gb:.3f} GB), medians")
    print("| case | median ms | GB/s | of H2D bound |")
    print("|---|---:|---:|---:|")
    for name, ms in res["samples_ms"].items():
        med = statistics.median(ms)
        res.setdefault("median_ms", {})[name] = med
        print(f"| {name} | {med:.2f} | {gb / med * 1e3:.1f} | {gb / med * 1e3 / bound:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
