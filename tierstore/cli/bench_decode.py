"""``tierstore bench decode``: tokens per second of the decode loop at a model's geometry.

The decode loop of tierstore/cli/bench_decode_loop.py (attention stand-in, residency, MoE
kernel, gate, re-run of a fired step) over a routing replayed from a trace (``--trace``,
the capture format) or the synthetic router, at pools of 100 / 50 / 20 / 10 % of the
experts, with every expert the run routes in the pinned arena (``--arena``: a share of the
experts, the trace's hottest first; a routed key left out is counted ``no_arena`` and served
from the base tier). Each pool is run by the device-side residency and by two baselines on
the same routing, pool and CLOCK rule (host-planned per layer; a static hot set with the
rest streamed by SMs over UVA); beside them the all-resident upper bound and the I/O bound
of the same misses (their bytes over the pinned host -> GPU copy bandwidth measured in the
same run), and an all-miss run (a cyclic routing: every expert misses). Every pool row a
run leaves is byte-checked against the arena. JSON, a PNG, a table.
``--device cpu`` runs the same loop on a CPU pool (small geometries: CI's check).
"""

from __future__ import annotations

import io
import json
import math
import os
import platform
import time

import numpy as np

from tierstore.cli import bench_decode_loop as dl
from tierstore.cli.args import (
    check_cuda,
    existing_file,
    existing_path,
    float_in,
    int_in,
    int_list_of,
    names_of,
    non_negative_float,
    output_file,
    say,
)
from tierstore.cli.bench_output import run_and_report
from tierstore.errors import ConfigError, TierstoreError

MODES = ("device", "host_planned", "uva_static", "device_hits_first")
DEFAULT_MODES = ("device", "host_planned", "uva_static")
SKIPPABLE = ("all_resident", "all_miss", "ceilings")
GOAL_MISS_RATES = (0.10, 0.20)


def register(sub) -> None:
    p = sub.add_parser(
        "decode",
        help="Decode tokens/s: device-side residency vs baselines and bounds",
        description=__doc__.splitlines()[0],
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--dir", help="directory of the bench pack (created once, reused)")
    src.add_argument(
        "--pack",
        type=existing_path("pack"),
        help="an fp4 pack with a row layout (H, I) to use instead of the bench pack",
    )
    p.add_argument("--layers", type=int_in(1, 4096), default=43, help="MoE layers (bench pack)")
    p.add_argument("--experts", type=int_in(1, 4096), default=256, help="experts per layer (bench pack)")
    p.add_argument(
        "--hidden",
        type=int_in(32, 1 << 16),
        default=4096,
        help="hidden size H of an expert (a multiple of 32; bench pack)",
    )
    p.add_argument(
        "--inter",
        type=int_in(32, 1 << 16),
        default=2048,
        help="intermediate size I of an expert (a multiple of 32; bench pack)",
    )
    p.add_argument("--top-k", type=int_in(1, 64), default=6, help="routed experts per token")
    p.add_argument("--batch", type=int_in(1, 16), default=1, help="decode batch (tokens per step)")
    p.add_argument(
        "--trace",
        type=existing_file("routing trace"),
        help="replay this capture-format trace (.npy) (default: --router)",
    )
    p.add_argument(
        "--router",
        choices=["synthetic", "cyclic"],
        default="synthetic",
        help="routing without --trace: the synthetic router, or cyclic (every expert misses)",
    )
    p.add_argument("--seed", type=int_in(0), default=0, help="synthetic router and gate seed")
    p.add_argument("--steps", type=int_in(1, 1 << 20), default=64, help="timed decode steps per run")
    p.add_argument("--warmup", type=int_in(0, 1 << 20), default=16, help="untimed steps before them")
    p.add_argument(
        "--pools",
        type=int_list_of(1, 100),
        default=[100, 50, 20, 10],
        help="pool sizes, percent of the experts",
    )
    p.add_argument(
        "--arena",
        type=float_in(0.0, 100.0, lo_open=True),
        default=100.0,
        help="arena size, percent of the experts (hottest first)",
    )
    p.add_argument(
        "--attn-us",
        type=non_negative_float,
        default=50.0,
        help="attention stand-in per layer, microseconds of GPU time",
    )
    p.add_argument(
        "--gate-rate",
        type=float_in(0.0, 1.0),
        default=0.0,
        help="share of steps the replayed gate fires (each fired step runs again)",
    )
    p.add_argument(
        "--modes",
        type=names_of(MODES, "mode"),
        default=list(DEFAULT_MODES),
        help=f"residency modes, comma-separated: {','.join(MODES)}",
    )
    p.add_argument(
        "--skip",
        type=names_of(SKIPPABLE, "section"),
        default=[],
        help=f"sections to leave out: {','.join(SKIPPABLE)}",
    )
    p.add_argument(
        "--fold-every",
        type=int_in(0),
        default=32,
        help="steps between heat folds (device counts -> the store's policies; 0 = never)",
    )
    p.add_argument(
        "--gather-blocks",
        type=int_in(0, 1 << 16),
        default=0,
        help="page-in blocks; 0 = the fastest of a few, measured first",
    )
    p.add_argument("--threads", type=int_in(1, 512), default=16, help="store engine reader threads")
    p.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="pool device; auto = cuda when present",
    )
    p.add_argument(
        "--out", type=output_file(), help="write the JSON results here, atomically (default: none)"
    )
    p.add_argument("--png", type=output_file(), help="write the PNG plot here, atomically (default: none)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.set_defaults(func=main)


def _progress(text: str) -> None:
    say(f"[bench decode] {text}")


class Ctx:
    """Everything a run needs: torch, the store, the decoder, the routing, the checker."""

    def __init__(self, torch, args, store, dec, routing, fires, sums):
        self.torch, self.args, self.store, self.dec = torch, args, store, dec
        self.routing, self.fires, self.sums = routing, fires, sums
        self.cuda = dec.cuda
        self.P = dec.T * dec.k
        self.gather = {"gather_blocks": args.gather_blocks, "chunk_bytes": None}
        self.keys = dl.routed_keys(routing, dec.E)  # the distinct keys the routing routes
        self.rows_checked, self.mismatches = 0, []


# -- setup ------------------------------------------------------------------------------------
def _geometry(args, pack, trace) -> tuple[int, int, int, int]:
    from tierstore.format.layouts import expert_shape_of, row_bytes

    L, E = int(pack.n_layers), int(pack.n_experts)
    H, I = expert_shape_of(pack) if args.pack else (args.hidden, args.inter)
    if trace is not None and (trace.n_layers != L or trace.n_experts != E):
        raise ConfigError(
            f"{args.trace}: {trace.n_layers} layers x {trace.n_experts} experts, the "
            f"pack {pack.path} has {L} x {E}"
        )
    if row_bytes("fp4", H, I) > pack.slot_bytes:
        raise ConfigError(
            f"{pack.path}: rows of {pack.slot_bytes} bytes are shorter than an fp4 expert of H={H}, I={I}"
        )
    if args.top_k > E:
        raise ConfigError(f"--top-k {args.top_k}: more than the {E} experts per layer")
    return L, E, H, I


def _routing(args, L, E, n_total, trace) -> tuple[np.ndarray, dict]:
    T, k = args.batch, args.top_k
    if trace is not None:
        routing, skipped = dl.trace_routing(trace, n_total, T, k)
        return routing, {"source": f"trace {args.trace}", "ticks_skipped": skipped}
    if args.router == "cyclic":
        return dl.cyclic_routing(n_total, L, E, k, T), {"source": "cyclic"}
    return dl.synthetic_routing(n_total, L, E, k, T, args.seed), {"source": "synthetic", "seed": args.seed}


def _arena_sums(torch, store) -> np.ndarray:
    """int64 [n_keys]: wrapping sums of each arena row's 64-bit words (the byte check's
    reference; rows were checksum-verified when read); keys not in the arena: 0."""
    arena = store._arena
    sums = np.zeros(store._L * store._E, dtype=np.int64)
    held = np.flatnonzero(arena.owner >= 0)
    if not len(held) or store.slot_bytes % 8 or arena.stride % 8:
        return sums
    words = arena.rows.view(torch.int64)[:, : store.slot_bytes // 8]  # a view: no copy
    for a in range(0, len(held), 64):
        part = torch.as_tensor(held[a : a + 64])
        sums[arena.owner[held[a : a + 64]]] = words[part].sum(dim=1).numpy()
    return sums


def _check_rows(ctx, owner: np.ndarray, what: str) -> None:
    """Every slot a run left owned holds its key's arena bytes (sums of 64-bit words)."""
    torch, store = ctx.torch, ctx.store
    slots = np.flatnonzero(owner >= 0)
    if not len(slots) or store.slot_bytes % 8:
        return
    from tierstore.cli.bench_fire_measure import device_sums

    got = np.zeros(len(slots), dtype=np.int64)
    for a in range(0, len(slots), 64):
        idx = torch.as_tensor(slots[a : a + 64], device=store.pool.device)
        got[a : a + 64] = device_sums(torch, store.pool[idx])
    want = ctx.sums[owner[slots]]
    ctx.rows_checked += len(slots)
    bad = np.flatnonzero(got != want)
    if len(bad):
        ctx.mismatches.append(
            f"{what}: {len(bad)} of {len(slots)} slots differ from the arena "
            f"(first: slot {slots[bad[0]]}, key {owner[slots[bad[0]]]})"
        )


# -- one run ---------------------------------------------------------------------------------------
def _timed(ctx, step_fn, counters, fold) -> dict:
    args, dec = ctx.args, ctx.dec
    torch = ctx.torch
    before = counters()
    dl.run_steps(torch, dec, step_fn, 0, args.warmup, ctx.fires, fold, args.fold_every)
    mid = counters()
    secs, reruns = dl.run_steps(
        torch, dec, step_fn, args.warmup, args.steps, ctx.fires, fold, args.fold_every
    )
    after = counters()
    out = {
        "seconds": secs,
        "reruns": reruns,
        "tok_s": dec.T * args.steps / secs,
        "ms_per_step": secs / args.steps * 1e3,
        "counters_run": dl.counter_delta(after, before),
        "counters_timed": dl.counter_delta(after, mid),
    }
    c = out["counters_timed"]
    seen = c["hits"] + c["misses"]
    out["miss_rate"] = c["misses"] / seen if seen else 0.0
    out["bytes_per_token"] = c["bytes"] / (dec.T * args.steps)
    return out


def run_residency(ctx, mode: str, slots: int) -> dict:
    """One run of ``device``, ``device_hits_first``, ``uva_static`` or ``all_resident``."""
    torch, store, dec = ctx.torch, ctx.store, ctx.dec
    kw = dict(
        max_ids=ctx.P,
        slots=slots,
        gather_blocks=ctx.gather["gather_blocks"],
        chunk_bytes=ctx.gather["chunk_bytes"],
    )
    with dl.attached(store, **kw) as res:
        info = {"slots": slots, "warm": False}
        if mode.startswith("device") and slots >= len(ctx.keys):  # every key fits: warm pool
            _preload(torch, res.page_in, ctx.keys, dec.E, res.max_ids, res.state.device)
            info["warm"] = True
        if mode in ("uva_static", "all_resident"):
            scratch = 0 if mode == "all_resident" else min(ctx.P, slots)
            hot = dl.hottest_keys(ctx.routing, dec.E, slots - scratch)
            _preload(torch, res.page_in, hot, dec.E, res.max_ids, res.state.device)
            if mode == "uva_static":
                info["static_keys"] = int(
                    res.lock_keys(np.stack([hot // dec.E, hot % dec.E], 1)) if len(hot) else 0
                )
                info["scratch_slots"] = scratch
        if mode == "all_resident":
            body = lambda: dl.resident_step(dec)  # noqa: E731
        elif mode == "device_hits_first":
            body = dl.HitsFirst(dec, res).step
        else:
            body = lambda: dl.residency_step(dec, res)  # noqa: E731
        step_fn = dl.capture(torch, body).replay if ctx.cuda else body

        def fold():
            res.fold_heat()
            store.step()

        info.update(_timed(ctx, step_fn, res.counters, fold))
        res.check()
        _check_rows(ctx, res.state.owner.cpu().numpy()[:slots].astype(np.int64), f"{mode}@{slots}")
    return info


def _preload(torch, page_in, keys: np.ndarray, E: int, max_ids: int, device) -> None:
    """Page ``keys`` in through ``page_in``, layer by layer (setup, untimed)."""
    for layer in np.unique(keys // E):
        ids = torch.as_tensor((keys[keys // E == layer] % E).astype(np.int32), device=device)
        for a in range(0, len(ids), max_ids):
            page_in(int(layer), ids[a : a + max_ids])


def run_host_planned(ctx, slots: int) -> dict:
    torch, store, dec = ctx.torch, ctx.store, ctx.dec
    with dl.attached(store, max_ids=ctx.P, slots=slots) as _res:  # the store keeps off the pool
        hp = dl.HostPlanned(torch, store, slots, ctx.P)
        step_fn = dl.host_planned_runner(torch, dec, hp)
        warm = slots >= len(ctx.keys)
        if warm:  # as the device run: every routed key fits, the pool starts warm
            _preload(torch, hp.page_in, ctx.keys, dec.E, hp.max_ids, store.pool.device)

        def fold():
            heat = hp.state.heat
            counts = heat.numpy().astype(np.int64)
            heat.zero_()
            if counts.any():
                store.record_counts(counts)
            store.step()

        info = {"slots": slots, "warm": warm}
        info.update(_timed(ctx, step_fn, hp.state.counters, fold))
        _check_rows(ctx, hp.state.owner.numpy()[:slots].astype(np.int64), f"host_planned@{slots}")
    return info


def _gather_ceiling(ctx, slots: int, h2d: float) -> dict:
    """GB/s of the page-in alone (decide + SM gather of one layer's every expert from the
    arena), for a few grid and chunk sizes; the fastest is used for the run."""
    torch, store, dec = ctx.torch, ctx.store, ctx.dec
    n_sm = torch.cuda.get_device_properties(store.pool.device).multi_processor_count
    n = min(dec.E, slots)
    ids = torch.arange(n, dtype=torch.int32, device=store.pool.device)
    variants = {}
    for blocks in (n_sm, 2 * n_sm, 4 * n_sm):
        for chunk in (64 << 10, 256 << 10, 1 << 20):
            with dl.attached(
                store, max_ids=max(ctx.P, n), slots=slots, gather_blocks=blocks, chunk_bytes=chunk
            ) as res:
                best = math.inf
                for layer in range(min(3, dec.L)):
                    res.reset()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    res.page_in(layer, ids)
                    end.record()
                    end.synchronize()
                    best = min(best, start.elapsed_time(end) / 1e3)
                    _check_rows(
                        ctx,
                        res.state.owner.cpu().numpy()[:slots].astype(np.int64),
                        f"gather ceiling {blocks}x{chunk}",
                    )
                variants[f"{blocks}x{chunk >> 10}KiB"] = n * store.slot_bytes / best / 1e9
    name = max(variants, key=variants.get)
    blocks, chunk = name.split("x")
    ctx.gather = {"gather_blocks": int(blocks), "chunk_bytes": int(chunk[:-3]) << 10}
    return {
        "gather_gbps": variants[name],
        "gather_best": name,
        "gather_variants": variants,
        "gather_rows": n,
        "gather_vs_h2d": variants[name] / h2d,
    }


# -- the whole run ------------------------------------------------------------------------------------
def run(args, res: dict) -> dict:
    import torch

    import tierstore as ts
    from tierstore import cuda_available
    from tierstore.format.pack import Pack
    from tierstore.sim.traces import load_trace

    if args.device == "cuda":
        check_cuda()
    if args.hidden % 32 or args.inter % 32:
        raise ConfigError(f"--hidden {args.hidden} / --inter {args.inter}: both must be multiples of 32")
    device = args.device if args.device != "auto" else ("cuda" if cuda_available() else "cpu")
    t_start = time.time()
    trace = load_trace(args.trace) if args.trace else None
    if args.pack:
        pack = Pack.open(args.pack)
    else:
        L0, E0 = (trace.n_layers, trace.n_experts) if trace is not None else (args.layers, args.experts)
        pack = Pack.open(dl.create_decode_pack(args.dir, L0, E0, args.hidden, args.inter))
    L, E, H, I = _geometry(args, pack, trace)
    n_keys, T, k = L * E, args.batch, args.top_k
    n_total = args.warmup + args.steps
    routing, rmeta = _routing(args, L, E, n_total, trace)
    P = T * k
    pool_slots = {pct: min(n_keys, max(P, math.ceil(pct / 100 * n_keys))) for pct in args.pools}
    distinct = dl.distinct_per_decide(routing, E)
    routed_keys = len(dl.routed_keys(routing, E))
    top_slots = max(max(pool_slots.values()), routed_keys if "all_resident" not in args.skip else 0)
    arena_rows = max(1, math.ceil(args.arena / 100 * n_keys))
    res.update(
        {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "device": device,
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
            "pack": pack.path,
            "geometry": {
                "layers": L,
                "experts": E,
                "top_k": k,
                "batch": T,
                "hidden": H,
                "inter": I,
                "row_bytes": int(pack.slot_bytes),
                "stride": int(pack.stride),
                "keys": n_keys,
            },
            "routing": {
                **rmeta,
                "steps": args.steps,
                "warmup": args.warmup,
                "gate_rate": args.gate_rate,
                "distinct_per_decide": float(distinct.mean()),
                "keys_routed": routed_keys,
            },
            "attn_us": args.attn_us if device == "cuda" else 0.0,
            "fold_every": args.fold_every,
            "arena_rows": arena_rows,
            "pools": [],
            "ceilings": {},
        }
    )
    _progress(
        f"pack {pack.path} ({L} x {E} rows of {pack.slot_bytes} B), routing "
        f"{rmeta['source']}, {time.time() - t_start:.1f} s"
    )
    store = ts.ExpertStore(
        pack,
        vram_slots=top_slots,
        ram_gb=arena_rows * pack.stride / 2**30,
        device=device,
        lazy_per_step=0,
        threads=args.threads,
        max_promote=top_slots,
    )
    try:
        keys = dl.hottest_keys(routing, E, min(arena_rows, n_keys))
        for a in range(0, len(keys), 512):
            part = keys[a : a + 512]
            store.load_arena(np.stack([part // E, part % E], axis=1))
        _progress(f"arena: {len(keys)} rows loaded, {time.time() - t_start:.1f} s")
        missing = _arena_missing(store, routing, E)
        res["arena_missing_keys"] = int(len(missing))
        if len(missing):
            res["arena_note"] = (
                "keys routed but not in the arena are not paged in (counted "
                "no_arena): the MoE serves them from the base tier"
            )
        dec = dl.Decoder(torch, store, H, I, T, k, args.attn_us, routing, args.seed)
        fires = np.random.default_rng(args.seed + 1).random(n_total) < args.gate_rate
        ctx = Ctx(torch, args, store, dec, routing, fires, _arena_sums(torch, store))
        _measure(ctx, res, pool_slots, routed_keys, L, E, T, k, n_total)
    finally:
        store.close()
    res["checks"] = {"rows_checked": ctx.rows_checked, "mismatches": ctx.mismatches}
    _bounds(res)
    res["seconds"] = time.time() - t_start
    return res


def _arena_missing(store, routing, E) -> np.ndarray:
    keys = dl.routed_keys(routing, E)
    return keys[store._arena.resident_slot[keys] < 0]


def _measure(ctx, res, pool_slots, routed_keys, L, E, T, k, n_total) -> None:
    args, torch = ctx.args, ctx.torch
    ceil = res["ceilings"]
    if ctx.cuda and "ceilings" not in args.skip:
        from tierstore.cli.bench_io_measure import ceiling_h2d

        ceil["h2d_gbps"] = ceiling_h2d(torch, "cuda", 1 << 30)
        ceil.update(_gather_ceiling(ctx, max(pool_slots.values()), ceil["h2d_gbps"]))
        _progress(
            f"ceilings: H2D {ceil['h2d_gbps']:.1f} GB/s, page-in {ceil['gather_gbps']:.1f} "
            f"GB/s ({ceil['gather_best']})"
        )
    if "all_resident" not in args.skip:
        res["all_resident"] = run_residency(ctx, "all_resident", routed_keys)
        _progress(f"all-resident: {res['all_resident']['tok_s']:.1f} tok/s")
    for pct, slots in pool_slots.items():
        row = {"pct": pct, "slots": slots, "modes": {}}
        for mode in args.modes:
            row["modes"][mode] = (
                run_host_planned(ctx, slots) if mode == "host_planned" else run_residency(ctx, mode, slots)
            )
            m = row["modes"][mode]
            _progress(
                f"pool {pct}% ({slots} slots) {mode}: {m['tok_s']:.2f} tok/s, miss rate {m['miss_rate']:.3f}"
            )
        res["pools"].append(row)
    if "all_miss" not in args.skip and args.trace is None:
        slots = min(pool_slots.values())
        cyc = dl.cyclic_routing(n_total, L, E, k, T)
        saved = ctx.routing
        ctx.routing, ctx.keys = cyc, dl.routed_keys(cyc, E)
        ctx.dec.routing_dev.copy_(torch.from_numpy(cyc))
        try:
            row = {"pct": min(pool_slots), "slots": slots, "routing": "cyclic", "modes": {}}
            for mode in [m for m in args.modes if m != "uva_static"]:
                row["modes"][mode] = (
                    run_host_planned(ctx, slots)
                    if mode == "host_planned"
                    else run_residency(ctx, mode, slots)
                )
                _progress(
                    f"all-miss {mode}: {row['modes'][mode]['tok_s']:.2f} tok/s, miss rate "
                    f"{row['modes'][mode]['miss_rate']:.3f}"
                )
            res["all_miss"] = row
        finally:
            ctx.routing, ctx.keys = saved, dl.routed_keys(saved, E)
            ctx.dec.routing_dev.copy_(torch.from_numpy(saved))


def _bounds(res: dict) -> None:
    """Per run: the I/O bound of its own misses (timed bytes over the H2D copy bandwidth),
    the all-resident bound, and the ratios; then the issue's three goals."""
    h2d = res["ceilings"].get("h2d_gbps")
    allres = res.get("all_resident", {}).get("tok_s")
    rows = list(res["pools"]) + ([res["all_miss"]] if "all_miss" in res else [])
    for row in rows:
        for m in row["modes"].values():
            bpt = m["bytes_per_token"]
            m["io_bound_tok_s"] = (h2d * 1e9 / bpt) if (h2d and bpt) else None
            if allres:
                m["vs_all_resident"] = m["tok_s"] / allres
            if m["io_bound_tok_s"]:
                m["vs_io_bound"] = m["tok_s"] / m["io_bound_tok_s"]
                bound = 1.0 / (1.0 / allres + 1.0 / m["io_bound_tok_s"]) if allres else None
                m["serial_bound_tok_s"] = bound
        modes = row["modes"]
        if "device" in modes:
            for base in ("host_planned", "uva_static", "device_hits_first"):
                if base in modes:
                    row[f"device_vs_{base}"] = modes["device"]["tok_s"] / modes[base]["tok_s"]
    goals = {}
    with_both = [r for r in res["pools"] if "device_vs_host_planned" in r]
    if with_both:
        inside = [
            r
            for r in with_both
            if GOAL_MISS_RATES[0] <= r["modes"]["device"]["miss_rate"] <= GOAL_MISS_RATES[1]
        ]
        pick = inside or [min(with_both, key=lambda r: abs(r["modes"]["device"]["miss_rate"] - 0.15))]
        goals["device_vs_host_planned_10_20pct_misses"] = {
            "goal": ">= 1.3",
            "in_range": bool(inside),
            "at": [
                {
                    "pct": r["pct"],
                    "miss_rate": r["modes"]["device"]["miss_rate"],
                    "ratio": r["device_vs_host_planned"],
                }
                for r in pick
            ],
        }
    full = [r for r in res["pools"] if r["pct"] == 100 and "device" in r["modes"]]
    if full and allres:
        goals["device_vs_all_resident_100pct"] = {
            "goal": ">= 0.9",
            "ratio": full[0]["modes"]["device"]["tok_s"] / allres,
            "miss_rate": full[0]["modes"]["device"]["miss_rate"],
        }
    am = res.get("all_miss", {}).get("modes", {}).get("device")
    if am and am.get("vs_io_bound"):
        goals["device_vs_io_bound_all_miss"] = {
            "goal": ">= 0.9",
            "ratio": am["vs_io_bound"],
            "miss_rate": am["miss_rate"],
        }
    res["goals"] = goals


# -- output ------------------------------------------------------------------------------------------
def _f(v, fmt=".2f") -> str:
    return "-" if v is None else format(v, fmt)


def report(res: dict) -> str:
    g, c = res["geometry"], res["ceilings"]
    lines = [
        f"{res['date']} {res['host']} device {res['device']} {res.get('gpu') or ''}",
        f"{g['layers']} layers x {g['experts']} experts, top-{g['top_k']}, batch {g['batch']}, "
        f"rows of {g['row_bytes']} B; routing {res['routing']['source']}; attention "
        f"{res['attn_us']} us/layer; {res['routing']['steps']} timed steps",
        f"ceilings: H2D {_f(c.get('h2d_gbps'), '.1f')} GB/s, page-in by SMs "
        f"{_f(c.get('gather_gbps'), '.1f')} GB/s ({c.get('gather_best', '-')})",
    ]
    if "all_resident" in res:
        a = res["all_resident"]
        lines.append(f"all-resident: {a['tok_s']:.2f} tok/s ({a['ms_per_step']:.3f} ms/step)")
    lines.append(
        f"{'pool':>6}{'slots':>7}{'miss':>7}  {'mode':<18}{'tok/s':>9}{'ms/step':>9}"
        f"{'I/O bound':>11}{'/bound':>8}{'/all-res':>9}"
    )
    rows = list(res["pools"]) + ([res["all_miss"]] if "all_miss" in res else [])
    for row in rows:
        tag = f"{row['pct']}%" + ("*" if row.get("routing") == "cyclic" else "")
        for mode, m in row["modes"].items():
            lines.append(
                f"{tag:>6}{row['slots']:>7}{m['miss_rate']:>7.3f}  {mode:<18}{m['tok_s']:>9.2f}"
                f"{m['ms_per_step']:>9.3f}{_f(m.get('io_bound_tok_s')):>11}"
                f"{_f(m.get('vs_io_bound')):>8}{_f(m.get('vs_all_resident')):>9}"
            )
        for base in ("host_planned", "uva_static", "device_hits_first"):
            if f"device_vs_{base}" in row:
                lines.append(f"{'':>22}device / {base}: {row[f'device_vs_{base}']:.2f}x")
    if "all_miss" in res:
        lines.append("* cyclic routing: every expert misses")
    for name, goal in res.get("goals", {}).items():
        lines.append(f"goal {name}: {json.dumps(goal)}")
    ch = res["checks"]
    lines.append(
        f"byte checks: {ch['rows_checked']} pool rows against the arena, "
        f"{'all equal' if not ch['mismatches'] else ch['mismatches']}"
    )
    return "\n".join(lines)


def plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tierstore.files.atomic import write_atomic

    fig, ax = plt.subplots(figsize=(7, 4.2))
    pcts = [r["pct"] for r in res["pools"]]
    for mode, style in (
        ("device", "o-"),
        ("host_planned", "s--"),
        ("uva_static", "^:"),
        ("device_hits_first", "d-."),
    ):
        ys = [r["modes"][mode]["tok_s"] if mode in r["modes"] else np.nan for r in res["pools"]]
        if not all(np.isnan(ys)):
            ax.plot(pcts, ys, style, label=mode)
    bounds = [r["modes"].get("device", {}).get("io_bound_tok_s") for r in res["pools"]]
    if any(v for v in bounds):
        ax.plot(pcts, [v if v else np.nan for v in bounds], "kx", label="I/O bound (H2D)")
    if "all_resident" in res:
        ax.axhline(res["all_resident"]["tok_s"], color="k", lw=1, ls=":", label="all-resident")
    am = res.get("all_miss", {}).get("modes", {}).get("device")
    if am:
        ax.plot([res["all_miss"]["pct"]], [am["tok_s"]], "r*", ms=10, label="all-miss (device)")
    ax.set_xlabel("pool, % of the experts")
    ax.set_ylabel("tokens / s")
    ax.set_yscale("log")
    g = res["geometry"]
    ax.set_title(
        f"bench decode: {g['layers']}x{g['experts']} top-{g['top_k']}, {res.get('gpu') or res['device']}",
        fontsize=9,
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    data = _png_bytes(fig)
    plt.close(fig)
    write_atomic(path, data)


def _png_bytes(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def main(args) -> int:
    res = run_and_report(args, run, report, plot)
    if res["checks"]["mismatches"]:
        # every read passed the store's own xxh3 check: a mismatch here is a copy to the
        # wrong slot, not a disk fault, so no errno is claimed
        raise TierstoreError(f"{res['pack']}: bench decode: byte check failed: {res['checks']['mismatches']}")
    return 0
