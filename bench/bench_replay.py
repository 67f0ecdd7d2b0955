"""Replay speed, M accesses/s, per policy: the native demand loop
(tierstore.sim.native_replay -> tierstore._C.replay_demand) against the Python
loop (replay_demand_fill(native=False)), layer granularity, one core, on the
FLAME trace and a synthetic DeepSeek-V4-Flash-shaped one.

    PYTHONPATH=$PWD python3 bench/bench_replay.py [--flame PATH] [--out bench/results/replay]

Writes <out>.md and <out>.json. Accesses = token-weighted routing rows of the
trace (the "M acc/s" of bench/results/hits_eval_*.md). Each figure is the best
of ``--repeat`` runs; the Python loop runs once (it is ~100x slower). Both paths
are checked to agree on the hit count before a figure is written.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from tierstore import policies
from tierstore.sim.counting import Prepared
from tierstore.sim.demand import replay_demand_fill
from tierstore.sim.synth import synthetic_trace
from tierstore.sim.traces import load_trace

NAMES = ("lru", "heat", "hybrid")


def timed(prep, name, slots, native, repeat):
    best, cnt = float("inf"), None
    for _ in range(repeat):
        pol = policies.make(name, prep.n_keys, slots)
        t0 = time.perf_counter()
        cnt = replay_demand_fill(prep, pol, slots, "layer", native=native)
        best = min(best, time.perf_counter() - t0)
    return best, cnt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flame", default="/work/shared/traces/flame_moe_290m_pretrain_2048tok.npy")
    ap.add_argument("--synth-ticks", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default="bench/results/replay")
    a = ap.parse_args(argv)
    traces = []
    if Path(a.flame).exists():
        traces.append(("flame", Prepared(load_trace(a.flame))))
    traces.append((f"synthetic_ds4 ({a.synth_ticks} ticks, batch 1)",
                   Prepared(synthetic_trace(a.synth_ticks, batch=1))))
    rows = []
    for label, prep in traces:
        for slots in sorted({max(prep.n_keys // 10, 1), max(prep.n_keys // 4, 1)}):
            for name in NAMES:
                tn, cn = timed(prep, name, slots, True, a.repeat)
                tp, cp = timed(prep, name, slots, False, 1)
                assert (cn.hit == cp.hit).all() and cn.demand_reads == cp.demand_reads, \
                    f"{label} {name} {slots}: native and Python disagree"
                rows.append({"trace": label, "n_keys": prep.n_keys, "accesses": prep.accesses,
                             "policy": name, "slots": slots,
                             "native_macc_s": prep.accesses / tn / 1e6,
                             "python_macc_s": prep.accesses / tp / 1e6,
                             "speedup": tp / tn, "hits": int(cn.hit.sum())})
                print(f"{label:40s} {name:7s} {slots:6d}  native {rows[-1]['native_macc_s']:7.2f}"
                      f"  python {rows[-1]['python_macc_s']:6.3f} M acc/s", flush=True)
    machine = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores "
               f"(shared VM), Python {platform.python_version()}, one thread")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=1))
    md = [f"# Replay speed (bench/bench_replay.py), layer granularity", "",
          f"Machine: {machine}. M accesses/s, token-weighted; native = best of {a.repeat}.", "",
          "| trace | policy | slots | native M acc/s | Python M acc/s | speedup |",
          "|---|---|---:|---:|---:|---:|"]
    md += [f"| {r['trace']} | {r['policy']} | {r['slots']} | {r['native_macc_s']:.2f} | "
           f"{r['python_macc_s']:.3f} | {r['speedup']:.0f}x |" for r in rows]
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
