"""Trace simulator: replay a routing trace through the policies the live store
runs (``tierstore.policies``), the reference manager's behaviour, Belady's MIN
and the unbounded cache. Imports policies only (never torch or the C++ core).

How a tick is counted (the way the forward sees it): every (layer, expert) of
the tick reads the slot table, and is a hit when resident *before* that tick's
promotions. Token-weighted hit rate counts every access (a key routed by 5
tokens of a batch counts 5); distinct hit rate counts each (tick, key) once.

Models, by name:
- ``lru``, ``heat``, ``hybrid``: demand fill. Every miss is read (one row) and
  admitted; when the pool is full the policy picks victims among keys not used
  this tick; a policy with an admission filter (``admit``) may reject a
  candidate, which is then read for this tick only (bypass).
- ``reference``: vLLM-Moet's background manager (COMPAT.md): misses are not
  promoted on demand; once per tick (a decode step outlasts its 5 ms pass) up
  to 8 of the hottest non-resident keys are promoted, ranked by decayed
  frequency halved every 5 s (``ticks_per_second``, default 75 = the authors'
  single-stream tok/s), first into free slots, then displacing the coldest
  resident key not used this tick when hotter than it.
- ``belady``: MIN, the offline optimum of demand fill (evict the key used
  farthest in the future); the ceiling for every online demand-fill policy.
- ``unbounded``: no evictions; only first uses miss.
- ``predict``: demand fill under ``hybrid`` plus prefetch learned online, see
  ``tierstore.sim_predict``; prefetch budget per tick in ``budget``.
- ``prefetch``: the same predictor with no demand fill (misses served from the
  base weights, as in the reference): exactly ``budget`` reads per tick at
  most, so it compares with ``reference`` at an equal read budget.
"""
from __future__ import annotations

import time

import numpy as np

from tierstore import policies as _policies
from tierstore.errors import ConfigError
from tierstore.policies.base import Policy
from tierstore.policies.dense import DensePolicy, coldest
from tierstore.sim.counting import NEVER, Counters, Prepared, Result
from tierstore.sim.traces import Trace

SIM_MODELS = ("reference", "belady", "unbounded", "predict", "prefetch")
DEFAULT_TICKS_PER_SECOND = 75.0
REFERENCE_PROMOTE_PER_TICK = 8
REFERENCE_HALF_LIFE_S = 5.0


class BeladyPolicy(DensePolicy):
    """MIN as a Policy: the simulator feeds each tick's distinct keys in
    ``Prepared`` order, and the policy reads their next-use ticks from the
    oracle array by position. Victims: farthest next use first."""

    name = "belady"

    def __init__(self, n_keys: int, capacity: int, *, next_use: np.ndarray):
        super().__init__(n_keys, capacity)
        self._oracle = next_use
        self._cursor = 0
        self._next = np.full(self.n_keys, NEVER, dtype=np.int64)
        self._neg = np.zeros(self.n_keys, dtype=np.int64)  # -next use: larger = hotter

    def on_access(self, keys, weights=None, now=None) -> None:
        arr = np.asarray(keys, dtype=np.int64)
        nu = self._oracle[self._cursor:self._cursor + arr.size]
        self._cursor += arr.size
        self._next[arr] = nu
        self._neg[arr] = -nu

    def victims(self, n: int, pinned=None) -> np.ndarray:
        return coldest(self._candidates(pinned), self._neg, None, int(n))

    def rank(self, keys) -> np.ndarray:
        arr = np.asarray(keys, dtype=np.int64)
        return arr[np.argsort(self._next[arr], kind="stable")]

    def decay(self, now=None, steps: int = 1) -> None:
        pass

    def scores(self) -> np.ndarray:
        return -self._next.astype(np.float64) / float(NEVER)

    def reset(self) -> None:
        super().reset()
        self._cursor = 0
        self._next[:] = NEVER
        self._neg[:] = 0


def replay_demand_fill(prep: Prepared, policy: Policy, slots: int,
                       granularity: str = "layer") -> Counters:
    """Demand fill through ``policy`` (see module doc). The simulator keeps its
    own resident mask and tells the policy every admission and eviction.

    ``granularity="layer"`` (default): each (tick, layer) reads the slot table
    in turn; its misses are filled before the next layer reads, evicting any key
    but the layer's own (what a layer-by-layer forward that blocks on a miss
    sees; no knowledge of later layers' routing). ``"tick"``: a tick's keys are
    all known first and all pinned while its misses are filled (a fire: the
    step ran once, so every routed expert of the step is known).

    Accesses are passed to the policy lazily, as one ``on_access`` per run of
    groups up to the next miss (and at each tick end, before ``decay``): no
    decay or decision happens in between, and within a tick later layers have
    larger keys, so every policy ends in the same state as with one call per
    group."""
    if granularity not in ("layer", "tick"):
        raise ConfigError(f"granularity must be 'layer' or 'tick', got {granularity!r}")
    cnt = Counters(prep)
    resident = np.zeros(prep.n_keys, dtype=bool)
    pinned = np.zeros(prep.n_keys, dtype=bool)
    filters = type(policy).admit is not Policy.admit
    dkeys, dcounts, single = prep.dkeys, prep.dcounts, prep.all_single
    if granularity == "layer":
        starts, ends_tick = prep.gstarts, prep.g_tick_end
    else:
        starts, ends_tick = prep.dstarts, np.ones(prep.n_ticks, dtype=bool)
    hit = cnt.hit
    n_res = 0
    pending = 0  # start of the accesses not yet given to the policy
    for g in range(starts.size - 1):
        a, b = starts[g], starts[g + 1]
        u = dkeys[a:b]
        r = resident[u]
        hit[a:b] = r
        n_miss = r.size - int(np.count_nonzero(r))
        if n_miss:
            policy.on_access(dkeys[pending:b], None if single else dcounts[pending:b])
            pending = b
            miss = u[~r] if n_miss < r.size else u
            cnt.demand_reads += n_miss
            free = max(slots - n_res, 0)
            if n_miss > free:
                if filters:
                    miss = policy.rank(miss)  # the hottest misses take the free slots
                if n_miss < r.size:
                    pinned[u] = True
                    v = policy.victims(n_miss - free, pinned)
                    pinned[u] = False
                else:
                    v = policy.victims(n_miss - free)
                contenders = miss[free:free + v.size]
                cnt.rejected += n_miss - free - v.size  # no unpinned victim: bypass
                if filters and v.size:
                    ok = np.asarray(policy.admit(contenders, v), dtype=bool)
                    cnt.rejected += int(ok.size - np.count_nonzero(ok))
                    v, contenders = v[ok], contenders[ok]
                miss = np.concatenate((miss[:free], contenders)) if free else contenders
                if v.size:
                    resident[v] = False
                    policy.on_evict(v)
                    cnt.evictions += v.size
                    n_res -= v.size
            if miss.size:
                resident[miss] = True
                policy.on_admit(miss)
                n_res += miss.size
        if ends_tick[g]:
            if pending < b:
                policy.on_access(dkeys[pending:b], None if single else dcounts[pending:b])
                pending = b
            policy.decay()
    return cnt


def replay_reference(prep: Prepared, slots: int, ticks_per_second: float) -> Counters:
    """vLLM-Moet's lazy manager (see module doc)."""
    cnt = Counters(prep)
    heat = _policies.make("heat", prep.n_keys, slots,
                          half_life=REFERENCE_HALF_LIFE_S * ticks_per_second)
    resident = np.zeros(prep.n_keys, dtype=bool)
    pinned = np.zeros(prep.n_keys, dtype=bool)
    dkeys, dstarts, n_res = prep.dkeys, prep.dstarts, 0
    k = REFERENCE_PROMOTE_PER_TICK
    for i in range(prep.n_ticks):
        a, b = dstarts[i], dstarts[i + 1]
        u = dkeys[a:b]
        cnt.hit[a:b] = resident[u]
        heat.on_access(u, None if prep.all_single else prep.dcounts[a:b])
        score = heat.scores()
        score[resident] = 0.0
        top = np.argpartition(-score, k)[:k] if score.size > k else np.arange(score.size)
        cand = top[score[top] > 0]
        cand = cand[np.argsort(-score[cand], kind="stable")]
        free = max(slots - n_res, 0)
        fill, rest = cand[:free], cand[free:]
        if rest.size:
            pinned[u] = True
            v = heat.victims(rest.size, pinned)
            pinned[u] = False
            heat_now = heat.scores()
            ok = heat_now[rest[:v.size]] > heat_now[v]
            v, swap_in = v[ok], rest[:v.size][ok]
            if v.size:
                resident[v] = False
                heat.on_evict(v)
                cnt.evictions += v.size
                n_res -= v.size
            fill = np.concatenate((fill, swap_in))
        if fill.size:
            resident[fill] = True
            heat.on_admit(fill)
            n_res += fill.size
            cnt.demand_reads += fill.size  # lazy promotions are the only reads
        heat.decay()
    return cnt


def check_policy_names(names, raise_: bool = True) -> str:
    """'' when every name is a policy or sim model, else the message (raised as
    ConfigError unless ``raise_`` is False)."""
    unknown = [p for p in names if p not in _policies.available() and p not in SIM_MODELS]
    if not unknown:
        return ""
    msg = (f"unknown policy {', '.join(map(repr, unknown))} (available: "
           f"{', '.join(_policies.available() + list(SIM_MODELS))})")
    if raise_:
        raise ConfigError(msg)
    return msg


def replay(trace: Trace | Prepared, policies=("lru", "heat", "hybrid", "reference", "belady"),
           slots=(51, 102, 205), *, budget: int = 8, row_bytes: int = 0,
           ticks_per_second: float = DEFAULT_TICKS_PER_SECOND,
           granularity: str = "layer", policy_params: dict | None = None) -> list[Result]:
    """Replay ``trace`` through every (policy, slots) pair -> list[Result], with
    ``gap_to_min`` filled when ``belady`` ran at the same slots. ``row_bytes``
    turns reads into bytes; ``policy_params`` (name -> kwargs) reaches
    ``policies.make`` and the predictor."""
    bad_slots = [s for s in slots if int(s) <= 0]
    problems = [check_policy_names(policies, raise_=False),
                bad_slots and f"slots must be > 0, got {bad_slots}"]
    if any(problems):
        raise ConfigError("; ".join(filter(None, problems)))
    prep = trace if isinstance(trace, Prepared) else Prepared(trace)
    params = policy_params or {}
    results = []
    for s in slots:
        s = int(s)
        for name in policies:
            t0 = time.perf_counter()
            if name == "reference":
                cnt = replay_reference(prep, s, ticks_per_second)
            elif name == "belady":
                cnt = replay_demand_fill(prep, BeladyPolicy(prep.n_keys, s, next_use=prep.next_use),
                                         s, granularity)
            elif name == "unbounded":
                cnt = replay_demand_fill(prep, _policies.make("lru", prep.n_keys, prep.n_keys),
                                         prep.n_keys, granularity)
            elif name in ("predict", "prefetch"):
                from tierstore.sim.predict import replay_predict
                kw = {**params.get("predict", {}), **params.get(name, {})}
                cnt = replay_predict(prep, s, budget=budget, granularity=granularity,
                                     demand_fill=name == "predict", **kw)
            else:
                cnt = replay_demand_fill(prep, _policies.make(name, prep.n_keys, s,
                                                              **params.get(name, {})),
                                         s, granularity)
            results.append(cnt.result(name, s, prep, row_bytes, time.perf_counter() - t0))
    best = {r.slots: r.hit_rate for r in results if r.policy == "belady"}
    for r in results:
        if r.slots in best:
            r.gap_to_min = best[r.slots] - r.hit_rate
    return results
