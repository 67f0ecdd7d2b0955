"""``tierstore bench io``: promote bandwidth and fire latency of the I/O engine.

In one run on one file: the ceilings (pinned H2D of one large buffer, O_DIRECT read at
16 threads, page-cache read at 16 threads), the plain Python baseline, kvikio (POSIX
compat mode, when importable and on CUDA) and tierstore fires of 1/8/64/512 rows from
the arena, the page cache and a cold disk, each with its ratio to its ceiling.
On ``--device cpu`` the pool is host memory (copies are memcpy) so it runs anywhere.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

from tierstore.errors import ConfigError
from tierstore.cli import bench_io_measure as m
from tierstore.cli.args import int_list

ROW_12MIB = 12_582_912


def register(sub) -> None:
    p = sub.add_parser("io", help="Promote I/O benchmark: ceilings, baselines, tierstore fires",
                       description=__doc__.splitlines()[0])
    p.add_argument("--pack", required=True, help="pack file or any file of rows")
    p.add_argument("--create-gb", type=float, default=0.0,
                   help="create PATH with this many GB of random rows when it does not exist")
    p.add_argument("--row-bytes", type=int, default=ROW_12MIB, help="row size (raw files)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--fires", default="1,8,64,512", help="fire sizes in rows")
    p.add_argument("--sources", default="arena,pagecache,cold")
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--chunk-mib", type=float, default=4.0)
    p.add_argument("--stage-count", type=int, default=16)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--cold-repeats", type=int, default=3)
    p.add_argument("--ceiling-gb", type=float, default=2.0, help="bytes read for the read ceilings")
    p.add_argument("--h2d-gb", type=float, default=2.0, help="size of the H2D ceiling copy")
    p.add_argument("--kvikio-threads", default="1,8,16,32")
    p.add_argument("--no-baselines", action="store_true", help="skip Python baseline and kvikio")
    p.add_argument("--sweep", default="", metavar="THREADS:CHUNK_MIB[:noramp],...",
                   help="also time 64-row page-cache and cold fires for these engine settings "
                        "(':noramp': chunk_ramp=False)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--out", help="also write the JSON results to this file (atomically)")
    p.set_defaults(func=main)


def _file_rows(path: str, row_bytes: int) -> tuple[np.ndarray, int]:
    """Row offsets and row size: a pack's written rows, else consecutive 4 KiB-aligned rows."""
    try:
        from tierstore.format.pack import Pack
        with Pack.open(path) as pack:
            ids = [l * pack.n_experts + e for l in pack.layers for e in range(pack.n_experts)]
            return np.asarray(pack.row_offsets(np.asarray(ids)), np.int64), int(pack.slot_bytes)
    except Exception:
        stride = (row_bytes + m.PAGE - 1) // m.PAGE * m.PAGE
        n = os.path.getsize(path) // stride
        return np.arange(n, dtype=np.int64) * stride, row_bytes


def _progress(text: str) -> None:
    print(f"[bench io] {text}", file=sys.stderr, flush=True)


def run(args, res: dict | None = None) -> dict:
    """Fill `res` (a fresh dict when None) step by step, so a failure keeps what was measured."""
    import torch
    from tierstore import cuda_available
    from tierstore.io.engine import Engine
    path = args.pack
    if not os.path.exists(path):
        if args.create_gb <= 0:
            raise FileNotFoundError(2, "no such file", path)
        m.create_file(path, int(args.create_gb * 1e9))
    device = args.device if args.device != "auto" else ("cuda" if cuda_available() else "cpu")
    fires, sources = int_list(args.fires, "fires"), args.sources.split(",")
    offsets, row = _file_rows(path, args.row_bytes)
    if len(offsets) < max(fires):
        raise ConfigError(f"{path}: {len(offsets)} rows of {row} B, the largest fire needs "
                          f"{max(fires)}")
    file_bytes = int(offsets[-1]) + row
    rng = np.random.default_rng(0)
    res = {} if res is None else res
    res.update({"file": path, "file_bytes": file_bytes, "row_bytes": row, "device": device,
                "threads": args.threads, "ceilings": {}, "tierstore": {}, "baselines": {},
                "sweep": {}})
    ceil = res["ceilings"]
    # 1. Ceilings, on this file, now.
    ceil["h2d_gbps"] = m.ceiling_h2d(torch, device, int(args.h2d_gb * (1 << 30)))
    span = min(file_bytes, int(args.ceiling_gb * 1e9))
    ceil["odirect_16t_gbps"] = m.ceiling_read(path, span, row, 16, direct=True)
    m.warm(path, file_bytes)
    ceil["pagecache_16t_gbps"] = m.ceiling_read(path, span, row, 16, direct=False, passes=3)
    _progress(f"ceilings {ceil}")

    top = max(fires)
    pool = torch.empty((top, row), dtype=torch.uint8, device=device)
    engine = Engine(path, threads=args.threads, direct="auto", device=device,
                    chunk_bytes=int(args.chunk_mib * (1 << 20)) // m.PAGE * m.PAGE,
                    stage_bytes=(row + m.PAGE - 1) // m.PAGE * m.PAGE,
                    stage_count=args.stage_count)
    res["direct_active"] = engine.direct_active
    pick = lambda n: np.sort(rng.choice(offsets, size=n, replace=False))  # noqa: E731
    ts = res["tierstore"]
    try:
        # 2. tierstore from the arena and the page cache (file still warm).
        if "arena" in sources:
            arena = engine.alloc_host(top * row).view(top, row)
            arena.fill_(3)
            for n in fires:
                t = [m.tierstore_fire(torch, engine, device, pick(n), row, pool, arena[:n])
                     for _ in range(args.repeats)]
                ts[f"arena_{n}"] = m.summarize(t[1:] or t, n, row)
            del arena
            _progress("arena fires done")
        if "pagecache" in sources:
            m.warm(path, file_bytes)
            for n in fires:
                t = [m.tierstore_fire(torch, engine, device, pick(n), row, pool)
                     for _ in range(args.repeats)]
                ts[f"pagecache_{n}"] = m.summarize(t[1:] or t, n, row)
            _progress("page-cache fires done")
        base_n = min(64, top)
        if not args.no_baselines:
            _baselines(args, res, torch, device, path, pool, row, base_n, pick, cold=False)
        # 3. Cold: evict the whole file before every fire.
        if "cold" in sources:
            for n in fires:
                reps = 1 if n * row > 2e9 else args.cold_repeats
                t = []
                for _ in range(reps):
                    res["evict"] = m.evict(path)
                    t.append(m.tierstore_fire(torch, engine, device, pick(n), row, pool))
                ts[f"cold_{n}"] = m.summarize(t, n, row)
                _progress(f"cold {n} done: {ts[f'cold_{n}']['gbps_p50']:.2f} GB/s")
            if not args.no_baselines:
                _baselines(args, res, torch, device, path, pool, row, base_n, pick, cold=True)
        res["engine_stats"] = {k: v for k, v in engine.stats().items()}
    finally:
        engine.close()
    if args.sweep:
        _sweep(args, res, torch, device, path, pool, row, min(64, top), pick, file_bytes)
    _ratios(res)
    return res


def _sweep(args, res, torch, device, path, pool, row, n, pick, file_bytes) -> None:
    """Engine settings side by side: all page-cache fires first (one warm-up of the file),
    then the cold ones (each after an eviction)."""
    from tierstore.io.engine import Engine
    items = args.sweep.split(",")
    engines = {}
    try:
        for item in items:
            threads, chunk_mib, *flags = item.split(":")
            engines[item] = Engine(path, threads=int(threads), direct="auto", device=device,
                                   chunk_bytes=int(float(chunk_mib) * (1 << 20)) // m.PAGE * m.PAGE,
                                   stage_bytes=(row + m.PAGE - 1) // m.PAGE * m.PAGE,
                                   stage_count=args.stage_count, chunk_ramp="noramp" not in flags)
        m.warm(path, file_bytes)
        for item, eng in engines.items():
            t = [m.tierstore_fire(torch, eng, device, pick(n), row, pool) for _ in range(6)]
            res["sweep"][f"pagecache_{n}_{item}"] = m.summarize(t[1:], n, row)
        for item, eng in engines.items():
            m.evict(path)
            t = [m.tierstore_fire(torch, eng, device, pick(n), row, pool)]
            res["sweep"][f"cold_{n}_{item}"] = m.summarize(t, n, row)
            _progress(f"sweep {item}: page cache "
                      f"{res['sweep'][f'pagecache_{n}_{item}']['gbps_p50']:.1f} GB/s, "
                      f"cold {res['sweep'][f'cold_{n}_{item}']['gbps_p50']:.2f} GB/s")
    finally:
        for eng in engines.values():
            eng.close()


def _baselines(args, res, torch, device, path, pool, row, n, pick, *, cold: bool) -> None:
    key = "cold" if cold else "pagecache"
    reps = 1 if cold else max(3, args.repeats // 2)
    side = torch.cuda.Stream() if device == "cuda" else None
    stage = torch.empty((n, row), dtype=torch.uint8, pin_memory=(device == "cuda"))
    t = []
    for _ in range(reps + (0 if cold else 1)):
        if cold:
            m.evict(path)
        t.append(m.python_baseline_fire(torch, path, pick(n), row, pool, stage, side))
    res["baselines"][f"python8t_{key}_{n}"] = m.summarize(t if cold else t[1:], n, row)
    if device != "cuda":
        res["baselines"]["kvikio"] = "skipped: needs a CUDA device"
        return
    os.environ.setdefault("KVIKIO_COMPAT_MODE", "ON")
    try:
        import kvikio
    except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
        res["baselines"]["kvikio"] = f"skipped: import failed ({type(exc).__name__}: {exc})"
        return
    for threads in int_list(args.kvikio_threads, "kvikio-threads"):
        try:
            m.kvikio_set_threads(kvikio, threads)
            f = kvikio.CuFile(path, "r")
            try:
                t = []
                for _ in range(reps + (0 if cold else 1)):
                    if cold:
                        m.evict(path)
                    t.append(m.kvikio_fire(kvikio, f, pick(n), row, pool))
            finally:
                f.close()
        except Exception as exc:  # noqa: BLE001 - a baseline failing must not lose the run
            res["baselines"][f"kvikio{threads}t_{key}_{n}"] = f"failed: {type(exc).__name__}: {exc}"
            continue
        res["baselines"][f"kvikio{threads}t_{key}_{n}"] = m.summarize(t if cold else t[1:], n, row)
    _progress(f"baselines ({key}) done")


def _ratios(res: dict) -> None:
    c, ts, base = res["ceilings"], res["tierstore"], res["baselines"]
    pc_ceiling = min(c["pagecache_16t_gbps"], c["h2d_gbps"]) if res["device"] == "cuda" \
        else c["pagecache_16t_gbps"]
    for key, r in ts.items():
        src = key.split("_")[0]
        ref = {"arena": c["h2d_gbps"], "pagecache": pc_ceiling, "cold": c["odirect_16t_gbps"]}[src]
        r["ceiling_gbps"] = ref
        r["ratio_to_ceiling"] = r["gbps_p50"] / ref
        if src == "cold" and r["gbps_p50"] > 1.5 * c["odirect_16t_gbps"]:
            r["note"] = "faster than the disk ceiling: the file was probably not cold"
    for src in ("pagecache", "cold"):
        kv = [v["p50_ms"] for k, v in base.items()
              if isinstance(v, dict) and k.startswith("kvikio") and f"_{src}_" in k]
        mine = [v for k, v in ts.items() if k.startswith(src) and v["rows"] == 64]
        if kv and mine:
            mine[0]["vs_kvikio_best"] = min(kv) / mine[0]["p50_ms"]
        py = [v["p50_ms"] for k, v in base.items() if k.startswith(f"python8t_{src}")]
        if py and mine:
            mine[0]["vs_python_baseline"] = py[0] / mine[0]["p50_ms"]


def report(res: dict) -> str:
    c = res["ceilings"]
    lines = [f"file {res['file']} ({res['file_bytes'] / 1e9:.2f} GB, rows of {res['row_bytes']} B), "
             f"device {res['device']}, {res['threads']} threads, O_DIRECT {res['direct_active']}",
             f"ceilings: H2D {c['h2d_gbps']:.1f} GB/s, O_DIRECT 16t {c['odirect_16t_gbps']:.2f} GB/s, "
             f"page cache 16t {c['pagecache_16t_gbps']:.1f} GB/s",
             f"{'fire':<22}{'p50 ms':>10}{'p99 ms':>10}{'GB/s':>8}{'ceiling':>9}{'ratio':>7}  notes"]
    for key, r in list(res["tierstore"].items()) + [("sweep " + k, v) for k, v in res["sweep"].items()]:
        if "ratio_to_ceiling" not in r:
            r = dict(r, ceiling_gbps=float("nan"), ratio_to_ceiling=float("nan"))
        notes = " ".join(f"{k}={r[k]:.2f}x" for k in ("vs_kvikio_best", "vs_python_baseline") if k in r)
        notes += (" " + r["note"]) if "note" in r else ""
        lines.append(f"tierstore {key:<12}{r['p50_ms']:>10.2f}{r['p99_ms']:>10.2f}{r['gbps_p50']:>8.2f}"
                     f"{r['ceiling_gbps']:>9.2f}{r['ratio_to_ceiling']:>7.2f}  {notes}")
    for key, r in res["baselines"].items():
        if isinstance(r, dict):
            lines.append(f"{key:<22}{r['p50_ms']:>10.2f}{r['p99_ms']:>10.2f}{r['gbps_p50']:>8.2f}")
        else:
            lines.append(f"{key}: {r}")
    return "\n".join(lines)


def _write_json(path: str, res: dict) -> None:
    from tierstore.files.atomic import write_atomic
    write_atomic(path, json.dumps(res, indent=1).encode())


def main(args) -> int:
    res: dict = {}
    try:
        run(args, res)
    except BaseException:
        if args.out and res:
            res["incomplete"] = True
            _write_json(args.out, res)  # keep what was measured
        raise
    if args.out:
        _write_json(args.out, res)
    print(json.dumps(res, indent=1) if args.json else report(res), file=sys.stdout)
    return 0
