"""Pool-hit sweep from a checked-in config (bench/configs/hits_*.json).

    python bench/bench_hits.py bench/configs/hits_ds4.json [--out bench/results]
    python bench/bench_hits.py bench/configs/hits_flame.json --trace PATH/flame_moe_290m_pretrain_2048tok.npy
    python bench/bench_hits.py --speed [--trace FLAME.npy]   # replay speed, M accesses/s per policy

A config names a synthetic trace (generated here) or a trace file by name; the file is
not in the repository, so its path is given with ``--trace``.

Writes <out>/hits_<name>.json (every Result) and <out>/hits_<name>.png (hit rate
vs pool size per policy) and prints a markdown table with the gap to MIN and
the replay speed of each run. Same replay as ``tierstore bench hits``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

from tierstore import sim
from tierstore.cli.bench_hits_views import plot_views as plot_hits
from tierstore.files.atomic import write_atomic_with
from tierstore.sim import synth, traces


def load(cfg: dict, config_path: str, trace_path: str | None) -> traces.Trace:
    if "trace" not in cfg:
        return synth.synthetic_trace(**cfg["synthetic"])
    if trace_path is None:
        raise SystemExit(
            f"{config_path} replays the trace file {cfg['trace']}: give its path "
            f"with --trace PATH (or run a synthetic config, bench/configs/hits_ds4.json)"
        )
    return traces.load_trace(trace_path)


def markdown(results, trace) -> str:
    lines = [
        f"{trace.name}: {trace.n_layers} layers x {trace.n_experts} experts, "
        f"{trace.n_ticks} ticks, {trace.n_rows} accesses",
        "",
        "| policy | slots | hit rate | distinct | gap to MIN | reads/tick | prefetched | "
        "wasted | replay M acc/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        gap = "" if r.gap_to_min is None else f"{r.gap_to_min:+.3f}"
        lines.append(
            f"| {r.policy} | {r.slots} | {r.hit_rate:.3f} | {r.distinct_hit_rate:.3f} | "
            f"{gap} | {r.reads_per_tick:.1f} | {r.prefetched} | {r.wasted_prefetch} | "
            f"{r.accesses_per_s / 1e6:.3f} |"
        )
    return "\n".join(lines)


SPEED_CASES = [  # (label, trace factory, granularity, slots); FLAME's are added by --trace
    (
        "DS4 synthetic batch 1, 512 ticks",
        lambda: synth.synthetic_trace(512, seed=0, prefill_tokens=0),
        "tick",
        512,
    ),
    (
        "DS4 synthetic batch 1, 512 ticks",
        lambda: synth.synthetic_trace(512, seed=0, prefill_tokens=0),
        "layer",
        512,
    ),
    (
        "DS4 synthetic batch 16, 128 ticks",
        lambda: synth.synthetic_trace(128, seed=0, batch=16, prefill_tokens=0),
        "layer",
        2048,
    ),
]


def speed(trace_path: str | None) -> int:
    """Replay speed of each policy, best of 2 runs, as a markdown table."""
    names = ["lru", "heat", "hybrid", "reference", "belady"]
    cases = list(SPEED_CASES)
    if trace_path:
        cases += [
            (f"{trace_path} ({gran})", lambda: traces.load_trace(trace_path), gran, 102)
            for gran in ("tick", "layer")
        ]
    print("| trace | granularity | slots | " + " | ".join(names) + " |")
    print("|---|---|---:|" + "---:|" * len(names))
    for label, make, gran, slots in cases:
        prep = sim.Prepared(make())
        best = {n: 0.0 for n in names}
        for _ in range(2):
            for r in sim.replay(prep, names, [slots], granularity=gran):
                best[r.policy] = max(best[r.policy], r.accesses_per_s)
        print(
            f"| {label} ({prep.accesses} acc) | {gran} | {slots} | "
            + " | ".join(f"{best[n] / 1e6:.2f}" for n in names)
            + " |"
        )
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", nargs="?")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--speed", action="store_true", help="measure replay speed instead")
    ap.add_argument(
        "--trace",
        default=None,
        help="the trace file a config names (e.g. hits_flame.json's FLAME-MoE-290M "
        "capture); with --speed, a real trace to time beside the synthetic ones",
    )
    args = ap.parse_args(argv)
    if args.speed:
        return speed(args.trace)
    if not args.config:
        ap.error("a config file is required unless --speed")
    cfg = json.loads(Path(args.config).read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    trace = load(cfg, args.config, args.trace)
    t_load = time.perf_counter() - t0
    results = sim.replay(
        trace,
        cfg["policies"],
        cfg["slots"],
        budget=cfg.get("budget", 8),
        granularity=cfg.get("granularity", "layer"),
        policy_params={"predict": {"threshold": cfg.get("threshold", 0.1)}},
    )
    name = cfg["name"]
    body = json.dumps(
        {
            "config": cfg,
            "machine": platform.platform(),
            "python": sys.version.split()[0],
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_s": t_load,
            "results": [r.as_dict() for r in results],
        },
        indent=1,
    )
    write_atomic_with(out / f"hits_{name}.json", lambda f: f.write(body.encode()))
    plot_hits(
        results,
        str(out / f"hits_{name}.png"),
        title=f"{trace.name}: hit rate vs pool size ({cfg.get('granularity', 'layer')} reads)",
    )
    print(markdown(results, trace))
    print(f"\n(trace load/generate {t_load:.1f} s, replay {time.perf_counter() - t0 - t_load:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
