"""Bounds for the latency view's prefetch: how much a prefetcher could gain
with better prediction, under the same read budget and lead-time model.

Two prefetchers that see what a real one cannot (so never registered as policies):
- ``routes``: knows the target group's true routed experts (p = 1 for them, 0 for
  the rest): the ceiling for any predictor at this budget; the gap left is what
  the budget, the lead time and the pins cost;
- ``generator`` (synthetic traces only): knows the generator's latent state
  (each token's topic, the drifting logits) and predicts with the true routing
  probabilities (Gumbel top-k inclusion, Monte Carlo); any predictor that learns
  from the routes alone knows at most this, so it bounds how much cross-layer and
  next-token information the synthetic generator has.
Both run through the real Prefetcher's budget, calibration, ranking and pins
(only ``predict`` is replaced: tierstore.sim.prefetch_bound.ToldPrefetcher) and
the same replay (tierstore.sim.prefetching). The generator bound re-runs the
generator with a subclass that records its logits (it reads the router's
internals: analysis code, not library code).

    python3 bench/prefetch_bound.py --trace s0|s1|b4 --base auto
    python3 bench/prefetch_bound.py --trace flame --flame PATH/flame.npy --kinds routes
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from tierstore import policies, sim
from tierstore.sim import synth, traces
from tierstore.sim.prefetch_bound import ToldPrefetcher, routes_table
from tierstore.sim.prefetching import replay_prefetching
from tierstore.sim.runner import compare

SETTINGS = {  # synthetic settings: DS4 seeds 0 and 1, and a batched 32 x 128 top-8 one
    "s0": dict(n_ticks=256, seed=0, prefill_tokens=256, prefill_every=1024),
    "s1": dict(n_ticks=256, seed=1, prefill_tokens=256, prefill_every=1024),
    "b4": dict(
        n_ticks=128,
        batch=4,
        seed=2,
        prefill_tokens=128,
        prefill_every=64,
        n_layers=32,
        n_experts=128,
        top_k=8,
    ),
}
SLOTS = {"flame": [51, 102, 205], "s0": [1101, 2202, 4403], "s1": [1101, 2202, 4403], "b4": [410, 819, 1638]}


class _Recording(synth.SyntheticRouter):
    """The generator, recording each step's logits before the Gumbel noise (the
    same random stream, so the same trace)."""

    def _route(self, topics):
        logits = (self._base + self._drift)[:, None, :] + self._boost[topics].transpose(1, 0, 2)
        self.logits.append(logits.copy())
        logits += self._rng.gumbel(size=logits.shape)
        k = self.top_k
        top = np.argpartition(-logits, k - 1, axis=2)[:, :, :k]
        order = np.argsort(-np.take_along_axis(logits, top, axis=2), axis=2)
        return np.take_along_axis(top, order, axis=2).astype(np.int32)


def generator_table(setting: dict, samples: int = 128, seed: int = 12345) -> tuple:
    """(trace, {(tick, layer): P(routed by the tick's tokens)}) from the generator's
    own logits (Monte Carlo inclusion probability of Gumbel top-k)."""
    s = dict(setting)
    n_ticks, batch = s.pop("n_ticks"), s.pop("batch", 1)
    pt, pe = s.pop("prefill_tokens"), s.pop("prefill_every")
    shape = {k: s.pop(k) for k in ("n_layers", "n_experts", "top_k") if k in s}
    trace = synth.synthetic_trace(n_ticks, batch=batch, prefill_tokens=pt, prefill_every=pe, **shape, **s)
    router = _Recording(seed=s["seed"], **shape)
    router.logits = []
    ids = []
    for t in range(n_ticks):
        is_prefill = pt > 0 and (t == 0 or (pe > 0 and t % pe == 0))
        ids.append((router.prefill(pt) if is_prefill else router.step(batch)).reshape(-1))
    if not np.array_equal(np.concatenate(ids), trace.experts):
        raise RuntimeError("the recording generator did not reproduce the trace")
    rng = np.random.default_rng(seed)
    k = router.top_k
    table = {}
    for t, lg in enumerate(router.logits):  # [L, tokens, E]
        L, T, E = lg.shape
        n = max(samples // T, 8) if T > 1 else samples
        absent = np.zeros((L, E))
        for tok in range(T):
            z = lg[:, tok, None, :] + rng.gumbel(size=(L, n, E))
            kth = np.partition(-z, k - 1, axis=2)[:, :, k - 1 : k]
            incl = (-z <= kth).mean(axis=1)  # [L, E]
            absent += np.log1p(-np.minimum(incl, 1 - 1e-9))
        p = 1.0 - np.exp(absent)
        for layer in range(L):
            table[(t, layer)] = p[layer]
    return trace, table


def run(label: str, base: str, kinds: list[str], read_ratio: float = 1.0, flame=None) -> list:
    if label == "flame":
        trace, gen = traces.load_trace(flame), None
    else:
        trace, gen = (
            generator_table(SETTINGS[label])
            if "generator" in kinds
            else (synth.synthetic_trace(**SETTINGS[label]), None)
        )
    prep = sim.Prepared(trace)
    top_k = trace.meta.get("top_k")
    results = sim.replay(prep, ["lru", "belady", base, f"{base}+prefetch"], SLOTS[label])
    tables = {"routes": routes_table(prep)} if "routes" in kinds else {}
    if gen is not None:
        tables["generator"] = gen
    for slots in SLOTS[label]:
        for kind, table in tables.items():
            t0 = time.perf_counter()
            pf = ToldPrefetcher(
                table, trace.n_layers, trace.n_experts, slots, read_ratio=read_ratio, top_k=top_k
            )
            cnt = replay_prefetching(
                prep, policies.make(base, trace.n_keys, slots, prefetching=True), slots, pf
            )
            r = cnt.result(f"{base}+{kind}-bound", slots, prep, 0, time.perf_counter() - t0)
            results.append(r)
    compare(results)
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", choices=["flame", "s0", "s1", "b4"], required=True)
    ap.add_argument(
        "--flame", default=None, help="the FLAME-MoE-290M routing trace (.npy), for --trace flame"
    )
    ap.add_argument("--base", default="auto")
    ap.add_argument("--kinds", default="routes,generator")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.trace == "flame" and a.flame is None:
        ap.error("--trace flame needs --flame PATH (the FLAME-MoE-290M routing trace)")
    res = run(a.trace, a.base, a.kinds.split(","), flame=a.flame)
    if a.json:
        json.dump([r.as_dict() for r in res], sys.stdout, indent=1)
        return 0
    for r in res:
        print(
            f"{r.policy:26s} {r.slots:5d} latency {r.latency_hit_rate:.4f} reads/LRU "
            f"{(r.reads_vs_lru or 0):.4f} "
            f"gap {'' if r.latency_gap_closed is None else round(r.latency_gap_closed, 3)} "
            f"prefetched {r.prefetched} useful {r.prefetch_hits} wasted {r.wasted_prefetch}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
