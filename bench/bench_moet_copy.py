"""The FP4 tier's host-to-pool copy alone: the old per-row ``copy_`` loop against the
batched ``copy_block`` (adapters/moet_copy.py), against the H2D bound of one contiguous copy.

    python bench/bench_moet_copy.py                                  # GPU: 64 rows of 12 MiB
    python bench/bench_moet_copy.py --device cpu --rows 16 --row-mib 1
    python bench/bench_moet_copy.py --json bench/results/moet_copy.json

Source: a pinned host stage of N rows (what the pack store's ``rows_block`` returns).
Destination: a pool of 2N slots; "scattered" slots are a random permutation (the steady
state: victims anywhere), "run" slots are N consecutive ones (free slots at boot). Each
sample is timed from the first enqueue to the side stream's event synchronize, exactly
as ``force_promote`` waits; every sample's pool rows are byte-checked (per-row sums).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    from tierstore.adapters.moet_copy import copy_block
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--row-mib", type=float, default=12.0)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    n, row = args.rows, int(args.row_mib * 2**20) // 4096 * 4096
    rng = np.random.default_rng(0)
    stage = torch.from_numpy(rng.integers(0, 256, (n, row), dtype=np.uint8))
    if cuda:
        stage = stage.pin_memory()
    want = stage.sum(1, dtype=torch.int64)
    pool = torch.empty(2 * n, row, dtype=torch.uint8, device=dev)
    flat = torch.empty(n, row, dtype=torch.uint8, device=dev)
    side = torch.cuda.Stream(dev) if cuda else None
    cases = {"scattered": rng.permutation(2 * n)[:n], "run": np.arange(n // 2, n // 2 + n)}

    def timed(fn, slots=None):
        if cuda:
            torch.cuda.synchronize(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
        t0 = time.perf_counter()
        fn()
        if cuda:
            ev = torch.cuda.Event()
            ev.record(side)
            ev.synchronize()
        dt = time.perf_counter() - t0
        if slots is not None:
            got = pool[torch.from_numpy(slots).to(dev)].sum(1, dtype=torch.int64).cpu()
            assert torch.equal(got, want), "pool bytes differ from the stage"
        return dt

    def per_row(slots):
        def run():
            ctx = torch.cuda.stream(side) if cuda else _null()
            with ctx:
                for s, r in zip(slots.tolist(), stage):
                    pool[s].copy_(r, non_blocking=cuda)
        return run

    def batched(slots):
        return lambda: copy_block(pool, slots, stage, side)

    def bound():
        ctx = torch.cuda.stream(side) if cuda else _null()
        with ctx:
            flat.copy_(stage, non_blocking=cuda)

    out = {"device": str(dev), "rows": n, "row_bytes": row, "gbps": {}, "samples_ms": {}}
    runs = [("h2d_bound", bound, None)]
    for name, slots in cases.items():
        runs += [(f"per_row_{name}", per_row(slots), slots), (f"batched_{name}", batched(slots), slots)]
    for name, fn, slots in runs:
        timed(fn, slots)                          # warm-up (allocator, scratch)
        ts = [timed(fn, slots) for _ in range(args.repeat)]
        med = statistics.median(ts)
        out["samples_ms"][name] = [round(t * 1e3, 3) for t in ts]
        out["gbps"][name] = round(n * row / med / 1e9, 2)
    b = out["gbps"]["h2d_bound"]
    for name, g in out["gbps"].items():
        print(f"{name:22s} {g:8.2f} GB/s  ({g / b:.2f} of the H2D bound)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
