"""Replay speed, M accesses/s, per policy: the native demand loops
(tierstore.sim.native_replay -> tierstore._C.replay_demand / replay_auto / replay_min,
the last for Belady's MIN and MIN that may skip, the ceilings; replay_prefetch /
replay_prefetch_auto for ``<policy>+prefetch``, demand fill plus the prefetcher; replay_lazy
for ``lazy`` / ``reference``; replay_predict for ``predict`` / ``prefetch``) against the
Python loop (replay_demand_fill(native=False)), layer granularity, one thread, on a
synthetic DeepSeek-V4-Flash-shaped trace and, with ``--flame``, the FLAME-MoE-290M trace.

    taskset -c 1 python3 bench/bench_replay.py [--flame PATH] [--out bench/results/replay]

Writes <out>.md and <out>.json. Accesses = token-weighted routing rows of the
trace (the "M acc/s" of bench/results/hits_eval_*.md). Figures are CPU seconds of
the process (``time.process_time``: on a shared VM the wall clock counts other
people's work; the wall figure is kept in the json). Native = the median of
``--repeat`` runs; pools are 10 / 20 / 40 % of the keys; the Python loop runs once, for
``auto`` (nine shadow caches; a Python fill loop over the native AutoCore) only over the
first ``--auto-python-ticks`` ticks. Both paths are
checked to agree on the hits and reads of what the Python loop replayed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from tierstore import policies
from tierstore.sim.belady import BeladyPolicy, BeladySkipPolicy
from tierstore.sim.counting import Prepared
from tierstore.sim.demand import replay_demand_fill, replay_lazy
from tierstore.sim.predict import replay_predict
from tierstore.sim.prefetching import replay_with_prefetch
from tierstore.sim.runner import (
    DEFAULT_TICKS_PER_SECOND,
    LAZY_PER_TICK,
    LAZY_POLICY,
    REFERENCE_HALF_LIFE_S,
    REFERENCE_PROMOTE_PER_TICK,
)
from tierstore.sim.synth import synthetic_trace
from tierstore.sim.traces import Trace, load_trace

NAMES = ("lru", "heat", "hybrid", "phase", "blend", "auto", "belady", "belady_skip")
MIN = {"belady": BeladyPolicy, "belady_skip": BeladySkipPolicy}  # the ceilings, over the oracle


SIM_MODELS = ("lazy", "reference", "predict", "prefetch")  # no policy object of their own
PREFETCH = "+prefetch"  # "<policy>+prefetch": demand fill plus the prefetcher


def make(prep, name, slots):
    if name in SIM_MODELS:
        return None  # run_model builds its own
    if name in MIN:
        return MIN[name](prep.n_keys, slots, next_use=prep.next_use)
    if name.endswith(PREFETCH):
        return policies.make(name[: -len(PREFETCH)], prep.n_keys, slots, prefetching=True)
    return policies.make(name, prep.n_keys, slots)


def run_model(prep, name, slots, native):
    """The simulator's lazy and predictor models (sim/runner.py run_one's, ``native`` passed
    on): ``lazy`` (the store's step()), ``reference`` (vLLM-Moet's manager), ``predict`` and
    ``prefetch`` (the co-routing predictor with and without demand fill)."""
    if name == "lazy":
        return replay_lazy(
            prep, policies.make(LAZY_POLICY, prep.n_keys, slots), slots, LAZY_PER_TICK, native=native
        )
    if name == "reference":
        heat = policies.make(
            "heat", prep.n_keys, slots, half_life=REFERENCE_HALF_LIFE_S * DEFAULT_TICKS_PER_SECOND
        )
        return replay_lazy(prep, heat, slots, REFERENCE_PROMOTE_PER_TICK, candidates="hottest", native=native)
    return replay_predict(prep, slots, demand_fill=name == "predict", native=native)


def timed(prep, name, slots, native, repeat):
    """(CPU seconds, wall seconds, counters): the medians of ``repeat`` runs (the
    shared VM's noise is one-sided, but a median is what the issue's figures quote)."""
    cpu, walls, cnt = [], [], None
    for _ in range(repeat):
        pol = make(prep, name, slots)
        t0, w0 = time.process_time(), time.perf_counter()
        if name in SIM_MODELS:
            cnt = run_model(prep, name, slots, native)
        elif name.endswith(PREFETCH):
            cnt = replay_with_prefetch(prep, pol, slots, native=native)[0]
        else:
            cnt = replay_demand_fill(prep, pol, slots, "layer", native=native)
        cpu.append(time.process_time() - t0)
        walls.append(time.perf_counter() - w0)
    return float(np.median(cpu)), float(np.median(walls)), cnt


def head(trace: Trace, n_ticks: int) -> Trace:
    """The first ``n_ticks`` ticks of ``trace``."""
    end = int(trace.tick_starts[min(n_ticks, trace.n_ticks)])
    return Trace(
        trace.ticks[:end],
        trace.layers[:end],
        trace.experts[:end],
        trace.layer_ids,
        trace.n_experts,
        trace.name,
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--flame",
        default=None,
        help="the FLAME-MoE-290M routing trace (.npy), replayed before the synthetic one",
    )
    ap.add_argument("--synth-ticks", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--auto-python-ticks", type=int, default=48)
    ap.add_argument("--policies", default=",".join(NAMES))
    ap.add_argument("--out", default="bench/results/replay")
    argv = list(argv) if argv is not None else __import__("sys").argv[1:]
    a = ap.parse_args(argv)
    traces = []
    if a.flame:
        traces.append(("flame", load_trace(a.flame)))
    traces.append(
        (f"synthetic_ds4 ({a.synth_ticks} ticks, batch 1)", synthetic_trace(a.synth_ticks, batch=1))
    )
    rows = []
    for label, trace in traces:
        prep = Prepared(trace)
        short = Prepared(head(trace, a.auto_python_ticks))
        for slots in sorted({max(round(prep.n_keys * f), 1) for f in (0.1, 0.2, 0.4)}):
            for name in a.policies.split(","):
                tn, wn, cn = timed(prep, name, slots, True, a.repeat)
                py = short if name == "auto" else prep
                tp, _, cp = timed(py, name, slots, False, 1)
                cs = cn if py is prep else timed(py, name, slots, True, 1)[2]
                assert (
                    np.array_equal(cs.hit, cp.hit)
                    and cs.demand_reads == cp.demand_reads
                    and cs.prefetched == cp.prefetched
                    and cs.unserved == cp.unserved
                ), f"{label} {name} {slots}: native and Python disagree"
                rows.append(
                    {
                        "trace": label,
                        "n_keys": prep.n_keys,
                        "accesses": prep.accesses,
                        "policy": name,
                        "slots": slots,
                        "native_macc_s": prep.accesses / tn / 1e6,
                        "native_wall_macc_s": prep.accesses / wn / 1e6,
                        "python_macc_s": py.accesses / tp / 1e6,
                        "python_accesses": py.accesses,
                        "speedup": (prep.accesses / tn) / (py.accesses / tp),
                        "hits": int(cn.hit.sum()),
                    }
                )
                print(
                    f"{label:40s} {name:14s} {slots:6d}  native {rows[-1]['native_macc_s']:7.2f}"
                    f"  python {rows[-1]['python_macc_s']:6.3f} M acc/s",
                    flush=True,
                )
    machine = (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores "
        f"(shared VM), Python {platform.python_version()}, one thread"
    )
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=1))
    md = [
        "# Replay speed (bench/bench_replay.py), layer granularity",
        "",
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Command: "
        f"`PYTHONPATH=$PWD taskset -c 1 python3 bench/bench_replay.py {' '.join(argv or [])}`.",
        "",
        f"Machine: {machine}. M accesses/s of CPU time (process_time), token-weighted; "
        f"native = median of {a.repeat}; Python auto over the first {a.auto_python_ticks} "
        "ticks only.",
        "",
        "| trace | policy | slots | native M acc/s | Python M acc/s | speedup |",
        "|---|---|---:|---:|---:|---:|",
    ]
    md += [
        f"| {r['trace']} | {r['policy']} | {r['slots']} | {r['native_macc_s']:.2f} | "
        f"{r['python_macc_s']:.4f} | {r['speedup']:.0f}x |"
        for r in rows
    ]
    md += [
        "",
        f"auto's Python figure covers only the first {a.auto_python_ticks} ticks (the Python "
        "loop is too slow for the whole trace); the native figure covers the whole trace, "
        "so auto's speedup compares different spans.",
    ]
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
