"""What a replay counts: the trace prepared once for every policy (``Prepared``: the
distinct (tick, key) occurrences, their token counts and next use), the per-policy
counters (``Counters``) and the ``Result`` they become."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from tierstore.sim.traces import Trace

NEVER = np.iinfo(np.int64).max


@dataclass
class Result:
    policy: str
    slots: int
    hit_rate: float  # token-weighted
    distinct_hit_rate: float  # each (tick, key) once
    reads: int  # rows fetched: demand misses + lazy promotions + prefetches
    reads_per_tick: float
    demand_reads: int
    prefetched: int
    prefetch_hits: int  # prefetched rows used before eviction
    wasted_prefetch: int  # prefetched rows evicted unused or never used
    evictions: int
    rejected: int  # misses read but not cached (admission filter, or
    # every resident key was in use this tick)
    bytes_read: int
    accesses: int
    ticks: int
    seconds: float
    accesses_per_s: float
    unserved: int = 0  # token-weighted misses not read at all (served elsewhere:
    # the lazy, reference and prefetch models)
    bandwidth_hit_rate: float = 0.0  # 1 - (reads + unserved) / accesses
    latency_hit_rate: float = 0.0  # accesses resident (and landed) when their layer read
    # (= hit_rate unless the lead-time model is timed,
    # tierstore.sim.leadtime)
    ceiling: str | None = None  # the MIN that bounds this policy: "belady" (forced
    # admission) or "belady_skip" (may skip a miss)
    gap_to_min: float | None = None  # ceiling's bandwidth_hit_rate - this one's, same slots
    gap_closed: float | None = None  # bandwidth view: (this - lru) / (ceiling - lru)
    latency_gap_closed: float | None = None  # latency view: (this - lru) / (belady - lru),
    # only when latency_comparable
    reads_vs_lru: float | None = None  # reads / lru's reads at the same slots
    latency_comparable: bool | None = None  # reads <= lru's: False is printed as "not
    # comparable", never silently dropped
    read_ratio: float | None = None  # <policy>+prefetch: its read budget vs LRU's

    def as_dict(self) -> dict:
        return asdict(self)


class Prepared:
    """A trace reduced once for every policy: distinct keys per tick (sorted),
    their token counts, and each distinct occurrence's next-use tick."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.n_keys = trace.n_keys
        starts = trace.tick_starts
        self.n_ticks = starts.size - 1
        tick_idx = np.repeat(np.arange(self.n_ticks, dtype=np.int64), np.diff(starts))
        combined = tick_idx * self.n_keys + trace.keys
        uniq, counts = np.unique(combined, return_counts=True)
        self.dtick = uniq // self.n_keys
        self.dkeys = uniq % self.n_keys
        self.dcounts = counts.astype(np.int64)
        self.dstarts = np.searchsorted(self.dtick, np.arange(self.n_ticks + 1))
        self.accesses = int(trace.n_rows)
        self.all_single = bool(self.dcounts.max(initial=1) == 1)
        # Groups: one (tick, layer) each, the unit that reads the slot table.
        # Keys sort by layer within a tick, so groups are contiguous runs.
        self.dlayer = self.dkeys // trace.n_experts
        self.gtime = self.dtick * trace.n_layers + self.dlayer  # read order
        change = np.flatnonzero(np.diff(self.gtime)) + 1
        self.gstarts = np.concatenate(([0], change, [uniq.size])).astype(np.int64)
        self.g_tick_end = np.zeros(self.gstarts.size - 1, dtype=bool)  # last group of a tick
        if uniq.size:
            last_of_tick = self.dstarts[1:] - 1
            self.g_tick_end[np.searchsorted(self.gstarts, last_of_tick, side="right") - 1] = True
        # Next use of each distinct occurrence in read order (vectorised).
        order = np.lexsort((self.gtime, self.dkeys))
        nxt = np.full(uniq.size, NEVER, dtype=np.int64)
        same = self.dkeys[order[1:]] == self.dkeys[order[:-1]]
        nxt[order[:-1][same]] = self.gtime[order[1:][same]]
        self.next_use = nxt


class Counters:
    def __init__(self, prep: Prepared):
        self.hit = np.zeros(prep.dkeys.size, dtype=bool)  # per distinct occurrence
        self.demand_reads = self.prefetched = self.prefetch_hits = 0
        self.wasted = self.evictions = self.rejected = self.unserved = 0
        self.landed = None  # timed lead-time model: which accesses had landed when read

    def result(self, name, slots, prep: Prepared, row_bytes: int, seconds: float) -> Result:
        token_hits = int(prep.dcounts[self.hit].sum())
        reads = self.demand_reads + self.prefetched
        bandwidth = 1.0 - (reads + self.unserved) / max(prep.accesses, 1)
        hit_rate = token_hits / max(prep.accesses, 1)
        latency = (
            hit_rate
            if self.landed is None
            else int(prep.dcounts[self.hit & self.landed].sum()) / max(prep.accesses, 1)
        )
        return Result(
            name,
            int(slots),
            hit_rate,
            float(self.hit.mean()) if self.hit.size else 0.0,
            reads,
            reads / max(prep.n_ticks, 1),
            self.demand_reads,
            self.prefetched,
            self.prefetch_hits,
            self.wasted,
            self.evictions,
            self.rejected,
            reads * int(row_bytes),
            prep.accesses,
            prep.n_ticks,
            seconds,
            prep.accesses / seconds if seconds > 0 else float("inf"),
            unserved=int(self.unserved),
            bandwidth_hit_rate=bandwidth,
            latency_hit_rate=latency,
        )


NOT_COMPARED = ("belady", "belady_skip", "unbounded")  # the ceilings and the bound


def latency_compare(r: Result, lru: Result, mn: Result | None) -> None:
    """Fill ``r``'s latency view against ``lru`` and ``mn`` (MIN, forced admission;
    None: MIN did not run) at the same slots: ``reads_vs_lru``, ``latency_comparable``
    (reads <= LRU's) and, only when comparable and MIN ran, ``latency_gap_closed`` =
    (r - lru) / (MIN - lru) of the latency hit rate. MIN is the ceiling of demand fill
    only: a prefetching model may pass it (a share above 1)."""
    if r.policy in NOT_COMPARED:
        return
    r.reads_vs_lru = r.reads / lru.reads if lru.reads else None
    r.latency_comparable = r.reads <= lru.reads
    span = mn.latency_hit_rate - lru.latency_hit_rate if mn is not None else 0.0
    if span > 0 and r.latency_comparable:
        r.latency_gap_closed = (r.latency_hit_rate - lru.latency_hit_rate) / span


def score_group(cnt, resident, prefetched, u, a: int, b: int):
    """Count one read group's accesses ``u`` (positions ``a:b``): hits where resident,
    prefetch hits where a prefetch brought them (consumed: each prefetch counts once).
    Returns the resident mask. Shared by the prefetching replays."""
    r = resident[u]
    cnt.hit[a:b] = r
    pf = prefetched[u]
    if pf.any():
        cnt.prefetch_hits += int(np.count_nonzero(pf))
        prefetched[u] = False
    return r
