"""force_promote of N rows through vLLM-Moet's tier surface, the store's fire under it, and the
plain Python path.

    python bench/bench_moet_promote.py                       # GPU: 64 rows of 12 MiB
    python bench/bench_moet_promote.py --device cpu --rows 16 --row-mib 1   # CPU, small
    python bench/bench_moet_promote.py --dir /nvme/bench --json bench/results/moet_promote.json

The tier is ``tierstore.adapters.vllm_moet.get_tier`` (the object vLLM-Moet's gate
calls), the timed call is exactly the gate's: ``mark_seen`` of N experts of one
layer, then ``tier.force_promote(layers=None, max_promote=None, pin=True)``, which
returns once the rows are in the pool and mapped (its copies are synchronised);
``torch.cuda.synchronize`` is inside the timing too. Sources:

* ``arena``: rows in tierstore's pinned RAM arena (VLLM_MOE_W2_TIERSTORE_RAM_GB);
* ``pagecache``: no arena, pack rows in the kernel page cache;
* ``disk``: no arena, the pack's pages dropped (fadvise DONTNEED, and drop_caches
  when allowed) before every fire; buffered and O_DIRECT (TIERSTORE_DIRECT=on).

Each source times the face's ``force_promote`` and, back to back on the same
ExpertStore (``tier.expert_store``: engine, arena, threads, pool), the layer below: the
store's own ``fire`` of the same rows and ``release`` (``store/fire``), alternating, so
``force_promote / fire`` is what the face adds (the ``seen`` snapshot and its release).
``h2d_bound`` is one pinned -> device copy of the same bytes; every row reports its
fraction of that bound.

The plain Python store path is vLLM-Moet's own design restated (8 threads of
``os.preadv`` into one pinned stage, then one ``copy_`` per row on a side stream and
one event sync), on the same file and rows, in the same run. Two layers of N
experts alternate, so each fire evicts the previous one's rows; every fire's rows
are checked in the pool (per-row byte sums). Writes JSON with every sample.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
P = "VLLM_MOE_W2_"


def drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
    except OSError:
        pass  # not root: fadvise alone (clean pages of this file go)


def warm_cache(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


class PlainPythonStore:
    """The reference path: a thread pool of os.preadv into a pinned stage, a copy per row."""

    def __init__(self, path, n_experts, slot_bytes, stride, threads, dev, n_rows):
        self.fd = os.open(path, os.O_RDONLY)
        self.E, self.sb, self.stride, self.dev = n_experts, slot_bytes, stride, dev
        self.pool_ex = ThreadPoolExecutor(threads)
        self.stage = torch.empty(n_rows, slot_bytes, dtype=torch.uint8, pin_memory=dev.type == "cuda")
        self.stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None

    def fire(self, pairs, pool, slots):
        mv = memoryview(self.stage.numpy()).cast("B")

        def read(i):
            li, ei = pairs[i]
            off, row, done = (li * self.E + ei) * self.stride, mv[i * self.sb : (i + 1) * self.sb], 0
            while done < self.sb:
                got = os.preadv(self.fd, [row[done:]], off + done)
                if got <= 0:
                    raise OSError(f"short read at {off + done}")
                done += got

        list(self.pool_ex.map(read, range(len(pairs))))
        if self.stream is None:
            for i, s in enumerate(slots):
                pool[s].copy_(self.stage[i])
            return
        with torch.cuda.stream(self.stream):
            for i, s in enumerate(slots):
                pool[s].copy_(self.stage[i], non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(self.stream)
        ev.synchronize()

    def close(self):
        self.pool_ex.shutdown()
        os.close(self.fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--row-mib", type=float, default=12.0, help="w13 2/3, w2 1/3 of the row")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=16, help="tierstore reader threads")
    ap.add_argument("--plain-threads", type=int, default=8)
    ap.add_argument("--dir", default=None, help="pack directory (default: a temp dir)")
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--sources",
        nargs="+",
        default=["arena", "pagecache", "disk", "disk_odirect"],
        help="which sources to time (plain_* runs with pagecache / disk)",
    )
    args = ap.parse_args()
    from tierstore.adapters import vllm_moet as moe_w2_delta

    dev = torch.device(args.device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", 0)
    n, E = max(args.rows, 8), max(args.rows, 8)  # an explicit pool has >= 8 slots
    row = int(args.row_mib * 2**20) // 4096 * 4096
    w13 = row // 3 * 2 // 4096 * 4096
    w2 = row - w13
    d = args.dir or tempfile.mkdtemp(prefix="tierstore-moet-bench-")
    rng = np.random.default_rng(0)
    sums = {}
    base_env = {
        P + "STORE_DIR": d,
        P + "CKPT_ID": f"bench-{n}x{row}",
        P + "NUM_LAYERS": "1",
        P + "GATE": "1",
        P + "DELTA_POLICY": "need",  # no lazy promotion
        P + "DELTA_GB": repr(n * row / 2**30),
        P + "FORCE_POOL": "1",
        P + "STORE_THREADS": str(args.threads),
    }

    def boot(extra):
        moe_w2_delta.reset_env({**base_env, **extra})
        tier = moe_w2_delta.get_tier(n_experts=E, dev=dev, w13_bytes=w13, w2_bytes=w2)
        t0 = time.perf_counter()
        for layer in range(2):
            if layer in tier._store:
                continue
            planes = rng.integers(0, 256, size=(E, row), dtype=np.uint8)
            t = torch.from_numpy(planes)
            tier.add_layer_host_planes(layer, t[:, :w13].to(dev), t[:, w13:].to(dev))
        return tier, time.perf_counter() - t0

    tier, write_s = boot({})
    from tierstore.format.pack import Pack

    pack = Pack.open(tier._store.path)
    for layer in range(2):
        for e in range(E):
            sums[(layer, e)] = int(pack.read_row(layer, e).astype(np.int64).sum())
    moe_w2_delta.shutdown()
    results = {
        "device": str(dev),
        "rows": n,
        "row_bytes": row,
        "pack": pack.path,
        "pack_write_s": round(write_s, 3),
        "samples_ms": {},
    }

    def check(tier, layer):
        slots = tier.slot_table[layer].cpu().numpy()
        assert (slots >= 0).all(), f"layer {layer}: not every expert mapped"
        idx = torch.from_numpy(slots).long().to(dev)
        got = tier.pool[idx].sum(1, dtype=torch.int64).cpu().numpy()
        want = np.array([sums[(layer, e)] for e in range(E)])
        assert np.array_equal(got, want), f"layer {layer}: pool bytes differ from the pack"

    def tier_case(name, extra, before):
        tier, _ = boot(extra)
        tier.wait_manager_idle()
        es = tier.expert_store
        ids = torch.arange(E, device=dev)
        fp_times, fire_times = [], []

        def face(layer):
            moe_w2_delta.mark_seen(tier.seen[layer], ids)
            sync(dev)
            t0 = time.perf_counter()
            got = tier.force_promote(layers=None, max_promote=None, pin=True)
            sync(dev)
            dt = (time.perf_counter() - t0) * 1e3
            assert got == n, f"{name}: promoted {got} of {n}"
            check(tier, layer)
            tier.step_end()
            return dt

        def store_fire(layer):
            keys = np.stack([np.full(E, layer), np.arange(E)], axis=1)
            sync(dev)
            t0 = time.perf_counter()
            result = es.fire(keys, max_promote=E)
            sync(dev)
            dt = (time.perf_counter() - t0) * 1e3
            assert result.promoted == n, f"{name}: store fire promoted {result.promoted}"
            check(tier, layer)
            es.release(result)
            tier.step_end()
            return dt

        face(0)  # warm-up: both layers once
        store_fire(1)
        for i in range(args.repeat):  # the face loads layer 0, the store layer 1: each evicts
            before(i)  # the other's rows
            fp_times.append(face(0))
            before(i)
            fire_times.append(store_fire(1))
        results["samples_ms"][f"{name}/force_promote"] = [round(t, 3) for t in fp_times]
        results["samples_ms"][f"{name}/store_fire"] = [round(t, 3) for t in fire_times]
        ratio = statistics.median(fp_times) / statistics.median(fire_times)
        results.setdefault("face_over_fire", {})[name] = round(ratio, 3)
        moe_w2_delta.shutdown()

    def h2d_case():
        if dev.type != "cuda":
            return
        src = torch.empty(n, row, dtype=torch.uint8).pin_memory()
        dst = torch.empty(n, row, dtype=torch.uint8, device=dev)
        times = []
        for _ in range(args.repeat + 1):
            sync(dev)
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            sync(dev)
            times.append((time.perf_counter() - t0) * 1e3)
        results["samples_ms"]["h2d_bound"] = [round(t, 3) for t in times[1:]]

    def plain_case(name, before):
        pool = torch.empty(n, row, dtype=torch.uint8, device=dev)
        plain = PlainPythonStore(pack.path, E, row, pack.stride, args.plain_threads, dev, n)
        times = []
        for i in range(args.repeat):
            layer = i % 2
            before(i)
            sync(dev)
            t0 = time.perf_counter()
            plain.fire([(layer, e) for e in range(E)], pool, list(range(n)))
            sync(dev)
            times.append((time.perf_counter() - t0) * 1e3)
            got = pool.sum(1, dtype=torch.int64).cpu().numpy()
            assert np.array_equal(got, [sums[(layer, e)] for e in range(E)])
        plain.close()
        results["samples_ms"][name] = [round(t, 3) for t in times]

    arena_gb = repr(2 * n * pack.stride / 2**30 + 0.01)
    warm = lambda i: warm_cache(pack.path)  # noqa: E731
    cold = lambda i: drop_cache(pack.path)  # noqa: E731
    h2d_case()
    srcs = set(args.sources)
    for source, extra, before in (
        ("arena", {P + "TIERSTORE_RAM_GB": arena_gb}, lambda i: None),
        ("pagecache", {}, warm),
        ("disk", {}, cold),
        ("disk_odirect", {P + "TIERSTORE_DIRECT": "on"}, cold),
    ):
        if source not in srcs:
            continue
        tier_case(source, extra, before)
        if source in ("pagecache", "disk"):
            plain_case(f"plain_{source}", before)
    pack.close()
    gb = n * row / 1e9
    print(
        f"force_promote of {n} rows x {row / 2**20:.2f} MiB ({gb:.3f} GB) on {dev}, "
        f"{args.repeat} fires each, every fire byte-checked"
    )
    bound = results["samples_ms"].get("h2d_bound")
    bound_gbs = gb / (statistics.median(bound) / 1e3) if bound else None
    print("| source/path | median ms | min ms | GB/s (median) | of H2D bound |")
    print("|---|---|---|---|---|")
    for name, ts in results["samples_ms"].items():
        med = statistics.median(ts)
        gbs = gb / (med / 1e3)
        results.setdefault("median_ms", {})[name] = round(med, 3)
        results.setdefault("gb_s", {})[name] = round(gbs, 2)
        frac = f"{gbs / bound_gbs:.2f}" if bound_gbs else "-"
        print(f"| {name} | {med:.1f} | {min(ts):.1f} | {gbs:.1f} | {frac} |")
    if results.get("face_over_fire"):
        print()
        print(
            "The face over the store, back to back on one store (median force_promote / median store fire):"
        )
        for src, r in results["face_over_fire"].items():
            print(f"  {src}: {r:.3f}")
    try:
        results["git"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], text=True, capture_output=True
        ).stdout.strip()
    except OSError:
        pass
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    moe_w2_delta.reset_env()


if __name__ == "__main__":
    main()
