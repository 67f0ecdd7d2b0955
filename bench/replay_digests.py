"""Digests of the native replay's results, to show a speed change left them bit-identical:
per (trace, policy, pool, granularity) the hits, demand reads, evictions, rejections, a
digest of the hit mask and one of the policy's final state (auto: its scores, leader and
every expert's arrays, as tests/test_native_policies_golden.py digests them).

    PYTHONPATH=$PWD python3 bench/replay_digests.py --out /tmp/digests_after.json
    python3 bench/replay_digests.py --compare /tmp/digests_before.json /tmp/digests_after.json

Traces: FLAME (when present), the bench's synthetic DS4 (1024 ticks, batch 1, as
bench/bench_replay.py) and a small batched synthetic one (64 ticks, batch 4, seed 3);
pools 10 / 20 / 40 % of the keys; layer and tick granularity.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tierstore.testing.digests import digest, policy_state

NAMES = ("lru", "heat", "hybrid", "phase", "blend", "auto")
FLAME = "/work/shared/traces/flame_moe_290m_pretrain_2048tok.npy"


def digests(flame: str) -> dict:
    from tierstore import policies
    from tierstore.sim.counting import Prepared
    from tierstore.sim.demand import replay_demand_fill
    from tierstore.sim.synth import synthetic_trace
    from tierstore.sim.traces import load_trace

    traces = []
    if Path(flame).exists():
        traces.append(("flame", load_trace(flame)))
    traces.append(("synth1024", synthetic_trace(1024, batch=1)))
    traces.append(("synth64b4s3", synthetic_trace(64, batch=4, seed=3)))
    out = {}
    for label, trace in traces:
        prep = Prepared(trace)
        for slots in sorted({max(round(prep.n_keys * f), 1) for f in (0.1, 0.2, 0.4)}):
            for gran in ("layer", "tick"):
                for name in NAMES:
                    p = policies.make(name, prep.n_keys, slots)
                    c = replay_demand_fill(prep, p, slots, gran, native=True)
                    out[f"{label}/{name}/{slots}/{gran}"] = [
                        int(c.hit.sum()), int(c.demand_reads), int(c.evictions),
                        int(c.rejected), digest(c.hit), digest(*policy_state(p))]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flame", default=FLAME)
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    a = ap.parse_args(argv)
    if a.compare:
        before, after = (json.loads(Path(f).read_text()) for f in a.compare)
        bad = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        for k in bad:
            print(f"DIFFERS {k}: {before.get(k)} -> {after.get(k)}")
        print(f"{len(before)} / {len(after)} digests, {len(bad)} differ")
        return 1 if bad else 0
    d = digests(a.flame)
    text = json.dumps(d, indent=0, sort_keys=True)
    if a.out:
        Path(a.out).write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")
    print(f"{len(d)} digests", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
