"""Pool-hit sweep from a checked-in config (bench/configs/hits_*.json).

    python bench/bench_hits.py bench/configs/hits_flame.json [--out bench/results]

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

from tierstore import sim, traces
from tierstore.commands.bench_hits import plot_hits
from tierstore.traces import _atomic_write


def load(cfg: dict) -> traces.Trace:
    if "trace" in cfg:
        return traces.load_trace(cfg["trace"])
    return traces.synthetic_trace(**cfg["synthetic"])


def markdown(results, trace) -> str:
    lines = [f"{trace.name}: {trace.n_layers} layers x {trace.n_experts} experts, "
             f"{trace.n_ticks} ticks, {trace.n_rows} accesses", "",
             "| policy | slots | hit rate | distinct | gap to MIN | reads/tick | prefetched | "
             "wasted | replay M acc/s |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        gap = "" if r.gap_to_min is None else f"{r.gap_to_min:+.3f}"
        lines.append(f"| {r.policy} | {r.slots} | {r.hit_rate:.3f} | {r.distinct_hit_rate:.3f} | "
                     f"{gap} | {r.reads_per_tick:.1f} | {r.prefetched} | {r.wasted_prefetch} | "
                     f"{r.accesses_per_s / 1e6:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)
    cfg = json.loads(Path(args.config).read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    trace = load(cfg)
    t_load = time.perf_counter() - t0
    results = sim.replay(trace, cfg["policies"], cfg["slots"], budget=cfg.get("budget", 8),
                         granularity=cfg.get("granularity", "layer"),
                         policy_params={"predict": {"threshold": cfg.get("threshold", 0.1)}})
    name = cfg["name"]
    body = json.dumps({"config": cfg, "machine": platform.platform(), "python": sys.version.split()[0],
                       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "load_s": t_load, "results": [r.as_dict() for r in results]}, indent=1)
    _atomic_write(out / f"hits_{name}.json", lambda f: f.write(body.encode()))
    plot_hits(results, str(out / f"hits_{name}.png"),
              title=f"{trace.name}: hit rate vs pool size ({cfg.get('granularity', 'layer')} reads)")
    print(markdown(results, trace))
    print(f"\n(trace load/generate {t_load:.1f} s, replay {time.perf_counter() - t0 - t_load:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
