"""The ``predict`` model: demand fill under a base policy (``hybrid``) plus
prefetch of the experts the routing so far predicts, learned online.

Predictor (``tierstore.policies.corouting``, the live prefetcher's model,
native), per pair of consecutive layers, decayed
counts (half-life ``half_life`` ticks, lazy global gain as in heat.py):
- cross-layer: ``C[l, f, e]`` = how often expert f at layer l and expert e at
  layer l+1 were routed by the same token. After layer l reads the slot table
  at tick t, P(e at l+1 | layer l's experts F) = sum_f C[l,f,e] / sum_f N[l,f]
  (a pooled mixture over the k experts of F; sums to top_k over e), shrunk
  toward layer l+1's marginal routing frequency with the weight of
  ``prior_weight`` observations so that a pair seen twice is not "certain".
- next-token: ``T[l, g, e]`` = expert g at layer l at tick t-1 and e at layer l
  at tick t; the same pooled estimate from layer l+1's experts at t-1.
- the two are mixed with weights learned online: each predictor's share is
  its decayed mean probability mass on what was actually routed.

Prefetch, at each (tick, layer l) after its reads and demand fill: the
non-resident experts of layer l+1 with predicted probability >= ``threshold``,
best first, up to the read budget (``budget`` rows per tick, handed out as
budget / n_layers per layer with carry-over, never more than ``budget`` in
one go), each displacing the base policy's victim (keys of the current layer
and keys predicted for the next one are pinned). Timing assumption: a
prefetch issued while layer l computes lands before layer l+1 reads (one
layer of lead time); traces at prefill-like rates make that optimistic.

Accounting: prefetched rows are reads; a prefetch is a hit when first read
while resident, wasted when evicted before use or never used.
"""

from __future__ import annotations

import numpy as np

from tierstore import policies as _policies
from tierstore.errors import ConfigError
from tierstore.policies.admission import ADMIT_ALL, PolicyFilter, for_policy
from tierstore.policies.base import Policy
from tierstore.policies.corouting import check_tables_fit
from tierstore.policies.fill import plan_lazy
from tierstore.policies.native import native_module
from tierstore.sim.counting import score_group
from tierstore.sim.demand import Filler, hottest_nonresident
from tierstore.sim.native_replay import native_predict_replay

LAZY_PER_TICK = 8  # the reference manager's promotions per pass


def replay_predict(
    prep,
    slots: int,
    *,
    budget: int = 8,
    granularity: str = "layer",
    base: str = "hybrid",
    threshold: float = 0.2,
    half_life: float = 512.0,
    prior_weight: float = 4.0,
    use_cross: bool = True,
    use_temporal: bool = True,
    demand_fill: bool = True,
    native: bool = True,
    **base_params,
):
    """Demand fill under ``base`` plus predicted prefetch; returns sim counters.
    ``demand_fill=False`` (the ``prefetch`` model): misses are served from
    elsewhere (the 2-bit base, as in the reference); the reads are the
    predicted prefetches plus, at each tick end, a reference-style lazy pass
    (at most 8, hottest first by the base policy) with the tick's unused
    budget, so a tick never reads more than ``budget`` rows. ``native``: both models over
    a fresh native base run in C++ (``tierstore._C.replay_predict``, same results); False
    runs this Python loop."""
    if granularity != "layer":
        raise ConfigError(
            "policy 'predict' needs granularity 'layer' (it prefetches "
            "the next layer while the current one runs)"
        )
    if budget < 0 or not (0.0 <= threshold <= 1.0):
        raise ConfigError(f"predict: budget must be >= 0 and threshold in [0, 1], got {budget}, {threshold}")
    trace = prep.trace
    L, E = trace.n_layers, trace.n_experts
    policy: Policy = _policies.make(base, prep.n_keys, slots, **base_params)
    check_tables_fit(L, E, "predict")
    pred = native_module().CoRouting(L, E, 1, half_life, prior_weight)
    top_k = max(int(np.median(np.diff(prep.gstarts))) if prep.gstarts.size > 1 else 1, 1)
    if native:
        cnt = native_predict_replay(
            prep, policy, pred, slots, budget, threshold, use_cross, use_temporal, top_k, demand_fill
        )
        if cnt is not None:
            return cnt
    prefetched = np.zeros(prep.n_keys, dtype=bool)  # admitted by prefetch, not yet read

    def wasted(v):
        tier.cnt.wasted += int(np.count_nonzero(prefetched[v]))
        prefetched[v] = False

    tier = Filler(prep, policy, slots, on_evict=wasted)
    cnt, resident, pinned = tier.cnt, tier.resident, tier.pinned
    adm = for_policy(policy)
    dkeys, dcounts, single = prep.dkeys, prep.dcounts, prep.all_single
    gstarts, tick_end, dlayer, dtick = prep.gstarts, prep.g_tick_end, prep.dlayer, prep.dtick
    prev_tick_experts: list[np.ndarray | None] = [None] * L  # layer -> experts at t-1
    this_tick_experts: list[np.ndarray | None] = [None] * L
    allowance, per_layer = 0.0, budget / max(L, 1)
    pending_pred = None  # (layer, p_cross, p_temp) predicted for the next group
    tick_reads = 0

    def lazy_promote(t: int, n: int) -> None:
        """The reference's lazy pass with the tick's unused budget: the hottest
        non-resident keys by the base policy's scores, into free slots or over
        victims not used this tick when ``policy.admit`` agrees (counted as
        demand reads: they are not predictions)."""
        used = dkeys[prep.dstarts[t] : prep.dstarts[t + 1]]
        pinned[used] = True
        fill = plan_lazy(
            policy,
            hottest_nonresident(policy.scores(), resident, n),
            n,
            tier.n_free,
            pinned,
            PolicyFilter(policy),
        )
        pinned[used] = False
        tier.evict(fill.victims)
        tier.admit(fill.keys)
        cnt.demand_reads += len(fill.keys)

    for g in range(gstarts.size - 1):
        a, b = gstarts[g], gstarts[g + 1]
        u = dkeys[a:b]
        layer, t = int(dlayer[a]), int(dtick[a])
        experts = u - layer * E
        r = score_group(cnt, resident, prefetched, u, a, b)
        # 1. learn from what this layer routed, and score the prediction made for it
        if pending_pred is not None and pending_pred[0] == layer:
            pred.score(pending_pred[1], pending_pred[2], experts, top_k)
        if layer > 0 and this_tick_experts[layer - 1] is not None:
            pred.learn(layer - 1, this_tick_experts[layer - 1], experts, temporal=False)
        if prev_tick_experts[layer] is not None:
            pred.learn(layer, prev_tick_experts[layer], experts, temporal=True)
        this_tick_experts[layer] = experts
        pred.observe(layer, experts)
        # 2. demand fill (the Filler of replay_demand_fill, one access call per group)
        policy.on_access(u, None if single else dcounts[a:b])
        if demand_fill:
            if not r.all():
                tier.demand(u, r, adm)
        else:
            cnt.unserved += int(dcounts[a:b][~r].sum())
        # 3. predict layer+1 at this tick and prefetch within the budget
        pending_pred = None
        allowance = min(allowance + per_layer, float(max(budget, 0)))
        nxt = layer + 1
        if nxt < L:
            p_cross = pred.predict(layer, experts, temporal=False) if use_cross else None
            src_t = prev_tick_experts[nxt]
            p_temp = pred.predict(nxt, src_t, temporal=True) if use_temporal and src_t is not None else None
            if p_cross is not None or p_temp is not None:
                p = pred.mix(p_cross, p_temp)
                pending_pred = (nxt, p_cross, p_temp)
                n_take = min(int(allowance), budget - tick_reads)  # never over budget a tick
                if n_take > 0:
                    keys = nxt * E + np.flatnonzero(p >= max(threshold, 1e-12))
                    want = keys[~resident[keys]]
                    if want.size:
                        want = want[np.argsort(-p[want - nxt * E], kind="stable")][:n_take]
                        pinned[keys] = True  # the next layer's predicted keys stay
                        want = tier.place(want, u, ADMIT_ALL, count_rejected=False)
                        pinned[keys] = False
                        prefetched[want] = True
                        cnt.prefetched += want.size
                        tick_reads += want.size
                        allowance -= want.size
        if tick_end[g]:
            if not demand_fill and budget > tick_reads:
                lazy_promote(t, min(budget - tick_reads, LAZY_PER_TICK))
                allowance = 0.0  # the lazy pass spent what the layers left
            tick_reads = 0
            prev_tick_experts, this_tick_experts = this_tick_experts, [None] * L
            policy.decay()
            pred.tick()
    cnt.wasted += int(np.count_nonzero(prefetched))
    return cnt
