"""Bounds on what eviction/admission knowledge could add on a trace (the bandwidth
view's goal): oracle variants that use FUTURE knowledge, for bounding only (never
shipped), next to the online policy they extend.

    python3 bench/hits_bounds.py --flame PATH/flame_moe_290m_pretrain_2048tok.npy [--out bench/results]
    python3 bench/hits_bounds.py --traces synthetic

Rows, at 10 / 20 / 40 % pools, layer granularity, every miss read once:
- ``blend(64)``: the online best fixed policy on FLAME (the base of the oracles);
- ``oracle_tick``: blend(64) whose victims are first taken among resident keys
  that the REST OF THIS TICK will not read (it knows this token's upcoming
  routes: the most a same-tick cross-layer predictor could give an eviction order);
- ``static_lfu``: the best static set in hindsight (the trace's most used keys,
  pinned; every other access a miss): the ceiling of a popularity estimate that
  does not move;
- ``future_W``: keys ordered (and admitted) by their true use count over the
  NEXT W ticks: what predicting popularity shifts W ticks ahead would give.
The loop is the auto shadows' (the one fill routine, policies/fill.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from tierstore import sim
from tierstore.files.atomic import write_atomic_with
from tierstore.policies import make
from tierstore.policies.admission import PolicyFilter
from tierstore.policies.dense import DensePolicy
from tierstore.policies.fill import plan_fill
from tierstore.sim import synth, traces

FUTURE = (16, 64, 256)


class _Future(DensePolicy):
    """Order and admission by the true use count of the next ``window`` ticks."""

    name = "future"

    def __init__(self, n_keys, capacity, cum, window):
        super().__init__(n_keys, capacity)
        self.cum, self.window, self.tick = cum, int(window), 0

    def _order(self):
        t = self.tick
        return self.cum[min(t + 1 + self.window, len(self.cum) - 1)] - self.cum[t + 1], None

    def admit(self, candidate, victim):
        p = self._order()[0]
        return p[np.asarray(candidate)] > p[np.asarray(victim)]

    def on_access(self, keys, weights=None, now=None):
        pass

    def decay(self, now=None, steps=1):
        self.tick += steps

    def scores(self):
        return self._order()[0].astype(np.float64)


def _groups(prep):
    """[(tick, keys)] per (tick, layer) group, in read order."""
    g = prep.gstarts
    return [(int(prep.dtick[g[i]]), prep.dkeys[g[i] : g[i + 1]]) for i in range(g.size - 1)]


def demand(prep, groups, pol, upcoming=None) -> float:
    """Bandwidth hit rate of ``pol`` (distinct hits / distinct accesses; each group
    one read of the slot table). ``upcoming``: per group, the keys the rest of its
    tick reads; they are victims last (the oracle)."""
    adm = PolicyFilter(pol)
    blocked = np.zeros(prep.n_keys, dtype=bool)
    hits = total = 0
    for i, (t, keys) in enumerate(groups):
        r = pol.is_resident(keys)
        hits += int(np.count_nonzero(r))
        total += keys.size
        pol.on_access(keys, None)
        miss = keys[~r]
        if miss.size:
            free = pol.capacity - pol.n_resident
            if miss.size > free and adm.filters:
                miss = pol.rank(miss)
            blocked[keys] = True
            fill = (
                _oracle_fill(pol, miss, free, blocked, adm, upcoming[i])
                if upcoming
                else plan_fill(pol, miss, free, blocked, adm)
            )
            blocked[keys] = False
            if fill.victims.size:
                pol.on_evict(fill.victims)
            if fill.keys.size:
                pol.on_admit(fill.keys)
        if i + 1 == len(groups) or groups[i + 1][0] != t:
            pol.decay(steps=1)
    return hits / max(total, 1)


def _oracle_fill(pol, miss, free, blocked, adm, up):
    """plan_fill whose victims skip this tick's upcoming keys while others remain."""
    guard = blocked.copy()
    guard[up] = True
    n_need = miss.size - max(free, 0)
    first = np.asarray(pol.victims(n_need, guard), dtype=np.int64) if n_need > 0 else None

    class _Order:  # the policy's victims, the upcoming keys only when nothing else is left
        capacity = pol.capacity

        @staticmethod
        def victims(n, pinned):
            extra = pol.victims(n - first.size, pinned | np.isin(np.arange(pinned.size), first))
            return np.concatenate((first, np.asarray(extra, dtype=np.int64)))[:n]

    return plan_fill(_Order if n_need > 0 else pol, miss, free, blocked, adm)


def bounds(trace) -> dict:
    prep = sim.Prepared(trace)
    n = prep.n_keys
    slots = [max(1, round(n * f)) for f in (0.1, 0.2, 0.4)]
    groups = _groups(prep)
    ends = np.append(np.flatnonzero(np.diff([t for t, _ in groups])), len(groups) - 1)
    upcoming, start = [], 0
    for e in ends:  # per group: keys of the later groups of its tick
        tick = groups[start : e + 1]
        for j in range(len(tick)):
            rest = [k for _, k in tick[j + 1 :]]
            upcoming.append(np.concatenate(rest) if rest else np.empty(0, np.int64))
        start = e + 1
    counts = np.zeros((prep.n_ticks, n))
    np.add.at(counts, (prep.dtick, prep.dkeys), 1)
    cum = np.vstack([np.zeros(n), np.cumsum(counts, axis=0)])
    ref = {(r.policy, r.slots): r.bandwidth_hit_rate for r in sim.replay(prep, ["lru", "belady"], slots)}
    rows = []
    for s in slots:
        row = {
            "slots": s,
            "lru": ref["lru", s],
            "belady": ref["belady", s],
            "blend64": demand(prep, groups, make("blend", n, s, half_life=64.0)),
            "oracle_tick": demand(prep, groups, make("blend", n, s, half_life=64.0), upcoming),
            "static_lfu": float(np.sort(counts.sum(0))[::-1][:s].sum() / counts.sum()),
        }
        for w in FUTURE:
            row[f"future_{w}"] = demand(prep, groups, _Future(n, s, cum, w))
        rows.append(row)
        print(row, file=sys.stderr, flush=True)
    return {"trace": trace.name, "n_keys": n, "ticks": prep.n_ticks, "slots": slots, "rows": rows}


def markdown(blocks) -> str:
    cols = ["blend64", "oracle_tick", "static_lfu"] + [f"future_{w}" for w in FUTURE]
    out = [
        "Bounds (bandwidth hit, share of the LRU -> MIN gap in brackets; oracle_tick and "
        "future_W use future knowledge, for bounding only):",
        "",
        "| trace | slots | lru | MIN | " + " | ".join(cols) + " |",
        "|---|---:|---:|---:|" + "---:|" * len(cols),
    ]
    for b in blocks:
        for r in b["rows"]:
            gap = r["belady"] - r["lru"]
            cell = [f"{r[c]:.3f} ({(r[c] - r['lru']) / gap:+.2f})" for c in cols]
            out.append(
                f"| {b['trace'].split('[')[0]} | {r['slots']} | {r['lru']:.3f} | "
                f"{r['belady']:.3f} | " + " | ".join(cell) + " |"
            )
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results")
    ap.add_argument(
        "--flame",
        type=Path,
        default=None,
        help="the FLAME-MoE-290M routing trace (.npy) for the 'flame' bounds",
    )
    ap.add_argument(
        "--traces",
        default=None,
        help="flame and/or synthetic, comma-separated (default: flame with --flame, else synthetic)",
    )
    args = ap.parse_args(argv)
    which = (args.traces or ("flame" if args.flame else "synthetic")).split(",")
    if "flame" in which and args.flame is None:
        ap.error("--traces flame needs --flame PATH (the FLAME-MoE-290M routing trace)")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    blocks = []
    if "flame" in which:
        blocks.append(bounds(traces.load_trace(args.flame)))
    if "synthetic" in which:
        blocks.append(bounds(synth.synthetic_trace(256, seed=0, prefill_tokens=256, prefill_every=1024)))
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python3 bench/hits_bounds.py " + " ".join(argv or sys.argv[1:]),
        "seconds": time.perf_counter() - t0,
    }
    tag = "_".join(which)
    body = json.dumps({**meta, "traces": blocks}, indent=1)
    write_atomic_with(Path(args.out) / f"hits_bounds_{tag}.json", lambda f: f.write(body.encode()))
    md = markdown(blocks)
    write_atomic_with(Path(args.out) / f"hits_bounds_{tag}.md", lambda f: f.write(md.encode()))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
