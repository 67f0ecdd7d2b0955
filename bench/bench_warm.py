"""Warm-start benchmarks.

Hit rate (default; CPU, seconds): replay a routing trace through the policy
classes the live store uses, one global pool over all (layer, expert) keys,
every read counted, misses admitted (the setup of /work/shared/traces/README.md).
The first ``--warmup`` ticks produce a poolmon snapshot (written and read back
through the real warm-start file path against a real pack of the trace's
geometry); then the next ``--steps`` ticks are replayed cold and warm-started.

    python bench/bench_warm.py [--trace T.npy] [--steps 1000] [--policy heat] [--json]

Preheat (GPU machine): time ``store.preheat`` of a ``--pool-gb`` pool of
12 MiB rows from the page cache and from disk (pages dropped with
POSIX_FADV_DONTNEED), next to the engine's own ceiling measured in the same run.

    python bench/bench_warm.py --preheat --device cuda --pool-gb 6
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

DEFAULT_TRACE = "/work/shared/traces/flame_moe_290m_pretrain_2048tok.npy"


# ------------------------------------------------------------------ trace replay
def load_trace(path: str):
    """(per-tick dense key arrays, n_layers, n_experts); layers renumbered densely."""
    rows = np.load(path)
    layers = np.unique(rows[:, 1])
    n_layers, n_experts = len(layers), int(rows[:, 2].max()) + 1
    dense_layer = np.searchsorted(layers, rows[:, 1])
    keys = dense_layer.astype(np.int64) * n_experts + rows[:, 2]
    cuts = np.flatnonzero(np.diff(rows[:, 0])) + 1
    return np.split(keys, cuts), n_layers, n_experts


class ReplayPool:
    """A pool of ``capacity`` slots driven by one policy: the store's admission
    path without the bytes (admit every miss, evict the policy's victims but
    never a key of the current step)."""

    def __init__(self, policy_name: str, n_keys: int, capacity: int):
        from tierstore import policies
        self.policy = policies.make(policy_name, n_keys, capacity)
        self.resident = np.zeros(n_keys, bool)
        self.capacity = capacity
        self.hits = self.reads = 0

    def admit(self, keys: np.ndarray, pinned: np.ndarray | None = None) -> None:
        keys = keys[~self.resident[keys]]
        if not len(keys):
            return
        over = int(self.resident.sum()) + len(keys) - self.capacity
        if over > 0:
            victims = self.policy.victims(over, pinned=pinned)
            self.policy.on_evict(victims)
            self.resident[victims] = False
            keys = keys[:len(keys) - (over - len(victims))]
        self.policy.on_admit(keys)
        self.resident[keys] = True

    def step(self, keys: np.ndarray) -> None:
        hit = self.resident[keys]
        self.hits += int(hit.sum())
        self.reads += len(keys)
        self.policy.on_access(keys)
        pinned = np.zeros_like(self.resident)
        pinned[keys] = True
        self.admit(np.unique(keys[~hit]), pinned)
        self.policy.decay(steps=1)

    @property
    def hit_rate(self) -> float:
        return self.hits / max(self.reads, 1)


def replay_snapshot_file(pool: ReplayPool, pack, path: str, fmt: str) -> None:
    """Write the replayed pool's state with the real writer, as the store would."""
    from tierstore import warmstart as ws
    res = np.flatnonzero(pool.resident)
    heat = pool.policy.scores()[res]
    order = np.argsort(-heat, kind="stable")
    E = pack.n_experts
    keys = np.stack([res[order] // E, res[order] % E], axis=1)
    wf = ws.WarmFile("<replay>", "poolmon", ws.PackIdentity.of_pack(pack),
                     ws.WarmTier(keys, heat[order], pool.capacity), ws.WarmTier.empty(),
                     wall_time=time.time(), steps=0, policy=pool.policy.name)
    ws.write_warm_file(wf, path, fmt)


def warm_started(policy: str, n_keys: int, capacity: int, pack, path: str,
                 pool_fill: float, seed_heat: bool) -> ReplayPool:
    """A fresh pool preheated from ``path`` the way warmstart.preheat does it."""
    from tierstore.warmstart import load_hint
    wf = load_hint(path, pack)
    pool = ReplayPool(policy, n_keys, capacity)
    n = min(len(wf.pool), int(pool_fill * capacity))
    dense = wf.pool.keys[:n, 0] * pack.n_experts + wf.pool.keys[:n, 1]
    pool.admit(dense)
    if seed_heat:
        pool.policy.on_access(dense, weights=wf.pool.heat[:n])
    return pool


def bench_hits(args) -> dict:
    from tierstore.testing import make_random_pack
    ticks, n_layers, n_experts = load_trace(args.trace)
    n_keys = n_layers * n_experts
    warm_end = len(ticks) - args.steps if args.warmup is None else args.warmup
    if warm_end <= 0 or warm_end + args.steps > len(ticks):
        raise SystemExit(f"{args.trace}: {len(ticks)} ticks, cannot take {args.steps} "
                         f"after a warm-up of {warm_end}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        pack = make_random_pack(tmp, n_layers, n_experts, 64)
        for share in args.shares:
            cap = max(8, int(round(share * n_keys)))
            row = {"pool_share": share, "slots": cap}
            earlier = ReplayPool(args.policy, n_keys, cap)
            for keys in ticks[:warm_end]:
                earlier.step(keys)
            variants = {"cold": lambda: ReplayPool(args.policy, n_keys, cap)}
            for fmt in ("poolmon", "pool-heat"):
                path = os.path.join(tmp, f"{fmt}.json")
                replay_snapshot_file(earlier, pack, path, fmt)
                variants[f"warm_{fmt}"] = (lambda p=path: warm_started(
                    args.policy, n_keys, cap, pack, p, args.pool_fill, True))
            variants["warm_poolmon_no_heat_seed"] = lambda: warm_started(
                args.policy, n_keys, cap, pack, os.path.join(tmp, "poolmon.json"),
                args.pool_fill, False)
            for name, make in variants.items():
                pool = make()
                hits_at = {}
                for i, keys in enumerate(ticks[warm_end:warm_end + args.steps]):
                    pool.step(keys)
                    if i + 1 in (10, 100):
                        hits_at[i + 1] = pool.hit_rate
                row[name] = round(pool.hit_rate, 4)
                row[name + "_first10"] = round(hits_at[10], 4)
                row[name + "_first100"] = round(hits_at[100], 4)
                row[name + "_misses"] = pool.reads - pool.hits
            # upper bound: every key ever seen before stays resident (no capacity limit)
            seen = np.zeros(n_keys, bool)
            for keys in ticks[:warm_end]:
                seen[keys] = True
            hits = reads = 0
            for keys in ticks[warm_end:warm_end + args.steps]:
                hits += int(seen[keys].sum())
                reads += len(keys)
                seen[keys] = True
            row["unbounded_warm"] = round(hits / reads, 4)
            results.append(row)
    return {"bench": "warm_hits", "trace": args.trace, "policy": args.policy,
            "warmup_ticks": warm_end, "steps": args.steps, "pool_fill": args.pool_fill,
            "n_layers": n_layers, "n_experts": n_experts, "results": results}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=DEFAULT_TRACE)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=None,
                    help="ticks before the measured window (default: all the rest)")
    ap.add_argument("--policy", default="heat")
    ap.add_argument("--pool-fill", type=float, default=0.9)
    ap.add_argument("--shares", type=float, nargs="+", default=[0.1, 0.2, 0.4])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--preheat", action="store_true", help="GPU preheat timing instead")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--pool-gb", type=float, default=6.0)
    ap.add_argument("--slot-bytes", type=int, default=12 << 20)
    ap.add_argument("--dir", default=None,
                    help="where the preheat pack is written (default: a temp dir under the cwd)")
    args = ap.parse_args(argv)
    warnings.simplefilter("error")  # a warning here means the bench measured a cold start
    if args.preheat:
        from bench_warm_preheat import bench_preheat
        out = bench_preheat(args)
        print(json.dumps(out, indent=2))
        return 0
    out = bench_hits(args)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{out['trace']}: policy {out['policy']}, warm-up {out['warmup_ticks']} ticks, "
              f"measured {out['steps']} steps, pool_fill {out['pool_fill']}")
        cols = ["cold", "warm_poolmon", "warm_pool-heat", "warm_poolmon_no_heat_seed",
                "unbounded_warm"]
        print(f"{'slots':>6} " + " ".join(f"{c:>28}" for c in cols))
        for r in out["results"]:
            print(f"{r['slots']:>6} " + " ".join(
                f"{r[c]:>12.4f}" + (f" ({r[c + '_first10']:.3f} / {r[c + '_first100']:.3f})"
                                    if c + "_first10" in r else " " * 16) for c in cols))
        print("hit rate over all measured steps (first 10 / first 100 steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
