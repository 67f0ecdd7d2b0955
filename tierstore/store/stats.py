"""Counters of an ExpertStore and the StoreStats / FireResult structs it reports.

Hits are counted when recorded routing is folded into the policies (at the next
fire, step or stats call), against residency at that moment: a routed key that
is in the pool is a pool hit; a pool miss whose row is in the arena is an arena
hit; anything else is an arena miss (the bytes come from the page cache or the
disk). "Token-weighted" counts every (token, expert) pair; "distinct" counts each
key once per recorded batch.
"""

from __future__ import annotations

from collections import deque

import msgspec
import numpy as np

from tierstore import settings


class TierStats(msgspec.Struct, frozen=True):
    hits: int = 0  # token-weighted
    misses: int = 0
    distinct_hits: int = 0  # each key once per fold (~ per step)
    distinct_misses: int = 0
    hit_rate: float = 0.0  # hits / (hits + misses), 0 when nothing was recorded
    distinct_hit_rate: float = 0.0
    promotions: int = 0  # keys that became resident in this tier
    evictions: int = 0
    resident: int = 0
    capacity: int = 0
    pinned: int = 0  # keys pinned now: fires, a prefill, copy sources, staged rows


class StoreStats(msgspec.Struct, frozen=True):
    pool: TierStats
    arena: TierStats
    step_count: int = 0
    fires: int = 0
    fire_promoted: int = 0  # keys promoted inside fires
    fire_over_cap: int = 0  # routed misses a fire left out (over max_promote or no slot)
    fire_p50_ms: float = 0.0
    fire_p99_ms: float = 0.0
    lazy_queued: int = 0  # lazy promotions step() handed to the worker
    lazy_rejected: int = 0  # candidates the admission filter turned away
    bytes_arena: int = 0  # pool copies sourced from arena rows
    bytes_pagecache: int = 0  # pack reads the engine saw served by the page cache
    bytes_disk: int = 0  # pack reads from the device (or unclassified reads)
    bytes_read: int = 0  # all pack bytes read (pool + arena loads)
    promote_gbps: float = 0.0  # bytes moved into the pool / seconds spent moving them
    failed_reads: int = 0
    record_dropped: int = 0  # recorded expert ids >= n_experts (logged once)
    quarantined: int = 0  # rows that failed their checksum: never loaded again


class FireResult(msgspec.Struct, weakref=True):
    """What one fire did. ``keys`` are the dense ids it pinned; pass the result to
    ``store.release`` when the step that needed them is done."""

    keys: np.ndarray
    promoted: int = 0
    already_resident: int = 0
    over_cap: int = 0  # new promotions beyond max_promote
    no_slot: int = 0  # every slot pinned: could not be placed
    waited: int = 0  # keys another batch (worker, other fire) was loading
    latency_s: float = 0.0
    sources: dict = msgspec.field(default_factory=dict)  # {"arena": n, "read": n}
    rounds: int = 1
    released: bool = False
    pending: object = None  # pipelined fire: its LayerLoad until every layer is published
    pending_stream: object = None
    guard: object = None  # finalizer that unpins a result dropped unreleased (interrupts.py)
    holder: object = None  # its PinHolder: the keys it holds pinned (interrupts.py)
    owner: object = None  # the store that made it (release() refuses another's)

    def wait_layer(self, layer: int, stream=None) -> None:
        """Pipelined fire: make ``layer``'s keys resident on ``stream`` (default: the
        fire's) before work on it is enqueued there; waits on the host for that
        layer's reads only. Raises the layer's TierIOError. No-op otherwise."""
        layer = settings.argument("FireResult.wait_layer: layer", layer, settings.count)
        if self.pending is not None:
            self.pending.wait_layer(layer, self.pending_stream if stream is None else stream)

    def wait_all(self, stream=None) -> None:
        """Pipelined fire: publish every layer still in flight."""
        if self.pending is not None:
            self.pending.wait_all(self.pending_stream if stream is None else stream)


# Latency histograms: bucket b counts latencies of [2^(b-1), 2^b) microseconds (b = 0: under
# 1 us; the last bucket takes everything longer), the engine's own per-source buckets
# (csrc/io engine.cpp latency_bucket), so fire and read latencies export alike.
LATENCY_BUCKETS = 40


def latency_bucket(seconds: float) -> int:
    """The log2-microsecond bucket of ``seconds`` (see LATENCY_BUCKETS)."""
    return min(int(seconds * 1e6).bit_length(), LATENCY_BUCKETS - 1) if seconds > 0 else 0


class LayerCounters:
    """Per-layer tallies of one store (kept when the ``metrics`` setting is on).

    ``by_residency[layer, c]``: tokens routed to the layer's experts, by residency at the
    fold (c as in ``Counters.add_tally``: 0 in neither tier, 1 arena only, 2 pool only,
    3 both); float64, exact to 2^53. ``rows_read[layer]``: rows read from the pack.
    One bincount per fold and one per load batch: never a Python loop per row."""

    def __init__(self, n_layers: int, n_experts: int):
        self.n_layers, self.n_experts = int(n_layers), int(n_experts)
        self.by_residency = np.zeros((self.n_layers, 4), np.float64)
        self.rows_read = np.zeros(self.n_layers, np.int64)
        # 4 * layer of every dense key: one gather instead of a division per fold
        self._layer4 = np.repeat(np.arange(self.n_layers, dtype=np.int64) * 4, self.n_experts)

    def add_fold(
        self, keys: np.ndarray, weights: np.ndarray, pool_slot: np.ndarray, arena_slot: np.ndarray
    ) -> None:
        """One fold's routed ``keys`` (dense) with token ``weights``; ``*_slot`` are the
        tiers' resident_slot maps as the fold saw them (caller holds the store lock).
        ~5 us for a DS4 batch-1 step (bench/bench_metrics.py)."""
        cat = self._layer4[keys]
        cat += (pool_slot[keys] >= 0) * 2
        cat += arena_slot[keys] >= 0
        flat = self.by_residency.reshape(-1)  # a view: the add lands in by_residency
        np.add(flat, np.bincount(cat, weights=weights, minlength=flat.size), out=flat)

    def add_reads(self, keys: np.ndarray) -> None:
        """Rows of ``keys`` (dense) were read from the pack."""
        if len(keys):
            self.rows_read += np.bincount(keys // self.n_experts, minlength=self.n_layers)


class Counters:
    """Mutable tallies; updated under the store lock. ``layers`` is a LayerCounters when
    ``n_layers`` is given (the metrics setting on), else None (nothing counted per layer)."""

    def __init__(self, latency_window: int, n_layers: int = 0, n_experts: int = 0):
        self.tier = {t: dict(hits=0, misses=0, distinct_hits=0, distinct_misses=0) for t in ("pool", "arena")}
        self.fires = self.fire_promoted = self.fire_over_cap = 0
        self.lazy_queued = self.lazy_rejected = 0
        self.bytes_arena = self.bytes_read = self.bytes_to_pool = 0
        self.move_seconds = 0.0
        self.failed_reads = 0
        self.record_dropped = 0
        self.quarantined = 0
        self.fire_latency = deque(maxlen=int(latency_window))
        self.fire_hist = [0] * LATENCY_BUCKETS  # every fire since open (log2-us buckets)
        self.fire_seconds = 0.0
        self.layers = LayerCounters(n_layers, n_experts) if n_layers else None

    def observe_fire(self, seconds: float) -> None:
        """One fire's latency: the p50/p99 window and the histogram (a bucket add)."""
        self.fire_latency.append(seconds)
        self.fire_hist[latency_bucket(seconds)] += 1
        self.fire_seconds += seconds

    def add_tally(self, tally) -> None:
        """Add one fold's hit split: 8 ints, tokens then distinct keys per residency
        category (0 in neither tier, 1 arena only, 2 pool, 3 pool and arena), as
        ``tierstore.store.recorder`` computes it."""
        t0, t1, t2, t3, d0, d1, d2, d3 = tally
        pool, arena = self.tier["pool"], self.tier["arena"]
        pool["hits"] += t2 + t3
        pool["misses"] += t0 + t1
        pool["distinct_hits"] += d2 + d3
        pool["distinct_misses"] += d0 + d1
        arena["hits"] += t1
        arena["misses"] += t0
        arena["distinct_hits"] += d1
        arena["distinct_misses"] += d0

    def tier_stats(self, tier: str, states) -> TierStats:
        c = self.tier[tier]
        tot, dtot = c["hits"] + c["misses"], c["distinct_hits"] + c["distinct_misses"]
        return TierStats(
            hits=c["hits"],
            misses=c["misses"],
            distinct_hits=c["distinct_hits"],
            distinct_misses=c["distinct_misses"],
            hit_rate=c["hits"] / tot if tot else 0.0,
            distinct_hit_rate=c["distinct_hits"] / dtot if dtot else 0.0,
            promotions=states.admissions,
            evictions=states.evictions,
            resident=states.n_resident,
            capacity=states.n_slots,
            pinned=int(np.count_nonzero(states.key_pins)),
        )

    def snapshot(self, pool, arena, step_count: int, engine_stats: dict | None) -> StoreStats:
        lat = np.asarray(self.fire_latency, dtype=np.float64)
        p50, p99 = (np.percentile(lat, [50, 99]) * 1e3) if len(lat) else (0.0, 0.0)
        pagecache, disk = _read_split(engine_stats, self.bytes_read)
        return StoreStats(
            pool=self.tier_stats("pool", pool),
            arena=self.tier_stats("arena", arena),
            step_count=step_count,
            fires=self.fires,
            fire_promoted=self.fire_promoted,
            fire_over_cap=self.fire_over_cap,
            fire_p50_ms=float(p50),
            fire_p99_ms=float(p99),
            lazy_queued=self.lazy_queued,
            lazy_rejected=self.lazy_rejected,
            bytes_arena=self.bytes_arena,
            bytes_pagecache=pagecache,
            bytes_disk=disk,
            bytes_read=self.bytes_read,
            promote_gbps=(self.bytes_to_pool / self.move_seconds / 1e9) if self.move_seconds else 0.0,
            failed_reads=self.failed_reads,
            record_dropped=self.record_dropped,
            quarantined=self.quarantined,
        )


def _source_bytes(engine_stats: dict, name: str) -> int | None:
    """Bytes the engine attributes to one source; accepts {"disk": {"bytes": n}} or
    {"disk_bytes": n} / {"bytes_disk": n}."""
    src = engine_stats.get(name)
    if isinstance(src, dict) and "bytes" in src:
        return int(src["bytes"])
    for flat in (f"{name}_bytes", f"bytes_{name}"):
        if flat in engine_stats:
            return int(engine_stats[flat])
    return None


def _read_split(engine_stats: dict | None, bytes_read: int) -> tuple[int, int]:
    """(page cache, disk) bytes: the engine's classification when it gives one, else
    every read counts as disk."""
    if isinstance(engine_stats, dict):
        pc, disk = _source_bytes(engine_stats, "pagecache"), _source_bytes(engine_stats, "disk")
        if pc is not None or disk is not None:
            return int(pc or 0), int(disk or 0)
    return 0, int(bytes_read)
