"""Trace simulator: replay a routing trace through the policies the live store
runs (``tierstore.policies``), the store's own fill paths, the reference
manager's behaviour, Belady's MIN and the unbounded cache. Imports policies
(never torch). Every model runs in the C++ core's replay loops
(``tierstore.sim.native_replay``, same results as the Python loops,
which the tests keep as oracles): demand fill under every policy and auto, MIN in
both forms, ``lazy`` and ``reference``, ``predict`` and ``prefetch``, and
``<policy>+prefetch`` (a timed lead-time model stays on the Python loop).

How a tick is counted (the way the forward sees it): every (layer, expert) of
the tick reads the slot table, and is a hit when resident *before* that tick's
promotions. Token-weighted hit rate counts every access (a key routed by 5
tokens of a batch counts 5); distinct hit rate counts each (tick, key) once.

Models, by name (``available_models()``; ``"all"`` expands to every one):
- every registered policy (``lru``, ``heat``, ``hybrid``, ``auto``): demand
  fill (``tierstore.sim.demand``). Every miss is read (one row) and offered a
  slot; victims are keys not used by the reading group; a policy with an
  admission filter may reject a candidate, which is then read for this use only.
- ``lazy``: the live store's ``step()`` path with no fires (``hybrid``, at most
  8 promotions a tick, each hotter than its victim); misses are unserved.
- ``reference``: vLLM-Moet's background manager (docs/VLLM_MOET.md): misses are not
  promoted on demand; once per tick up to 8 of the hottest non-resident keys are
  promoted, ranked by decayed frequency halved every 5 s
  (``ticks_per_second``, default 75), into free slots, then over the coldest key
  not used this tick when hotter than it.
- ``belady``: MIN, the optimum of demand fill with forced admission (evict the
  key used farthest in the future); ``belady_skip``: MIN that may skip caching
  a miss used later than every victim (the optimum when skipping is allowed).
- ``unbounded``: no evictions; only first uses miss.
- ``<policy>+prefetch`` (``auto+prefetch`` listed): demand fill under the
  policy plus the prefetcher the live store runs (``tierstore.sim.prefetching``,
  ``tierstore.policies.prefetch``): cross-layer and next-token prefetch whose
  reads are budgeted against LRU's (``read_ratio``, default 1: no more reads
  than LRU), self-tuned online; ``policy_params[name]`` reaches the prefetcher.
- ``predict``: demand fill under ``hybrid`` plus prefetch learned online
  (``tierstore.sim.predict``), at most ``budget`` prefetches per tick;
  ``prefetch``: the same predictor with no demand fill (misses unserved).

Two views of every result (``Result``):
- bandwidth: ``1 - (reads + unserved) / accesses``, every row read counted
  (demand, lazy, prefetch) and every access served from elsewhere counted as a
  miss. Ceiling: ``belady`` for forced-admission demand fill, ``belady_skip``
  for everything else (a prefetch never needs fewer reads than fetching on
  demand, so MIN-that-may-skip bounds prefetching models too); ``gap_to_min``
  is to that ceiling; ``gap_closed`` is the share of the LRU -> ``belady`` gap.
- latency: the share of accesses resident when their layer reads, under the
  lead-time model of ``tierstore.sim.leadtime`` (``policy_params[name]
  ["lead_time"]`` for ``<policy>+prefetch``; default: issued at least one layer
  ahead, untimed: lands before its target layer reads; a demand read blocks).
  Compared only between models whose reads are <= LRU's at the same slots
  (``latency_comparable``; ``latency_gap_closed`` is None otherwise): a model
  cannot buy latency hits with reads LRU does not spend.
"""

from __future__ import annotations

import time

from tierstore import policies as _policies
from tierstore.errors import ConfigError
from tierstore.policies.admission import ADMIT_ALL, filters_misses
from tierstore.sim.belady import BeladyPolicy, BeladySkipPolicy
from tierstore.sim.counting import NOT_COMPARED, Counters, Prepared, Result, latency_compare
from tierstore.sim.demand import replay_demand_fill, replay_lazy
from tierstore.sim.traces import Trace

SIM_MODELS = (
    "lazy",
    "reference",
    "belady",
    "belady_skip",
    "unbounded",
    "predict",
    "prefetch",
    "auto+prefetch",
)
PREFETCH_SUFFIX = "+prefetch"  # "<policy>+prefetch": any registered policy + the prefetcher
DEFAULT_TICKS_PER_SECOND = 75.0
REFERENCE_PROMOTE_PER_TICK = 8
REFERENCE_HALF_LIFE_S = 5.0


LAZY_POLICY = "hybrid"  # the store's lazy path as shipped (pool_policy default)
LAZY_PER_TICK = 8  # the store's lazy_per_step default


def available_models() -> list[str]:
    """Every name ``replay`` accepts (registered policies, then the sim's models)."""
    return _policies.available() + list(SIM_MODELS)


def expand_names(names) -> list[str]:
    """``names`` with ``"all"`` replaced by every model, duplicates dropped."""
    out: list[str] = []
    for n in names:
        out.extend(available_models() if n == "all" else [n])
    return list(dict.fromkeys(out))


def replay_reference(prep: Prepared, slots: int, ticks_per_second: float) -> Counters:
    """vLLM-Moet's lazy manager (see module doc)."""
    heat = _policies.make("heat", prep.n_keys, slots, half_life=REFERENCE_HALF_LIFE_S * ticks_per_second)
    return replay_lazy(prep, heat, slots, REFERENCE_PROMOTE_PER_TICK, candidates="hottest")


def check_policy_names(names, raise_: bool = True) -> str:
    """'' when every name is a policy or sim model, else the message (raised as
    ConfigError unless ``raise_`` is False)."""
    unknown = [
        p
        for p in names
        if p not in available_models()
        and p != "all"
        and not (p.endswith(PREFETCH_SUFFIX) and p[: -len(PREFETCH_SUFFIX)] in _policies.available())
    ]
    if not unknown:
        return ""
    msg = (
        f"unknown policy {', '.join(map(repr, unknown))} (available: {', '.join(available_models())}, or all)"
    )
    if raise_:
        raise ConfigError(msg)
    return msg


def _ceiling(name: str, params: dict) -> str | None:
    if name in ("belady", "unbounded", "belady_skip"):
        return None
    if name in _policies.available():
        probe = _policies.make(name, 1, 1, **params.get(name, {}))
        return "belady_skip" if filters_misses(probe) else "belady"
    return "belady_skip"


def run_one(
    prep: Prepared,
    name: str,
    slots: int,
    *,
    budget: int,
    ticks_per_second: float,
    granularity: str,
    params: dict,
) -> Counters:
    """Counters of model ``name`` at ``slots`` (see module doc)."""
    if name == "reference":
        return replay_reference(prep, slots, ticks_per_second)
    if name == "lazy":
        return replay_lazy(
            prep,
            _policies.make(LAZY_POLICY, prep.n_keys, slots, **params.get("lazy", {})),
            slots,
            LAZY_PER_TICK,
        )
    if name in ("belady", "belady_skip"):
        cls = BeladyPolicy if name == "belady" else BeladySkipPolicy
        return replay_demand_fill(prep, cls(prep.n_keys, slots, next_use=prep.next_use), slots, granularity)
    if name == "unbounded":
        return replay_demand_fill(
            prep, _policies.make("lru", prep.n_keys, prep.n_keys), prep.n_keys, granularity, ADMIT_ALL
        )
    if name.endswith(PREFETCH_SUFFIX):
        from tierstore.sim.prefetching import replay_with_prefetch

        if granularity != "layer":
            raise ConfigError(
                f"model {name!r} needs granularity 'layer' (it prefetches "
                f"later layers while the current one runs)"
            )
        base = name[: -len(PREFETCH_SUFFIX)]
        policy = _policies.make(base, prep.n_keys, slots, **{"prefetching": True, **params.get(base, {})})
        return replay_with_prefetch(prep, policy, slots, **params.get(name, {}))[0]
    if name in ("predict", "prefetch"):
        from tierstore.sim.predict import replay_predict

        kw = {**params.get("predict", {}), **params.get(name, {})}
        return replay_predict(
            prep, slots, budget=budget, granularity=granularity, demand_fill=name == "predict", **kw
        )
    return replay_demand_fill(
        prep, _policies.make(name, prep.n_keys, slots, **params.get(name, {})), slots, granularity
    )


def compare(results: list[Result]) -> None:
    """Fill each result's ceiling, gap_to_min and gap-closed shares (module doc)."""
    by = {(r.policy, r.slots): r for r in results}
    for r in results:
        ceil = by.get((r.ceiling, r.slots)) if r.ceiling else None
        if ceil is None and r.ceiling == "belady_skip":
            ceil = None  # no skip ceiling ran: no gap rather than a wrong one
        r.gap_to_min = None if ceil is None else ceil.bandwidth_hit_rate - r.bandwidth_hit_rate
        # Reads against LRU's need only LRU's run; a share of the gap needs MIN's too.
        lru, mn = by.get(("lru", r.slots)), by.get(("belady", r.slots))
        if lru is None or r.policy in NOT_COMPARED:
            continue
        span = mn.bandwidth_hit_rate - lru.bandwidth_hit_rate if mn is not None else 0.0
        if span > 0:
            r.gap_closed = (r.bandwidth_hit_rate - lru.bandwidth_hit_rate) / span
        latency_compare(r, lru, mn)


def replay(
    trace: Trace | Prepared,
    policies=("lru", "heat", "hybrid", "reference", "belady"),
    slots=(51, 102, 205),
    *,
    budget: int = 8,
    row_bytes: int = 0,
    ticks_per_second: float = DEFAULT_TICKS_PER_SECOND,
    granularity: str = "layer",
    policy_params: dict | None = None,
    progress=None,
) -> list[Result]:
    """Replay ``trace`` through every (policy, slots) pair -> list[Result]
    (``"all"`` in ``policies``: every model), with the gaps of ``compare``
    filled where their ceiling ran at the same slots. ``row_bytes``
    turns reads into bytes; ``policy_params`` (name -> kwargs) reaches
    ``policies.make`` and the predictor. ``progress(result)``, when given, is
    called after each run (a long ``all`` replay takes minutes)."""
    bad_slots = [s for s in slots if int(s) <= 0]
    problems = [
        check_policy_names(policies, raise_=False),
        bad_slots and f"slots must be > 0, got {bad_slots}",
    ]
    if any(problems):
        raise ConfigError("; ".join(filter(None, problems)))
    prep = trace if isinstance(trace, Prepared) else Prepared(trace)
    params = policy_params or {}
    names = expand_names(policies)
    results = []
    for s in slots:
        s = int(s)
        for name in names:
            t0 = time.perf_counter()
            cnt = run_one(
                prep,
                name,
                s,
                budget=budget,
                ticks_per_second=ticks_per_second,
                granularity=granularity,
                params=params,
            )
            r = cnt.result(name, s, prep, row_bytes, time.perf_counter() - t0)
            r.ceiling = _ceiling(name, params)
            results.append(r)
            if progress is not None:
                progress(r)
    compare(results)
    return results
