"""auto against the best fixed policy in hindsight, bandwidth view, without re-running
the grid: replays only ``auto`` on each trace of bench/hits_eval.py and compares it
with the hindsight sweep stored in bench/results/hits_eval_<trace>.json (the fixed
policies' rules are unchanged by an auto change; rerun hits_eval.py when they move).

    PYTHONPATH=$PWD python3 bench/auto_vs_hindsight.py [--traces flame,synthetic,heldout]

Writes bench/results/auto_vs_hindsight.md. The synthetic trace is hits_eval's
``--ticks 256`` one (the stored json's)."""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hits_eval as H  # noqa: E402

from tierstore import sim  # noqa: E402
from tierstore.files.atomic import write_atomic_with  # noqa: E402
from tierstore.policies import auto as auto_policy  # noqa: E402
from tierstore.sim import synth, traces  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def _jobs(which):
    if "flame" in which and H.FLAME.exists():
        yield "flame", lambda: traces.load_trace(H.FLAME)
    if "synthetic" in which:
        yield "synthetic", lambda: synth.synthetic_trace(256, seed=0, prefill_tokens=256,
                                                         prefill_every=1024)
    for label, kw in H.HELDOUT.items():
        if "heldout" in which or label in which:
            yield label, lambda kw=kw: synth.synthetic_trace(**kw)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="flame,synthetic,heldout")
    args = ap.parse_args(argv)
    t0 = time.process_time()
    rows, deltas = [], []
    for tag, make in _jobs(args.traces.split(",")):
        blk = json.loads((RESULTS / f"hits_eval_{tag}.json").read_text())["traces"][0]
        by = {(r["policy"], r["slots"]): r for r in blk["results"]}
        for r in sim.replay(sim.Prepared(make()), ["auto"], blk["slots"]):
            s = r.slots
            best = H._best_fixed(blk, s, "bandwidth_hit_rate")
            label = best["policy"] + (f"({best['half_life']:g})" if "half_life" in best else "")
            lru, mn = by["lru", s]["bandwidth_hit_rate"], by["belady", s]["bandwidth_hit_rate"]
            d = r.bandwidth_hit_rate - best["bandwidth_hit_rate"]
            deltas.append(d)
            rows.append(f"| {tag} | {s} | {lru:.4f} | {mn:.4f} | {label} | "
                        f"{best['bandwidth_hit_rate']:.4f} | {by['auto', s]['bandwidth_hit_rate']:.4f} | "
                        f"{r.bandwidth_hit_rate:.4f} | {(r.bandwidth_hit_rate - lru) / (mn - lru):.3f} | "
                        f"{d:+.4f} |")
    experts = ", ".join(n if h is None else f"{n}({h:g})" for n, h in auto_policy.EXPERTS)
    lhl = auto_policy.LONG_SCORE_HALF_LIFE
    windows = (f"score half-life {auto_policy.SCORE_HALF_LIFE:g} steps"
               + ("" if lhl is None else f" plus a long window of {lhl:g} steps"))
    md = "\n".join([
        "# auto vs the best fixed policy in hindsight (bandwidth view)", "",
        f"Command: `PYTHONPATH=$PWD python3 bench/auto_vs_hindsight.py --traces {args.traces}`; "
        f"machine: {platform.platform()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"{time.process_time() - t0:.0f} s CPU.", "",
        f"auto's experts: {experts}; {windows}. "
        "Hindsight grid and lru/MIN/old auto: the stored bench/results/hits_eval_<trace>.json "
        "(heat/hybrid/phase/blend at half-lives "
        f"{', '.join(f'{h:g}' for h in H.SWEEP)}, and lru; equal reads: demand fill, "
        "every miss one read).", "",
        "| trace | slots | lru | MIN | best fixed | its hit | auto (stored) | auto (now) | "
        "gap closed | auto - best |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|", *rows, "",
        f"auto - best fixed: min {min(deltas):+.4f}, max {max(deltas):+.4f}, "
        f"sum {sum(deltas):+.4f} over {len(deltas)} points.", ""])
    write_atomic_with(RESULTS / "auto_vs_hindsight.md", lambda f: f.write(md.encode()))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
