"""Warm-start benchmarks.

Hit rate (default; CPU, seconds): replay a routing trace through the policy
classes the live store uses, one global pool over all (layer, expert) keys,
every read counted, misses admitted. The trace is ``--trace T.npy`` (e.g. vLLM-Moet's
FLAME-MoE-290M capture) or, by default, a synthetic one of the same shape (8 layers x 64
experts, top-6, 2048 ticks; tierstore.sim.synth).
The first ``--warmup`` ticks produce a poolmon snapshot (written and read back
through the real warm-start file path against a real pack of the trace's
geometry); then the next ``--steps`` ticks are replayed cold and warm-started.

    python bench/bench_warm.py [--trace T.npy] [--steps 1000] [--policy heat] [--json]

Snapshot cost (CPU): ``--snapshot`` times one DS4-sized poolmon snapshot: the
part under the store's lock, the encoding and the atomic write.

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


# ------------------------------------------------------------------ trace replay
def load_trace(path: str | None):
    """(per-tick dense key arrays, n_layers, n_experts, Trace): the trace at ``path``, or
    with None a synthetic one of FLAME-MoE-290M's shape."""
    from tierstore.sim.synth import synthetic_trace
    from tierstore.sim.traces import load_trace as _load

    trace = (
        _load(path) if path else synthetic_trace(2048, n_layers=8, n_experts=64, top_k=6, prefill_tokens=0)
    )
    keys, starts = trace.keys, trace.tick_starts
    ticks = [keys[starts[i] : starts[i + 1]] for i in range(starts.size - 1)]
    return ticks, trace.n_layers, trace.n_experts, trace


def sim_window(trace, first_tick: int, n_ticks: int):
    """The measured window as its own Trace, for tierstore.sim's cold references."""
    from tierstore.sim.traces import Trace

    starts = trace.tick_starts
    a, b = int(starts[first_tick]), int(starts[first_tick + n_ticks])
    return Trace(
        trace.ticks[a:b],
        trace.layers[a:b],
        trace.experts[a:b],
        trace.layer_ids,
        trace.n_experts,
        f"{trace.name}[{first_tick}:{first_tick + n_ticks}]",
    )


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
        """Make ``keys`` resident: free slots first, then the policy's victims
        (never a ``pinned`` key), through its admission filter when it has one
        (the same order of calls as tierstore.sim's demand fill)."""
        from tierstore.policies.base import Policy

        keys = keys[~self.resident[keys]]
        if not len(keys):
            return
        free = max(self.capacity - int(self.resident.sum()), 0)
        if len(keys) > free:
            filters = type(self.policy).admit is not Policy.admit
            if filters:
                keys = self.policy.rank(keys)  # the hottest misses take the free slots
            victims = self.policy.victims(len(keys) - free, pinned=pinned)
            contenders = keys[free : free + len(victims)]
            if filters and len(victims):
                ok = np.asarray(self.policy.admit(contenders, victims), dtype=bool)
                victims, contenders = victims[ok], contenders[ok]
            keys = np.concatenate((keys[:free], contenders))
            if len(victims):
                self.policy.on_evict(victims)
                self.resident[victims] = False
        if len(keys):
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
    from tierstore import warm as ws

    res = np.flatnonzero(pool.resident)
    heat = pool.policy.scores()[res]
    order = np.argsort(-heat, kind="stable")
    E = pack.n_experts
    keys = np.stack([res[order] // E, res[order] % E], axis=1)
    wf = ws.WarmFile(
        "<replay>",
        "poolmon",
        ws.PackIdentity.of_pack(pack),
        ws.WarmTier(keys, heat[order], pool.capacity),
        ws.WarmTier.empty(),
        wall_time=time.time(),
        steps=0,
        policy=pool.policy.name,
    )
    ws.write_warm_file(wf, path, fmt)


def warm_started(
    policy: str, n_keys: int, capacity: int, pack, path: str, pool_fill: float, seed_heat
) -> ReplayPool:
    """A fresh pool preheated from ``path`` the way warmstart.preheat does it;
    ``seed_heat``: True (preheat's scaled seed), "raw" (the file's heat), False."""
    from tierstore.warm import load_hint

    wf = load_hint(path, pack)
    pool = ReplayPool(policy, n_keys, capacity)
    n = min(len(wf.pool), int(pool_fill * capacity))
    dense = wf.pool.keys[:n, 0] * pack.n_experts + wf.pool.keys[:n, 1]
    pool.admit(dense)
    if seed_heat == "raw":
        pool.policy.on_access(dense, weights=wf.pool.heat[:n])
    elif seed_heat:
        from tierstore.warm.preheat import seed_weights

        pool.policy.on_access(dense, weights=seed_weights(wf.pool.heat[:n]))
    return pool


def live_store_replay(pack, ticks, cap: int, policy: str, warm_src=None, pool_fill: float = 0.9) -> float:
    """The same window through a real ExpertStore on the CPU pool: record the
    routing, fire (demand fill: every routed miss promoted), release, step; no
    lazy promotions. ``warm_src`` goes through ``ExpertStore(warm_start=...)``
    semantics via ``store.preheat``. Returns the store's own pool hit rate."""
    from tierstore.store.expert_store import ExpertStore

    E = pack.n_experts
    with ExpertStore(
        pack,
        vram_slots=cap,
        ram_gb=0.0,
        device="cpu",
        policy=policy,
        lazy_per_step=0,
        max_promote=pack.n_layers * E,
        force=True,
    ) as store:
        if warm_src is not None:
            store.preheat(warm_src, pool_fill=pool_fill, progress=False)
        base = store.stats().pool
        for keys in ticks:
            layer, expert = keys // E, keys % E
            for l in np.unique(layer):
                store.record(int(l), expert[layer == l].reshape(-1, 1))
            store.release(store.fire(np.stack([layer, expert], axis=1)))
            store.step()
        st = store.stats().pool
    hits, misses = st.hits - base.hits, st.misses - base.misses
    return hits / max(hits + misses, 1)


def bench_hits(args) -> dict:
    from tierstore import sim
    from tierstore.testing.packs import make_random_pack

    ticks, n_layers, n_experts, trace = load_trace(args.trace)
    n_keys = n_layers * n_experts
    warm_end = len(ticks) - args.steps if args.warmup is None else args.warmup
    if warm_end <= 0 or warm_end + args.steps > len(ticks):
        raise SystemExit(
            f"{args.trace or trace.name}: {len(ticks)} ticks, cannot take {args.steps} "
            f"after a warm-up of {warm_end}"
        )
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
                variants[f"warm_{fmt}"] = lambda p=path: warm_started(
                    args.policy, n_keys, cap, pack, p, args.pool_fill, True
                )
            variants["warm_poolmon_raw_heat_seed"] = lambda: warm_started(
                args.policy, n_keys, cap, pack, os.path.join(tmp, "poolmon.json"), args.pool_fill, "raw"
            )
            variants["warm_poolmon_no_heat_seed"] = lambda: warm_started(
                args.policy, n_keys, cap, pack, os.path.join(tmp, "poolmon.json"), args.pool_fill, False
            )
            for name, make in variants.items():
                pool = make()
                hits_at = {}
                for i, keys in enumerate(ticks[warm_end : warm_end + args.steps]):
                    pool.step(keys)
                    if i + 1 in (10, 100):
                        hits_at[i + 1] = pool.hit_rate
                row[name] = round(pool.hit_rate, 4)
                row[name + "_first10"] = round(hits_at[10], 4)
                row[name + "_first100"] = round(hits_at[100], 4)
                row[name + "_misses"] = pool.reads - pool.hits
            # tierstore.sim on the same window, cold, tick granularity (a step's
            # keys all known and pinned, like this replay and a fire): the same
            # policy (must equal our cold replay), Belady's MIN, the unbounded
            # cache; and the sim's layer-by-layer model of the same policy.
            window = sim_window(trace, warm_end, args.steps)
            for r in sim.replay(window, (args.policy, "belady", "unbounded"), (cap,), granularity="tick"):
                row[f"sim_{r.policy}_cold"] = round(r.hit_rate, 4)
            for r in sim.replay(window, (args.policy,), (cap,), granularity="layer"):
                row[f"sim_{r.policy}_cold_layer_granular"] = round(r.hit_rate, 4)
            row["replay_matches_sim"] = row["cold"] == row[f"sim_{args.policy}_cold"]
            if args.live:
                window_ticks = ticks[warm_end : warm_end + args.steps]
                row["live_store_cold"] = round(live_store_replay(pack, window_ticks, cap, args.policy), 4)
                row["live_store_warm_poolmon"] = round(
                    live_store_replay(
                        pack,
                        window_ticks,
                        cap,
                        args.policy,
                        os.path.join(tmp, "poolmon.json"),
                        args.pool_fill,
                    ),
                    4,
                )
            results.append(row)
    return {
        "bench": "warm_hits",
        "trace": args.trace or trace.name,
        "policy": args.policy,
        "warmup_ticks": warm_end,
        "steps": args.steps,
        "pool_fill": args.pool_fill,
        "n_layers": n_layers,
        "n_experts": n_experts,
        "results": results,
    }


def bench_snapshot(args) -> dict:
    """Cost of one DS4-sized snapshot (43 x 256 keys, 512-slot pool, 2,048-row
    arena; 1,000-byte rows so it fits any machine): the part under the store's
    lock (``snapshot``), then encoding and the atomic write outside it."""
    from tierstore import warm as ws
    from tierstore.store.expert_store import ExpertStore
    from tierstore.testing.packs import make_random_pack

    L, E = 43, 256
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(dir=args.dir or ".", prefix=".bench-warm-") as tmp:
        pack = make_random_pack(tmp, L, E, 1000)
        with ExpertStore(
            pack, vram_slots=512, ram_gb=2048 * pack.stride / 2**30, device="cpu", lazy_per_step=0
        ) as store:
            hot = rng.permutation(L * E)[:2048]
            store.load_arena(np.stack([hot // E, hot % E], axis=1))
            store.promote(np.stack([hot[:512] // E, hot[:512] % E], axis=1)).wait()
            for layer in range(L):
                store.record(layer, rng.integers(0, E, size=(64, 6)))
            store.step()
            times = {"locked_snapshot_ms": [], "encode_ms": [], "write_ms": []}
            path = os.path.join(tmp, "poolmon.json")
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                snap = ws.snapshot(store)
                t1 = time.perf_counter()
                data = ws.encode(ws.to_poolmon(snap))
                t2 = time.perf_counter()
                ws.write_atomic(path, data)
                t3 = time.perf_counter()
                for k, v in zip(times, (t1 - t0, t2 - t1, t3 - t2)):
                    times[k].append(v * 1e3)
    return {
        "bench": "warm_snapshot",
        "keys": L * E,
        "pool_owners": len(snap.pool),
        "arena_owners": len(snap.arena),
        "file_bytes": len(data),
        "repeat": args.repeat,
        **{k: round(float(np.median(v)), 3) for k, v in times.items()},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--trace",
        default=None,
        help="routing trace .npy (default: a synthetic one of FLAME-MoE-290M's shape)",
    )
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument(
        "--warmup", type=int, default=None, help="ticks before the measured window (default: all the rest)"
    )
    ap.add_argument("--policy", default="heat")
    ap.add_argument("--pool-fill", type=float, default=0.9)
    ap.add_argument("--shares", type=float, nargs="+", default=[0.1, 0.2, 0.4])
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--no-live",
        dest="live",
        action="store_false",
        help="skip the replay through a real ExpertStore (CPU pool)",
    )
    ap.add_argument("--preheat", action="store_true", help="GPU preheat timing instead")
    ap.add_argument(
        "--snapshot",
        action="store_true",
        help="cost of one DS4-sized snapshot (lock hold, encode, write) instead",
    )
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--pool-gb", type=float, default=6.0)
    ap.add_argument("--slot-bytes", type=int, default=12 << 20)
    ap.add_argument(
        "--dir", default=None, help="where the preheat pack is written (default: a temp dir under the cwd)"
    )
    args = ap.parse_args(argv)
    warnings.simplefilter("error")  # a warning here means the bench measured a cold start
    if args.snapshot:
        print(json.dumps(bench_snapshot(args), indent=2))
        return 0
    if args.preheat:
        from bench_warm_preheat import bench_preheat

        out = bench_preheat(args)
        print(json.dumps(out, indent=2))
        return 0
    out = bench_hits(args)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(
            f"{out['trace']}: policy {out['policy']}, warm-up {out['warmup_ticks']} ticks, "
            f"measured {out['steps']} steps, pool_fill {out['pool_fill']}"
        )
        cols = [
            "cold",
            "warm_poolmon",
            "warm_pool-heat",
            "warm_poolmon_raw_heat_seed",
            "warm_poolmon_no_heat_seed",
            "sim_belady_cold",
            "sim_unbounded_cold",
        ]
        cols += [c for c in ("live_store_cold", "live_store_warm_poolmon") if c in out["results"][0]]
        print(f"{'slots':>6} " + " ".join(f"{c:>28}" for c in cols))
        for r in out["results"]:
            print(
                f"{r['slots']:>6} "
                + " ".join(
                    f"{r[c]:>12.4f}"
                    + (
                        f" ({r[c + '_first10']:.3f} / {r[c + '_first100']:.3f})"
                        if c + "_first10" in r
                        else " " * 16
                    )
                    for c in cols
                )
            )
        print("hit rate over all measured steps (first 10 / first 100 steps); sim_* = tierstore.sim, cold")
        if not all(r["replay_matches_sim"] for r in out["results"]):
            print("WARNING: the cold replay differs from tierstore.sim's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
