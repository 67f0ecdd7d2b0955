"""Demand fill under any policy plus the prefetcher (``tierstore.policies.prefetch``),
replayed at layer granularity in the order the live store runs it
(``tierstore.store.prefetch``): per (tick, layer) group, hits are counted, the
accesses reach the policy, the prefetcher releases what it held for the layer
and learns, its proposal is pinned and fetched (over the policy's victims,
never the group's keys or a pinned one, no admission filter: a prefetch is an
order), then the group's misses are demand-filled (the policy's own admission,
or ``admission``), the same keys protected. Models ``<policy>+prefetch``.

Counters: ``prefetched`` = rows the prefetcher read; ``prefetch_hits`` = those
read while still resident; ``wasted`` = evicted unread or never read;
``demand_reads`` = misses read. The latency view (``hit_rate``) counts an
access as a hit when resident when its layer reads: a prefetch counts only from
``lead`` layers after it was issued (the prefetcher never targets closer);
with a timed ``LeadTime`` (``tierstore.sim.leadtime``) only once it has landed
(``Counters.landed``), the decisions unchanged.
"""

from __future__ import annotations

import numpy as np

from tierstore.errors import ConfigError
from tierstore.policies.admission import ADMIT_ALL, Admission, for_policy
from tierstore.policies.base import Policy
from tierstore.policies.prefetch import Prefetcher
from tierstore.sim.counting import Counters, Prepared, score_group
from tierstore.sim.demand import Filler
from tierstore.sim.leadtime import Clock, LeadTime
from tierstore.sim.native_replay import native_prefetch_replay


def replay_prefetching(
    prep: Prepared,
    policy: Policy,
    slots: int,
    prefetcher: Prefetcher,
    admission: Admission | None = None,
    demand_fill: bool = True,
    lead_time: LeadTime | None = None,
    native: bool = True,
) -> Counters:
    """Counters of ``policy`` + ``prefetcher`` at ``slots`` (module doc).
    ``demand_fill=False``: misses are not read (served elsewhere: ``unserved``),
    the live store's record/step path without fires. ``lead_time`` timed: the
    latency view counts a resident row only once landed. ``native``: a fresh native
    policy (or auto) with the Prefetcher itself (not a subclass), untimed, runs in
    the C++ loop (``tierstore.sim.native_replay``, same results); False forces this
    Python loop (the tests' oracle)."""
    trace = prep.trace
    E = trace.n_experts
    if prefetcher.n_keys != prep.n_keys or prefetcher.capacity != int(slots):
        raise ConfigError(
            f"prefetch: prefetcher built for {prefetcher.n_keys} keys / "
            f"{prefetcher.capacity} slots, replay has {prep.n_keys} / {slots}"
        )
    adm = for_policy(policy) if admission is None else admission
    if lead_time is not None and lead_time.lead != prefetcher.lead:
        raise ConfigError(
            f"prefetch: lead time model has lead {lead_time.lead}, the prefetcher {prefetcher.lead}"
        )
    timed = lead_time is not None and lead_time.timed
    if native and not timed:
        cnt = native_prefetch_replay(prep, policy, slots, prefetcher, adm, demand_fill)
        if cnt is not None:
            return cnt
    prefetched = np.zeros(prep.n_keys, dtype=bool)  # read by prefetch, not yet read by a layer

    def evicted(v):
        tier.cnt.wasted += int(np.count_nonzero(prefetched[v]))
        prefetched[v] = False

    tier = Filler(prep, policy, slots, on_evict=evicted)
    cnt, resident, pinned, held = tier.cnt, tier.resident, tier.pinned, prefetcher.held_mask
    dkeys, dcounts, single = prep.dkeys, prep.dcounts, prep.all_single
    bounds, ends = prep.gstarts.tolist(), prep.g_tick_end.tolist()
    routings = np.add.reduceat(dcounts, prep.gstarts[:-1]) if dcounts.size else dcounts
    clock = Clock(lead_time, prep.n_keys) if timed else None
    if clock is not None:
        cnt.landed = np.zeros(prep.dkeys.size, dtype=bool)
    for g in range(len(bounds) - 1):
        a, b = bounds[g], bounds[g + 1]
        u = dkeys[a:b]
        layer = int(u[0]) // E
        r = score_group(cnt, resident, prefetched, u, a, b)
        if clock is not None:
            cnt.landed[a:b] = clock.landed(u, r)
        policy.on_access(u, None if single else dcounts[a:b])
        prefetcher.on_read(layer, u - layer * E, r, int(routings[g]))
        fetch, _hold = prefetcher.propose(layer, resident, tier.would_evict)
        np.copyto(pinned, held)  # the held keys block eviction as the store's pins do
        if fetch.size:
            got = tier.place(fetch, u, ADMIT_ALL, count_rejected=False)
            prefetched[got] = True
            cnt.prefetched += got.size
            if clock is not None:
                clock.issue(got)
        n_miss = r.size - int(np.count_nonzero(r))
        if n_miss:
            if demand_fill:
                miss = u[~r]
                cnt.demand_reads += n_miss
                if clock is not None:
                    clock.demand(miss)
                if n_miss > tier.n_free and adm.filters:
                    miss = policy.rank(miss)  # the hottest misses take the free slots
                tier.place(miss, u, adm)
            else:
                cnt.unserved += int(dcounts[a:b][~r].sum())
        pinned.fill(False)
        if clock is not None:
            clock.compute()
        if ends[g]:
            policy.decay()
            prefetcher.end_tick()
    cnt.wasted += int(np.count_nonzero(prefetched))
    return cnt


def replay_with_prefetch(
    prep: Prepared,
    base: Policy,
    slots: int,
    *,
    admission=None,
    demand_fill: bool = True,
    lead_time: LeadTime | None = None,
    native: bool = True,
    **prefetch_params,
) -> tuple[Counters, Prefetcher]:
    """``replay_prefetching`` with a fresh Prefetcher(``prefetch_params``) over
    ``base``; ``lead_time`` sets the prefetcher's ``lead`` too, the trace's
    ``top_k`` (meta.json) its ``top_k`` unless given; ``native`` as replay_prefetching's."""
    if lead_time is not None:
        prefetch_params = {**prefetch_params, "lead": lead_time.lead}
    top_k = prep.trace.meta.get("top_k") if isinstance(prep.trace.meta, dict) else None
    if "top_k" not in prefetch_params and isinstance(top_k, int) and top_k > 0:
        prefetch_params = {**prefetch_params, "top_k": top_k}
    pf = Prefetcher(prep.trace.n_layers, prep.trace.n_experts, int(slots), **prefetch_params)
    return replay_prefetching(prep, base, slots, pf, admission, demand_fill, lead_time, native), pf
