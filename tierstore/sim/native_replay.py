"""The native demand-fill replay (a Python loop ran 0.02-0.35 M accesses/s, too slow to
replay real traces at every pool size): ``tierstore._C.replay_demand`` runs
``replay_demand_fill``'s loop for the lru / heat / hybrid / phase policies in C++
(csrc/store/src/replay.cpp), and ``tierstore._C.replay_auto`` the self-tuning
policy's (csrc/store/src/auto_replay.cpp: its follow-the-leader decisions over the
AutoCore that the live store's AutoPolicy runs, shadows and all), over the policy
object's own core
(``native_state()``: the rules the live store runs, policies/native.py), which they
update in place: afterwards the policy is in exactly the state the Python loop
leaves (same hits, reads, evictions, rejections, tie-breaks;
tests/policies/test_native_policies.py compares the two).

``tierstore._C.replay_prefetch`` / ``replay_prefetch_auto`` (csrc/store/src/
prefetch_replay.cpp) run ``tierstore.sim.prefetching``'s loop (demand fill plus the
prefetcher, ``<policy>+prefetch``) over the same cores and the prefetcher's.

``tierstore._C.replay_lazy`` (csrc/store/src/lazy_replay.cpp) runs ``replay_lazy``'s loop
(the live store's step() and the reference manager: misses unserved, a lazy pass a tick),
and ``replay_predict`` with ``demand_fill=False`` the predictor's ``prefetch`` model.

``tierstore._C.replay_min`` (csrc/store/src/min_replay.cpp) replays Belady's MIN,
both forms (``tierstore.sim.belady``), over the prepared trace's next uses; the policy
object is left as the Python loop leaves it (next uses, resident mask, cursor;
tests/policies/test_native_min.py compares the two).

Used only where it is exact: a fresh (nothing resident) policy of exactly one of
those classes (or blend, or auto) on the step clock (``half_life_s`` reads the wall
clock), with the
policy's own admission filter or ``ADMIT_ALL``. Anything else (Belady, the
predictor, a custom admission, a subclass) stays on the Python loop, as does
everything when the extension is not built.
"""

from __future__ import annotations

import numpy as np

from tierstore.policies.admission import ADMIT_ALL, PolicyFilter
from tierstore.policies.auto import AutoPolicy
from tierstore.policies.base import Policy
from tierstore.policies.native import is_native_face
from tierstore.sim.belady import BeladyPolicy, BeladySkipPolicy
from tierstore.sim.counting import Counters, Prepared


def _exact(policy) -> bool:
    """True for auto and for a face class that names its own native kind (a subclass
    that only overrides Python methods may behave otherwise: it replays in Python)."""
    return type(policy) is AutoPolicy or is_native_face(policy)


def _native(name: str = "replay_demand"):
    try:
        from tierstore import _C
    except ImportError:
        return None
    return getattr(_C, name, None)


def native_filter(policy, admission) -> bool | None:
    """The admission-filter flag the native loop runs ``policy`` with under
    ``admission``; None when the native loop cannot model this pair exactly."""
    loop = "replay_auto" if type(policy) is AutoPolicy else "replay_demand"
    if not _exact(policy) or policy.n_resident or _native(loop) is None:
        return None
    if admission is ADMIT_ALL:
        return False
    if type(admission) is PolicyFilter and admission.policy is policy:
        return admission.filters
    return None


def _trace_arrays(prep: Prepared, granularity: str) -> tuple:
    """The prepared trace as the native loops take it: keys, counts, single, group
    starts, tick ends (``granularity`` 'layer': a group per (tick, layer); 'tick': per tick)."""
    if granularity == "layer":
        starts, ends = prep.gstarts, prep.g_tick_end
    else:
        starts, ends = prep.dstarts, np.ones(prep.n_ticks, dtype=bool)
    return (
        np.ascontiguousarray(prep.dkeys, dtype=np.int64),
        np.ascontiguousarray(prep.dcounts, dtype=np.int64),
        bool(prep.all_single),
        np.ascontiguousarray(starts, dtype=np.int64),
        np.ascontiguousarray(ends, dtype=bool),
    )


def replay_native(prep: Prepared, policy, slots: int, granularity: str, filter_: bool) -> Counters | None:
    """Counters of the native replay (``replay_demand_fill``'s semantics), or None
    when ``policy`` has no native state (wall clock, an expert of no native kind)."""
    state = policy.native_state()
    if state is None:
        return None
    cnt = Counters(prep)
    trace = _trace_arrays(prep, granularity)
    if type(policy) is AutoPolicy:
        core, resident, n_resident = state
        n_resident, (reads, evictions, rejected) = _native("replay_auto")(
            core, resident, int(n_resident), *trace, int(slots), bool(filter_), cnt.hit
        )
        policy.load_native_state(n_resident)
    else:
        reads, evictions, rejected = _native()(state, *trace, int(slots), bool(filter_), cnt.hit)
        policy.load_native_state()
    cnt.demand_reads, cnt.evictions, cnt.rejected = int(reads), int(evictions), int(rejected)
    return cnt


def native_prefetch_replay(
    prep: Prepared, policy, slots: int, prefetcher, admission, demand_fill: bool
) -> Counters | None:
    """Counters of ``tierstore.sim.prefetching``'s loop run natively
    (``tierstore._C.replay_prefetch`` / ``replay_prefetch_auto``, csrc/store/src/
    prefetch_replay.cpp) for a fresh exact policy under its own filter or ``ADMIT_ALL``
    and a ``Prefetcher`` itself (a subclass may override ``predict`` / ``propose``: it
    stays on the Python loop), at least two layers; None where that is not exact. The
    policy and the prefetcher are left as the Python loop leaves them."""
    from tierstore.policies.prefetch import Prefetcher

    filter_ = native_filter(policy, admission)
    loop = "replay_prefetch_auto" if type(policy) is AutoPolicy else "replay_prefetch"
    if (
        filter_ is None
        or type(prefetcher) is not Prefetcher
        or prep.trace.n_layers < 2
        or _native(loop) is None
    ):
        return None
    state = policy.native_state()
    if state is None:
        return None
    cnt = Counters(prep)
    keys, counts, single, starts, ends = _trace_arrays(prep, "layer")
    if type(policy) is AutoPolicy:
        core, resident, n_resident = state
        n_resident, out = _native(loop)(
            core,
            resident,
            int(n_resident),
            prefetcher._core,
            keys,
            counts,
            single,
            starts,
            ends,
            int(slots),
            bool(filter_),
            bool(demand_fill),
            cnt.hit,
        )
        policy.load_native_state(n_resident)
    else:
        out = _native(loop)(
            state,
            prefetcher._core,
            keys,
            counts,
            single,
            starts,
            ends,
            int(slots),
            bool(filter_),
            bool(demand_fill),
            cnt.hit,
        )
        policy.load_native_state()
    (
        cnt.demand_reads,
        cnt.evictions,
        cnt.rejected,
        cnt.prefetched,
        cnt.prefetch_hits,
        cnt.wasted,
        cnt.unserved,
    ) = (int(x) for x in out)
    return cnt


def native_predict_replay(
    prep: Prepared,
    policy,
    model,
    slots: int,
    budget: int,
    threshold: float,
    cross: bool,
    temporal: bool,
    top_k: int,
    demand_fill: bool = True,
) -> Counters | None:
    """Counters of ``tierstore.sim.predict``'s ``predict`` model (demand fill under the
    policy's own filter plus the predicted prefetch; ``demand_fill`` False: its ``prefetch``
    model, misses unserved and a lazy pass at each tick end) run natively
    (``tierstore._C.replay_predict``) for a fresh exact plain policy and ``model`` (a
    ``tierstore._C.CoRouting``); None where that is not exact (auto, a used policy)."""
    if (
        type(policy) is AutoPolicy
        or _native("replay_predict") is None
        or type(model) is not _native("CoRouting")
    ):
        return None
    filter_ = native_filter(policy, PolicyFilter(policy))
    state = policy.native_state() if filter_ is not None else None
    if state is None:
        return None
    cnt = Counters(prep)
    keys, counts, single, starts, ends = _trace_arrays(prep, "layer")
    out = _native("replay_predict")(
        state,
        model,
        keys,
        counts,
        single,
        starts,
        ends,
        int(slots),
        bool(filter_),
        int(budget),
        float(threshold),
        bool(cross),
        bool(temporal),
        int(top_k),
        bool(demand_fill),
        cnt.hit,
    )
    policy.load_native_state()
    (
        cnt.demand_reads,
        cnt.evictions,
        cnt.rejected,
        cnt.prefetched,
        cnt.prefetch_hits,
        cnt.wasted,
        cnt.unserved,
    ) = (int(x) for x in out)
    return cnt


def native_lazy_replay(prep: Prepared, policy, slots: int, cap: int, hottest: bool) -> Counters | None:
    """Counters of ``tierstore.sim.demand.replay_lazy`` under its default admission
    (HotterThanVictim) run natively (``tierstore._C.replay_lazy``, csrc/store/src/
    lazy_replay.cpp) for a fresh exact plain policy, the policy left as the Python loop
    leaves it; None where that is not exact (auto, a used policy, the wall clock)."""
    replay = _native("replay_lazy")
    if replay is None or type(policy) is AutoPolicy or not _exact(policy) or policy.n_resident:
        return None
    state = policy.native_state()
    if state is None:
        return None
    cnt = Counters(prep)
    reads, evictions, rejected, unserved = replay(
        state, *_trace_arrays(prep, "tick"), int(slots), int(cap), bool(hottest), cnt.hit
    )
    policy.load_native_state()
    cnt.demand_reads, cnt.evictions, cnt.rejected, cnt.unserved = (
        int(reads),
        int(evictions),
        int(rejected),
        int(unserved),
    )
    return cnt


def replay_min_native(
    prep: Prepared, policy: Policy, slots: int, granularity: str, admission
) -> Counters | None:
    """Counters of MIN's native replay (``replay_demand_fill``'s semantics for a fresh
    BeladyPolicy / BeladySkipPolicy under its own rule or ``ADMIT_ALL``), the policy left
    as the Python loop leaves it; None where that is not exact or not built."""
    replay = _native("replay_min")
    state = policy.replay_state(prep.next_use) if type(policy) in (BeladyPolicy, BeladySkipPolicy) else None
    if replay is None or state is None:
        return None
    if admission is ADMIT_ALL:
        skip = False
    elif type(admission) is PolicyFilter and admission.policy is policy:
        skip = bool(admission.filters)
    else:
        return None
    cnt = Counters(prep)
    reads, evictions, rejected = replay(
        *_trace_arrays(prep, granularity),
        np.ascontiguousarray(prep.next_use, dtype=np.int64),
        int(slots),
        skip,
        *state,
        cnt.hit,
    )
    policy.load_replayed(prep.dkeys)
    cnt.demand_reads, cnt.evictions, cnt.rejected = int(reads), int(evictions), int(rejected)
    return cnt
