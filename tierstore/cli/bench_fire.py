"""``tierstore bench fire``: fires through the store's public API against their bounds.

In one run on one pack: the ceilings (pinned H2D; in C++, N threads pread-ing the same
rows into pinned memory from the page cache and with O_DIRECT), then
``ExpertStore.fire`` + ``torch.cuda.synchronize`` of 1..512 rows from the arena, the page
cache and a cold disk with the engine alone on the same rows in the same loop, the plain
Python store and kvikio (when importable) on the same file and rows, every row
byte-checked; the pipelined 43-layer step (serial vs pipelined), the bookkeeping floors
and the ways around the copy bound. JSON and a PNG. ``--device cpu`` runs anywhere.
"""

from __future__ import annotations

import json
import os
import platform
import time

import numpy as np

from tierstore.cli import bench_fire_extra as fx
from tierstore.cli import bench_fire_measure as fm
from tierstore.cli.args import (
    check_cuda,
    int_in,
    int_list_of,
    names_of,
    non_negative_float,
    output_file,
    positive_float,
    say,
)
from tierstore.cli.bench_output import run_and_report
from tierstore.errors import ConfigError, TierstoreError

ROW_12MIB = 12_582_912
SOURCES = ("arena", "pagecache", "cold")
SKIPPABLE = ("baselines", "pipelined", "bookkeeping", "window")


def register(sub) -> None:
    p = sub.add_parser(
        "fire",
        help="Store-level fire benchmark: ceilings, baselines, pipelining",
        description=__doc__.splitlines()[0] + " Cold fires drop the pack from the "
        "page cache with POSIX_FADV_DONTNEED, plus drop_caches with --drop-caches.",
    )
    p.add_argument("--dir", required=True, help="directory of the bench pack (created once, reused)")
    p.add_argument("--layers", type=int_in(1, 4096), default=43, help="pack layers")
    p.add_argument(
        "--experts",
        type=int_in(1, 65536),
        default=12,
        help="experts per layer (layers x experts rows >= the largest fire)",
    )
    p.add_argument(
        "--row-bytes", type=int_in(8, 1 << 30), default=ROW_12MIB, help="row size in bytes (a multiple of 8)"
    )
    p.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="pool device; auto = cuda when present",
    )
    p.add_argument(
        "--sizes",
        type=int_list_of(1, 1 << 20),
        default=[1, 8, 64, 256, 512],
        help="fire sizes in rows, arena and page cache (default: 1,8,64,256,512)",
    )
    p.add_argument(
        "--cold-sizes",
        type=int_list_of(1, 1 << 20),
        default=[1, 8, 64, 512],
        help="cold fire sizes in rows (default: 1,8,64,512)",
    )
    p.add_argument(
        "--sources",
        type=names_of(SOURCES, "source"),
        default=list(SOURCES),
        help=f"fire sources, comma-separated (default: {','.join(SOURCES)})",
    )
    p.add_argument("--threads", type=int_in(1, 512), default=16, help="store engine reader threads")
    p.add_argument("--repeats", type=int_in(1, 100000), default=5, help="timed fires per size")
    p.add_argument("--h2d-gb", type=positive_float, default=2.0, help="size of the H2D ceiling copy")
    p.add_argument(
        "--baseline-rows",
        type=int_in(1, 1 << 20),
        default=64,
        help="rows of the baseline fires and of the read bounds",
    )
    p.add_argument(
        "--kvikio-threads",
        type=int_list_of(1, 1024),
        default=[16, 32],
        help="kvikio thread counts (default: 16,32)",
    )
    p.add_argument(
        "--step-misses", type=int_in(1, 1 << 16), default=2, help="pipelined step: routed misses per layer"
    )
    p.add_argument(
        "--layer-ms",
        type=non_negative_float,
        default=None,
        help="pipelined step: stand-in op per layer in ms (default: serial fire time / layers)",
    )
    p.add_argument(
        "--step-groups",
        type=int_list_of(0, 1 << 40),
        default=[0, 50331648],
        help="pipelined step: least bytes per engine submission, 0 = one per layer (default: 0,50331648)",
    )
    p.add_argument(
        "--skip",
        type=names_of(SKIPPABLE, "section"),
        default=[],
        help=f"sections to leave out, comma-separated: {','.join(SKIPPABLE)}",
    )
    p.add_argument(
        "--drop-caches",
        action="store_true",
        help="also write /proc/sys/vm/drop_caches before cold fires (root only; drops "
        "the WHOLE machine's page cache)",
    )
    p.add_argument(
        "--out", type=output_file(), help="write the JSON results here, atomically (default: none)"
    )
    p.add_argument("--png", type=output_file(), help="write the PNG plot here (default: none)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.set_defaults(func=main)


class Ctx:
    """What every measurement needs: the pack, both stores, the checker, the rows."""

    def __init__(self, torch, device, pack, res, repeats):
        self.torch, self.device, self.pack, self.res, self.repeats = torch, device, pack, res, repeats
        self.path, self.row, self.E = pack.path, int(pack.slot_bytes), int(pack.n_experts)
        self.rng = np.random.default_rng(0)
        self.store_arena = self.store_read = None
        self.check = None
        self.drop_caches = False

    def pick(self, n: int) -> np.ndarray:
        return self.rng.choice(self.pack.n_layers * self.E, size=n, replace=False).astype(np.int64)


def _progress(text: str) -> None:
    say(f"[bench fire] {text}")


def run(args, res: dict) -> dict:
    import torch

    import tierstore as ts
    from tierstore import cuda_available
    from tierstore.format.pack import Pack

    if args.device == "cuda":
        check_cuda()
    device = args.device if args.device != "auto" else ("cuda" if cuda_available() else "cpu")
    sizes, cold_sizes, sources, skip = args.sizes, args.cold_sizes, args.sources, set(args.skip)
    if args.row_bytes % 8 or args.row_bytes <= 0:
        raise ConfigError(f"--row-bytes {args.row_bytes}: expected a positive multiple of 8")
    top = max(sizes + cold_sizes)
    if args.layers * args.experts < top:
        raise ConfigError(
            f"--layers x --experts = {args.layers * args.experts} rows, the largest fire needs {top}"
        )
    pipelined = "pipelined" not in skip and args.layers >= 2
    if pipelined and args.step_misses > args.experts:
        raise ConfigError(
            f"--step-misses {args.step_misses}: the pipelined step routes that many "
            f"distinct experts per layer, more than --experts {args.experts}; lower "
            f"it or --skip pipelined"
        )
    # The pool holds the largest fire of the run: one of --sizes / --cold-sizes, or the
    # pipelined step's layers x misses rows (86 by default, more than a --sizes 1,8,64 pool).
    slots = max(top, args.layers * args.step_misses if pipelined else 0)
    t_start = time.time()
    path = fm.create_pack(args.dir, args.layers, args.experts, args.row_bytes)
    pack = Pack.open(path)
    res.update(
        {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "device": device,
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
            "pack": path,
            "row_bytes": int(pack.slot_bytes),
            "rows": pack.n_layers * pack.n_experts,
            "threads": args.threads,
            "ceilings": {},
            "fires": {},
            "baselines": {},
            "ratios": {},
            "checks": {},
        }
    )
    ctx = Ctx(torch, device, pack, res, args.repeats)
    ctx.drop_caches = bool(args.drop_caches)
    ctx.check = fm.Checker(torch, fm.row_sums(pack))
    _progress(f"pack {path} ready ({time.time() - t_start:.1f} s)")
    ceil = res["ceilings"]
    ceil["h2d_gbps"] = fm.m.ceiling_h2d(torch, device, int(args.h2d_gb * (1 << 30)))
    ceil.update(fm.read_bounds(ctx, min(args.baseline_rows, top), args.threads))
    _progress(f"ceilings {ceil}")
    opts = dict(device=device, lazy_per_step=0, threads=args.threads, max_promote=slots)
    # Every row fits: loading one fire's rows must not evict others of the same fire.
    arena_gb = (res["rows"] + 2) * pack.stride / 2**30
    ctx.store_arena = ts.ExpertStore(pack, vram_slots=slots, ram_gb=arena_gb, **opts)
    ctx.store_read = ts.ExpertStore(pack, vram_slots=slots, ram_gb=0, **opts)
    try:
        for src in sources:
            if src == "pagecache":
                fm.m.warm(path, os.path.getsize(path))
            out = res["fires"].setdefault(src, {})
            for n in cold_sizes if src == "cold" else sizes:
                reps = (
                    1
                    if (src == "cold" and n * ctx.row > 2e9)
                    else (min(3, args.repeats) if src == "cold" else args.repeats)
                )
                out[str(n)] = fm.run_source(ctx, src, n, reps)
                _progress(
                    f"{src} {n}: store {out[str(n)]['store']['p50_ms']:.2f} ms, "
                    f"engine {out[str(n)]['engine']['p50_ms']:.2f} ms"
                )
            if src != "arena" and "baselines" not in skip:
                if src == "pagecache":
                    fm.m.warm(path, os.path.getsize(path))
                nb = min(args.baseline_rows, top)
                res["baselines"][src] = fm.run_baselines(ctx, src, nb, args.kvikio_threads)
                _progress(f"baselines {src} done")
        if pipelined:
            fm.m.warm(path, os.path.getsize(path))
            groups = args.step_groups
            res["pipelined"] = fx.pipelined_step(
                ctx, args.step_misses, args.repeats, args.layer_ms, groups or [0]
            )
            _progress(f"pipelined {res['pipelined']}")
        if "window" not in skip:
            res["io_uring"] = fx.io_uring_probe()
            if device == "cuda":
                fm.m.warm(path, os.path.getsize(path))
                try:
                    res["window"] = fx.registered_window(ctx, min(args.baseline_rows, top), args.repeats)
                except Exception as exc:  # noqa: BLE001 - an experiment must not lose the run
                    res["window"] = f"failed: {type(exc).__name__}: {exc}"
        res["engine_stats"] = {
            k: v for k, v in ctx.store_read.engine.stats().items() if k in ("pagecache", "disk", "arena")
        }
    finally:
        for s in (ctx.store_arena, ctx.store_read):
            if s is not None:
                s.close()
    if "bookkeeping" not in skip:
        res["bookkeeping"] = fx.bookkeeping(device, args.dir)
    res["checks"] = {"rows_checked": ctx.check.rows, "mismatches": ctx.check.bad}
    _ratios(res)
    res["seconds"] = time.time() - t_start
    return res


def _ratios(res: dict) -> None:
    c, r = res["ceilings"], res["ratios"]
    cuda = res["device"] == "cuda"
    r["arena_ceiling_gbps"] = c["h2d_gbps"]
    r["pagecache_ceiling_gbps"] = min(c["h2d_gbps"], c["pagecache_gbps"]) if cuda else c["pagecache_gbps"]
    r["cold_ceiling_gbps"] = c.get("odirect_gbps")
    for src, by_n in res["fires"].items():
        bound = r.get(f"{src}_ceiling_gbps")
        for v in by_n.values():
            st, en = v["store"], v["engine"]
            v["store_vs_engine"] = en["p50_ms"] / st["p50_ms"]
            if bound:
                v["store_vs_bound"] = st["gbps_p50"] / bound
    for src, base in res["baselines"].items():
        kv = [v["p50_ms"] for k, v in base.items() if k.startswith("kvikio") and isinstance(v, dict)]
        n = str(base["python8t"]["rows"])
        mine = res["fires"].get(src, {}).get(n)
        if mine:
            if kv:
                mine["vs_kvikio_best"] = min(kv) / mine["store"]["p50_ms"]
            mine["vs_plain_python"] = base["python8t"]["p50_ms"] / mine["store"]["p50_ms"]


def report(res: dict) -> str:
    c = res["ceilings"]
    od = c.get("odirect_gbps")
    lines = [
        f"{res['date']} {res['host']} device {res['device']} {res.get('gpu') or ''}, "
        f"rows of {res['row_bytes']} B, {res['threads']} threads",
        f"ceilings: H2D {c['h2d_gbps']:.1f} GB/s; C++ {c['threads']}-thread page cache -> pinned "
        f"{c['pagecache_gbps']:.1f} GB/s; O_DIRECT {od if od is None else round(od, 2)} GB/s",
        f"{'fire':<16}{'store ms':>10}{'engine ms':>10}{'GB/s':>8}{'/bound':>7}{'/engine':>8}  notes",
    ]
    for src, by_n in res["fires"].items():
        for n, v in sorted(by_n.items(), key=lambda kv: int(kv[0])):
            st = v["store"]
            notes = " ".join(f"{k}={v[k]:.2f}x" for k in ("vs_kvikio_best", "vs_plain_python") if k in v)
            lines.append(
                f"{src + ' ' + n:<16}{st['p50_ms']:>10.3f}{v['engine']['p50_ms']:>10.3f}"
                f"{st['gbps_p50']:>8.2f}{v.get('store_vs_bound', float('nan')):>7.2f}"
                f"{v['store_vs_engine']:>8.2f}  {notes}"
            )
    for src, base in res["baselines"].items():
        for k, v in base.items():
            lines.append(
                f"  {src} {k}: "
                + (f"{v['p50_ms']:.2f} ms ({v['gbps_p50']:.2f} GB/s)" if isinstance(v, dict) else v)
            )
    if "pipelined" in res:
        p = res["pipelined"]
        lines.append(
            f"pipelined step ({p['layers']} layers x {p['misses_per_layer']} misses, "
            f"op {p['layer_ms']:.3f} ms/layer): serial {p['serial_ms']:.2f} ms, "
            f"pipelined {p['pipelined_ms']:.2f} ms ({p['saved_share'] * 100:.0f}% less; "
            f"by group bytes {json.dumps(p['by_group_bytes'])})"
        )
    if "bookkeeping" in res:
        lines.append(
            "bookkeeping (median, min us): "
            + ", ".join(f"{k} {v[0]:.1f}/{v[1]:.1f}" for k, v in res["bookkeeping"].items())
        )
    if "window" in res:
        lines.append(f"window: {json.dumps(res['window'])[:600]}")
    if "io_uring" in res:
        lines.append(f"io_uring: {res['io_uring']}")
    ch = res["checks"]
    lines.append(
        f"byte checks: {ch['rows_checked']} rows, {'all equal' if not ch['mismatches'] else ch['mismatches']}"
    )
    return "\n".join(lines)


def main(args) -> int:
    res = run_and_report(args, run, report, fx.plot)
    bad = res["checks"]["mismatches"]
    if bad:
        # Every read already passed the store's own xxh3 check: a byte check failing here
        # is a copy to the wrong slot, not a disk fault, so no errno is claimed.
        raise TierstoreError(f"{res['pack']}: bench fire: {len(bad)} byte check(s) failed, first: {bad[0]}")
    return 0
