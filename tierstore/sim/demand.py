"""The simulator's fill models, all deciding through ``tierstore.policies.fill``
(the routine the live store's slot reservation and lazy promotions use):

- ``replay_demand_fill``: every miss is read on demand and offered a slot
  (the store's fire at ``admission=ADMIT_ALL``; the policy's own admission
  filter otherwise, a rejected miss being read for this use only);
- ``replay_lazy``: misses are not read (served elsewhere: ``unserved``); once
  per tick a background pass promotes up to ``cap`` candidates, each over a
  victim only when hotter than it (the store's ``step()`` with
  ``lazy_per_step = cap``, and, with candidates drawn from the hottest
  non-resident keys, vLLM-Moet's reference manager).

``Filler`` is the resident mask + counters both share, and the predictor's
replay (``tierstore.sim.predict``) builds on it.
"""

from __future__ import annotations

import numpy as np

from tierstore.errors import ConfigError
from tierstore.policies.admission import ADMIT_ALL, Admission, HotterThanVictim, for_policy
from tierstore.policies.base import Policy
from tierstore.policies.fill import plan_fill, plan_lazy
from tierstore.sim.counting import Counters, Prepared
from tierstore.sim.native_replay import native_filter, native_lazy_replay, replay_min_native, replay_native


class Filler:
    """A simulated tier: resident mask, free count and counters around one policy.
    ``on_evict``: optional callback(victims) before the policy hears of them."""

    def __init__(self, prep: Prepared, policy: Policy, slots: int, on_evict=None):
        self.prep, self.policy, self.slots = prep, policy, int(slots)
        self.cnt = Counters(prep)
        self.resident = np.zeros(prep.n_keys, dtype=bool)
        self.pinned = np.zeros(prep.n_keys, dtype=bool)
        self.n_res = 0
        self._on_evict = on_evict

    @property
    def n_free(self) -> int:
        return max(self.slots - self.n_res, 0)

    def place(
        self, cand: np.ndarray, block: np.ndarray | None, admission: Admission, count_rejected: bool = True
    ):
        """Plan and apply the fill of ``cand`` (``block``: keys that may not be victims).
        Returns the keys admitted; ``cnt.rejected`` grows by those turned away
        (unless ``count_rejected`` is False: a prefetch left out is not read)."""
        if block is not None and len(block):
            self.pinned[block] = True
            fill = plan_fill(self.policy, cand, self.n_free, self.pinned, admission)
            self.pinned[block] = False
        else:
            fill = plan_fill(self.policy, cand, self.n_free, None, admission)
        if count_rejected:
            self.cnt.rejected += fill.rejected
        self.evict(fill.victims)
        self.admit(fill.keys)
        return fill.keys

    def would_evict(self, n: int, blocked: np.ndarray) -> np.ndarray:
        """The keys ``n`` new rows would evict, in fill order (-1: a free slot), none
        set in ``blocked`` (the prefetcher's victim query; changes nothing)."""
        nf = min(self.n_free, int(n))
        v = np.asarray(self.policy.victims(int(n) - nf, blocked), dtype=np.int64)
        return np.concatenate((np.full(nf, -1, dtype=np.int64), v)) if nf else v

    def evict(self, v: np.ndarray) -> None:
        if len(v):
            if self._on_evict is not None:
                self._on_evict(v)
            self.resident[v] = False
            self.policy.on_evict(v)
            self.cnt.evictions += len(v)
            self.n_res -= len(v)

    def admit(self, keys: np.ndarray) -> None:
        if len(keys):
            self.resident[keys] = True
            self.policy.on_admit(keys)
            self.n_res += len(keys)

    def demand(self, u: np.ndarray, r: np.ndarray, admission: Admission) -> None:
        """The group ``u`` (resident mask ``r``) read; read and offer a slot to its misses."""
        n_miss = r.size - int(np.count_nonzero(r))
        miss = u[~r] if n_miss < r.size else u
        self.cnt.demand_reads += n_miss
        if n_miss > self.n_free and admission.filters:
            miss = self.policy.rank(miss)  # the hottest misses take the free slots
        # A group that missed entirely has no resident key to protect.
        self.place(miss, u if n_miss < r.size else None, admission)


def replay_demand_fill(
    prep: Prepared,
    policy: Policy,
    slots: int,
    granularity: str = "layer",
    admission: Admission | None = None,
    native: bool = True,
) -> Counters:
    """Demand fill through ``policy``; ``admission`` defaults to the policy's own
    filter (``ADMIT_ALL`` is the store's fire). ``native``: run lru / heat / hybrid /
    phase / auto and Belady's MIN (both forms) through the C++ loops
    (``tierstore.sim.native_replay``, same results, 10-100x faster); False forces this
    Python loop (the tests' oracle).

    ``granularity="layer"`` (default): each (tick, layer) reads the slot table
    in turn; its misses are filled before the next layer reads, evicting any key
    but the layer's own (a layer-by-layer forward that blocks on a miss; no
    knowledge of later layers' routing). ``"tick"``: a tick's keys are all known
    first and all pinned while its misses are filled (a fire over the step).

    Accesses reach the policy lazily, as one ``on_access`` per run of groups up
    to the next miss (and at each tick end, before ``decay``): no decay or
    decision happens in between, and within a tick later layers have larger
    keys, so every policy ends in the same state as with one call per group;
    a policy with ``groups_accesses = False`` (auto) gets one call per group."""
    if granularity not in ("layer", "tick"):
        raise ConfigError(f"granularity must be 'layer' or 'tick', got {granularity!r}")
    adm = for_policy(policy) if admission is None else admission
    filter_ = native_filter(policy, adm) if native else None
    if filter_ is not None:
        cnt = replay_native(prep, policy, slots, granularity, filter_)
        if cnt is not None:
            return cnt
    if native:
        cnt = replay_min_native(prep, policy, slots, granularity, adm)
        if cnt is not None:
            return cnt
    tier = Filler(prep, policy, slots)
    resident, hit = tier.resident, tier.cnt.hit
    dkeys, dcounts, single = prep.dkeys, prep.dcounts, prep.all_single
    if granularity == "layer":
        starts, ends_tick = prep.gstarts, prep.g_tick_end
    else:
        starts, ends_tick = prep.dstarts, np.ones(prep.n_ticks, dtype=bool)
    bounds = starts.tolist()
    ends = ends_tick.tolist()
    merge = getattr(policy, "groups_accesses", True)  # False: one on_access per group
    pending = 0  # start of the accesses not yet given to the policy
    for g in range(len(bounds) - 1):
        a, b = bounds[g], bounds[g + 1]
        u = dkeys[a:b]
        r = resident[u]
        hit[a:b] = r
        if not merge:
            policy.on_access(u, None if single else dcounts[a:b])
            pending = b
            if not r.all():
                tier.demand(u, r, adm)
        elif not r.all():
            policy.on_access(dkeys[pending:b], None if single else dcounts[pending:b])
            pending = b
            tier.demand(u, r, adm)
        if ends[g]:
            if pending < b:
                policy.on_access(dkeys[pending:b], None if single else dcounts[pending:b])
                pending = b
            policy.decay()
    return tier.cnt


def hottest_nonresident(scores: np.ndarray, resident: np.ndarray, n: int) -> np.ndarray:
    """The ``n`` non-resident keys of highest score > 0, ties to the lower key id, in
    ascending key order (the fill then ranks them, stably: so the order is defined, and
    the native lazy replay of csrc/store/src/lazy_replay.cpp picks the same keys)."""
    cand = np.flatnonzero((scores > 0) & ~resident)
    if cand.size <= n:
        return cand
    if n <= 0:
        return cand[:0]
    s = scores[cand]
    nth = np.partition(s, cand.size - n)[cand.size - n]  # the n-th highest score
    above = s > nth
    ties = np.flatnonzero(s == nth)[: n - int(np.count_nonzero(above))]
    above[ties] = True
    return cand[above]


def replay_lazy(
    prep: Prepared,
    policy: Policy,
    slots: int,
    cap: int,
    *,
    candidates: str = "seen",
    admission: Admission | None = None,
    native: bool = True,
) -> Counters:
    """Lazy promotion only (see module doc). ``candidates="seen"``: this tick's
    misses, and the tick's keys may be evicted (the store's step(): nothing is
    pinned between steps); ``"hottest"``: the hottest non-resident keys by the
    policy's scores, never evicting a key used this tick (the reference).
    ``native``: a fresh native policy under the default admission runs in C++
    (``tierstore._C.replay_lazy``, same results); False forces this Python loop."""
    if candidates not in ("seen", "hottest"):
        raise ConfigError(f"candidates must be 'seen' or 'hottest', got {candidates!r}")
    if native and admission is None:
        cnt = native_lazy_replay(prep, policy, slots, cap, candidates == "hottest")
        if cnt is not None:
            return cnt
    adm = HotterThanVictim(policy) if admission is None else admission
    tier = Filler(prep, policy, slots)
    resident, cnt = tier.resident, tier.cnt
    dkeys, dcounts, single = prep.dkeys, prep.dcounts, prep.all_single
    bounds = prep.dstarts.tolist()
    for i in range(prep.n_ticks):
        a, b = bounds[i], bounds[i + 1]
        u = dkeys[a:b]
        r = resident[u]
        cnt.hit[a:b] = r
        cnt.unserved += int(dcounts[a:b][~r].sum())
        policy.on_access(u, None if single else dcounts[a:b])
        if candidates == "seen":
            policy.decay()  # the store's step(): fold, decay, then pick
            fill = plan_lazy(policy, u[~r], cap, tier.n_free, None, adm)
            cnt.rejected += fill.rejected
            # The store then takes slots for the admitted keys (SlotStates.take: the
            # coldest victims, no admission), which are not the pairs' victims when a
            # pair before the last was turned away (an order unlike the scores: blend).
            fill = plan_fill(policy, fill.keys, tier.n_free, None)
            fill.rejected = 0
        else:
            tier.pinned[u] = True
            fill = plan_lazy(
                policy,
                hottest_nonresident(policy.scores(), resident, cap),
                cap,
                tier.n_free,
                tier.pinned,
                adm,
            )
            tier.pinned[u] = False
            policy.decay()
        cnt.rejected += fill.rejected
        tier.evict(fill.victims)
        tier.admit(fill.keys)
        cnt.demand_reads += len(fill.keys)  # lazy promotions are the only reads
    return cnt


__all__ = ["Filler", "replay_demand_fill", "replay_lazy", "hottest_nonresident", "ADMIT_ALL"]
