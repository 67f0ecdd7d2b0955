"""``tierstore bench io``: promote bandwidth and fire latency of the I/O engine.

In one run on one file: the ceilings (pinned H2D of one large buffer, O_DIRECT read at
16 threads, page-cache read at 16 threads), the plain Python baseline, kvikio (POSIX
compat mode, when importable and on CUDA) and tierstore fires of 1/8/64/512 rows from
the arena, the page cache and a cold disk, each with its ratio to its ceiling.
On ``--device cpu`` the pool is host memory (copies are memcpy) so it runs anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import numpy as np

from tierstore.cli import bench_io_measure as m
from tierstore.cli.args import (
    check_cuda,
    float_in,
    int_in,
    int_list_of,
    names_of,
    non_negative_float,
    output_file,
    positive_float,
    say,
)
from tierstore.errors import ConfigError

ROW_12MIB = 12_582_912


def register(sub) -> None:
    p = sub.add_parser(
        "io",
        help="Promote I/O benchmark: ceilings, baselines, tierstore fires",
        description=__doc__.splitlines()[0] + " The page cache is dropped for "
        "cold fires with POSIX_FADV_DONTNEED on the file only, unless "
        "--drop-caches is given.",
    )
    p.add_argument(
        "--pack", required=True, help="pack file, or any file of rows (with --create-gb: created if missing)"
    )
    p.add_argument(
        "--create-gb",
        type=non_negative_float,
        default=0.0,
        help="create PATH with this many GB of random rows when it does not exist",
    )
    p.add_argument(
        "--row-bytes",
        type=int_in(1, 1 << 30),
        default=ROW_12MIB,
        help="row size (raw files; a pack's own slot size wins)",
    )
    p.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="pool device; auto = cuda when present",
    )
    p.add_argument(
        "--fires",
        type=int_list_of(1, 1 << 20),
        default=[1, 8, 64, 512],
        help="fire sizes in rows (default: 1,8,64,512)",
    )
    p.add_argument(
        "--sources",
        type=names_of(SOURCES, "source"),
        default=list(SOURCES),
        help=f"fire sources, comma-separated (default: {','.join(SOURCES)})",
    )
    p.add_argument("--threads", type=int_in(1, 1024), default=16, help="engine reader threads")
    p.add_argument(
        "--chunk-mib", type=float_in(0.0, 1024.0, lo_open=True), default=4.0, help="engine read chunk in MiB"
    )
    p.add_argument("--stage-count", type=int_in(1, 4096), default=16, help="engine stage buffers")
    p.add_argument("--repeats", type=int_in(1, 100000), default=10, help="warm fires per size")
    p.add_argument("--cold-repeats", type=int_in(1, 10000), default=3, help="cold fires per size")
    p.add_argument("--ceiling-gb", type=positive_float, default=2.0, help="bytes read for the read ceilings")
    p.add_argument("--h2d-gb", type=positive_float, default=2.0, help="size of the H2D ceiling copy")
    p.add_argument(
        "--kvikio-threads",
        type=int_list_of(1, 1024),
        default=[1, 8, 16, 32],
        help="kvikio thread counts to try (default: 1,8,16,32)",
    )
    p.add_argument("--no-baselines", action="store_true", help="skip Python baseline and kvikio")
    p.add_argument(
        "--drop-caches",
        action="store_true",
        help="also write /proc/sys/vm/drop_caches before cold fires (root only; drops "
        "the WHOLE machine's page cache, not just this file's)",
    )
    p.add_argument(
        "--sweep",
        type=sweep_spec,
        default=[],
        metavar="THREADS:CHUNK_MIB[:noramp],...",
        help="also time 64-row page-cache and cold fires for these engine settings "
        "(':noramp': chunk_ramp=False; default: none)",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument(
        "--out",
        type=output_file("JSON file"),
        help="also write the JSON results to this file (atomically; default: none)",
    )
    p.set_defaults(func=main)


SOURCES = ("arena", "pagecache", "cold")


def sweep_spec(text: str) -> list[tuple[str, int, float, bool]]:
    """``16:4,8:1:noramp`` -> [(item, threads, chunk_mib, ramp), ...]."""
    out = []
    for item in (x.strip() for x in str(text).split(",")):
        if not item:
            continue
        parts = item.split(":")
        try:
            threads, chunk = int(parts[0], 10), float(parts[1])
            flags = parts[2:]
            ok = 1 <= threads <= 1024 and 0 < chunk <= 1024 and set(flags) <= {"noramp"}
        except (ValueError, IndexError):
            ok = False
        if not ok:
            raise argparse.ArgumentTypeError(
                f"item {item!r}: expected THREADS:CHUNK_MIB[:noramp] with THREADS in [1, 1024] "
                "and 0 < CHUNK_MIB <= 1024, e.g. 16:4,8:1:noramp"
            )
        out.append((item, threads, chunk, "noramp" not in flags))
    if not out:
        raise argparse.ArgumentTypeError(f"expected THREADS:CHUNK_MIB[:noramp],..., found {text!r}")
    return out


def _is_pack(path: str) -> bool:
    from tierstore.format.sidecar import sidecar_path_of

    try:
        return path.endswith(".pack") or os.path.exists(sidecar_path_of(path))
    except Exception:  # noqa: BLE001 - a name the pack module cannot map is no pack
        return False


def _file_rows(path: str, row_bytes: int) -> tuple[str, np.ndarray, int]:
    """The file to read, its row offsets and row size: a pack's written rows (a broken
    pack is an error, never benchmarked as a raw file; a sidecar given means its .pack),
    else consecutive 4 KiB-aligned rows of a raw file."""
    if _is_pack(path):
        from tierstore.format.pack import Pack

        with Pack.open(path) as pack:
            ids = [l * pack.n_experts + e for l in pack.layers for e in range(pack.n_experts)]
            return (pack.path, np.asarray(pack.row_offsets(np.asarray(ids)), np.int64), int(pack.slot_bytes))
    stride = (row_bytes + m.PAGE - 1) // m.PAGE * m.PAGE
    n = os.path.getsize(path) // stride
    return path, np.arange(n, dtype=np.int64) * stride, row_bytes


def check_args(args) -> None:
    """Everything checkable before a byte is read or written."""
    path = args.pack
    if os.path.exists(path):
        if not os.path.isfile(path):
            raise ConfigError(f"--pack {path}: not a regular file")
        if not os.access(path, os.R_OK):
            raise ConfigError(f"--pack {path}: not readable")
    elif args.create_gb <= 0:
        raise ConfigError(f"--pack {path}: no such file; give --create-gb N to create one")
    else:
        try:
            output_file("file of rows")(path)
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"--pack {exc}") from None
        need = int(args.create_gb * 1e9)
        free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
        if need > free:
            raise ConfigError(
                f"--create-gb {args.create_gb:g}: {path}'s directory has {free / 1e9:.2f} GB free"
            )
    if args.device == "cuda":
        check_cuda("--device")


def _progress(text: str) -> None:
    say(f"[bench io] {text}")


def run(args, res: dict | None = None) -> dict:
    """Fill `res` (a fresh dict when None) step by step, so a failure keeps what was measured."""
    import torch

    from tierstore import cuda_available
    from tierstore.io.engine import Engine

    path = args.pack
    check_args(args)
    if not os.path.exists(path):
        _progress(f"creating {path}: {args.create_gb:g} GB of random rows")
        m.create_file(path, int(args.create_gb * 1e9), progress=_progress)
    device = args.device if args.device != "auto" else ("cuda" if cuda_available() else "cpu")
    fires, sources = args.fires, args.sources
    if args.drop_caches:
        _progress("--drop-caches: cold fires write /proc/sys/vm/drop_caches (the whole machine's page cache)")
    path, offsets, row = _file_rows(path, args.row_bytes)
    if len(offsets) < max(fires):
        raise ConfigError(f"{path}: {len(offsets)} rows of {row} B, the largest fire needs {max(fires)}")
    file_bytes = int(offsets[-1]) + row
    rng = np.random.default_rng(0)
    res = {} if res is None else res
    res.update(
        {
            "file": path,
            "file_bytes": file_bytes,
            "row_bytes": row,
            "device": device,
            "threads": args.threads,
            "ceilings": {},
            "tierstore": {},
            "baselines": {},
            "sweep": {},
        }
    )
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
    engine = Engine(
        path,
        threads=args.threads,
        direct="auto",
        device=device,
        chunk_bytes=max(m.PAGE, int(args.chunk_mib * (1 << 20)) // m.PAGE * m.PAGE),
        stage_bytes=(row + m.PAGE - 1) // m.PAGE * m.PAGE,
        stage_count=args.stage_count,
    )
    engine.register_buffer(pool)  # submit accepts registered memory only
    res["direct_active"] = engine.direct_active
    pick = lambda n: np.sort(rng.choice(offsets, size=n, replace=False))  # noqa: E731
    ts = res["tierstore"]
    try:
        # 2. tierstore from the arena and the page cache (file still warm).
        if "arena" in sources:
            arena = engine.alloc_host(top * row).view(top, row)
            arena.fill_(3)
            for n in fires:
                t = [
                    m.tierstore_fire(torch, engine, device, pick(n), row, pool, arena[:n])
                    for _ in range(args.repeats)
                ]
                ts[f"arena_{n}"] = m.summarize(t[1:] or t, n, row)
            del arena
            _progress("arena fires done")
        if "pagecache" in sources:
            m.warm(path, file_bytes)
            for n in fires:
                t = [m.tierstore_fire(torch, engine, device, pick(n), row, pool) for _ in range(args.repeats)]
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
                    res["evict"] = m.evict(path, args.drop_caches)
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

    engines = {}
    try:
        for item, threads, chunk_mib, ramp in args.sweep:
            engines[item] = Engine(
                path,
                threads=threads,
                direct="auto",
                device=device,
                chunk_bytes=max(m.PAGE, int(chunk_mib * (1 << 20)) // m.PAGE * m.PAGE),
                stage_bytes=(row + m.PAGE - 1) // m.PAGE * m.PAGE,
                stage_count=args.stage_count,
                chunk_ramp=ramp,
            )
            engines[item].register_buffer(pool)
        m.warm(path, file_bytes)
        for item, eng in engines.items():
            t = [m.tierstore_fire(torch, eng, device, pick(n), row, pool) for _ in range(6)]
            res["sweep"][f"pagecache_{n}_{item}"] = m.summarize(t[1:], n, row)
        for item, eng in engines.items():
            m.evict(path, args.drop_caches)
            t = [m.tierstore_fire(torch, eng, device, pick(n), row, pool)]
            res["sweep"][f"cold_{n}_{item}"] = m.summarize(t, n, row)
            _progress(
                f"sweep {item}: page cache "
                f"{res['sweep'][f'pagecache_{n}_{item}']['gbps_p50']:.1f} GB/s, "
                f"cold {res['sweep'][f'cold_{n}_{item}']['gbps_p50']:.2f} GB/s"
            )
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
            m.evict(path, args.drop_caches)
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
    for threads in args.kvikio_threads:
        try:
            m.kvikio_set_threads(kvikio, threads)
            f = kvikio.CuFile(path, "r")
            try:
                t = []
                for _ in range(reps + (0 if cold else 1)):
                    if cold:
                        m.evict(path, args.drop_caches)
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
    pc_ceiling = (
        min(c["pagecache_16t_gbps"], c["h2d_gbps"]) if res["device"] == "cuda" else c["pagecache_16t_gbps"]
    )
    for key, r in ts.items():
        src = key.split("_")[0]
        ref = {"arena": c["h2d_gbps"], "pagecache": pc_ceiling, "cold": c["odirect_16t_gbps"]}[src]
        r["ceiling_gbps"] = ref
        r["ratio_to_ceiling"] = r["gbps_p50"] / ref
        if src == "cold" and r["gbps_p50"] > 1.5 * c["odirect_16t_gbps"]:
            r["note"] = "faster than the disk ceiling: the file was probably not cold"
    for src in ("pagecache", "cold"):
        kv = [
            v["p50_ms"]
            for k, v in base.items()
            if isinstance(v, dict) and k.startswith("kvikio") and f"_{src}_" in k
        ]
        mine = [v for k, v in ts.items() if k.startswith(src) and v["rows"] == 64]
        if kv and mine:
            mine[0]["vs_kvikio_best"] = min(kv) / mine[0]["p50_ms"]
        py = [v["p50_ms"] for k, v in base.items() if k.startswith(f"python8t_{src}")]
        if py and mine:
            mine[0]["vs_python_baseline"] = py[0] / mine[0]["p50_ms"]


def report(res: dict) -> str:
    c = res["ceilings"]
    lines = [
        f"file {res['file']} ({res['file_bytes'] / 1e9:.2f} GB, rows of {res['row_bytes']} B), "
        f"device {res['device']}, {res['threads']} threads, O_DIRECT {res['direct_active']}",
        f"ceilings: H2D {c['h2d_gbps']:.1f} GB/s, O_DIRECT 16t {c['odirect_16t_gbps']:.2f} GB/s, "
        f"page cache 16t {c['pagecache_16t_gbps']:.1f} GB/s",
        f"{'fire':<22}{'p50 ms':>10}{'p99 ms':>10}{'GB/s':>8}{'ceiling':>9}{'ratio':>7}  notes",
    ]
    for key, r in list(res["tierstore"].items()) + [("sweep " + k, v) for k, v in res["sweep"].items()]:
        if "ratio_to_ceiling" not in r:
            r = dict(r, ceiling_gbps=float("nan"), ratio_to_ceiling=float("nan"))
        notes = " ".join(f"{k}={r[k]:.2f}x" for k in ("vs_kvikio_best", "vs_python_baseline") if k in r)
        notes += (" " + r["note"]) if "note" in r else ""
        lines.append(
            f"tierstore {key:<12}{r['p50_ms']:>10.2f}{r['p99_ms']:>10.2f}{r['gbps_p50']:>8.2f}"
            f"{r['ceiling_gbps']:>9.2f}{r['ratio_to_ceiling']:>7.2f}  {notes}"
        )
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
    except Exception:  # not on Ctrl-C / SIGTERM: an interrupted run writes nothing
        if args.out and res:
            res["incomplete"] = True
            _write_json(args.out, res)  # keep what was measured
        raise
    if args.out:
        _write_json(args.out, res)
    print(json.dumps(res, indent=1) if args.json else report(res), file=sys.stdout)
    return 0
