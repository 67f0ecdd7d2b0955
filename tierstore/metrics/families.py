"""The metric families of registered stores, built from their own counters at collect time.

Nothing here runs on a store's hot path: a store keeps plain counters (``TierStats``,
``Counters`` with its per-layer ``LayerCounters`` and fire histogram, the engine's
per-source rows, bytes and latency buckets); :func:`read_snapshot` copies them under the
store lock (no fold, no CUDA call), and :func:`families` turns snapshots into
prometheus_client metric families. The same families feed the in-process collector
(scrape time) and the multiprocess writer (every ``metrics_interval_s``).

Latency histograms use the stores' log2-microsecond buckets (``stats.LATENCY_BUCKETS``),
exported every second bucket: 16 us, 64 us, ... 16.8 s, +Inf. The engine keeps bucket
counts only, so its read and copy histograms have no ``_sum``; the fire histogram has one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from tierstore.store.stats import LATENCY_BUCKETS, StoreStats

PREFIX = "tierstore_"
TIERS = ("pool", "arena")
SOURCES = ("arena", "pagecache", "disk")  # the engine's row sources (tierstore/io/engine.py)
# Exported bucket edges: log2-us bucket b holds [2^(b-1), 2^b) us, so its upper edge is
# 2^b us; every second one from 2^4 (16 us) to 2^24 (16.8 s), then +Inf.
EXPORTED_EDGES = tuple(range(4, 25, 2))

# name (without prefix / _total), kind, help. docs/METRICS.md lists the same (a test checks).
METRICS: tuple[tuple[str, str, str], ...] = (
    ("hits", "counter", "routed (token, expert) pairs resident in the tier when folded"),
    ("misses", "counter", "routed (token, expert) pairs not resident in the tier when folded"),
    ("distinct_hits", "counter", "routed keys resident in the tier, each once per fold (step)"),
    ("distinct_misses", "counter", "routed keys not resident in the tier, each once per fold"),
    ("promotions", "counter", "keys that became resident in the tier"),
    ("evictions", "counter", "keys evicted from the tier"),
    ("layer_hits", "counter", "routed (token, expert) pairs resident in the tier, per layer"),
    ("layer_misses", "counter", "routed (token, expert) pairs not resident in the tier, per layer"),
    ("layer_rows_read", "counter", "rows read from the pack, per layer"),
    ("layer_bytes_read", "counter", "bytes read from the pack, per layer"),
    (
        "rows_read",
        "counter",
        "rows the I/O engine moved, per source (arena: a copy from the "
        "pinned arena; pagecache / disk: a pack read)",
    ),
    ("bytes_read", "counter", "bytes the I/O engine moved, per source"),
    ("copied_bytes", "counter", "bytes copied into the pool (kind h2d) or into host rows (host)"),
    ("fires", "counter", "fire() calls (each promote round of a gate fire is one)"),
    ("fire_promoted", "counter", "keys promoted inside fires"),
    ("fire_unplaced", "counter", "routed misses a fire left out (over max_promote or no slot)"),
    ("lazy_promotions", "counter", "background promotions step() queued"),
    ("lazy_rejected", "counter", "background candidates the admission filter turned away"),
    ("failed_reads", "counter", "load batches that failed and were rolled back"),
    ("quarantined", "counter", "rows that failed their checksum, never loaded again (quarantine=True)"),
    ("verify_failures", "counter", "rows whose checksum did not match the pack's sidecar"),
    ("verified_rows", "counter", "rows checked against the pack's sidecar checksums"),
    ("record_dropped", "counter", "recorded expert ids out of range (dropped)"),
    ("steps", "counter", "step() calls"),
    ("gate_steps", "counter", "decode steps the gate decided"),
    ("gate_fires", "counter", "steps whose first gate decision fired"),
    ("gate_rounds", "counter", "re-runs done by gate fires"),
    ("gate_promoted", "counter", "experts made resident by gate fires"),
    ("gate_still_uncertain", "counter", "gate fires whose last re-run still fired"),
    ("resident", "gauge", "keys resident in the tier now"),
    ("capacity", "gauge", "slots (pool) or rows (arena) of the tier"),
    ("pinned", "gauge", "keys pinned in the tier now (fires, prefill, copy sources, staged rows)"),
    ("slot_bytes", "gauge", "bytes of one expert row"),
    ("fire_latency_seconds", "histogram", "fire() latency, call to return"),
    (
        "read_latency_seconds",
        "histogram",
        "pack row reads, submit to landed, per source (pagecache, disk); no _sum",
    ),
    ("copy_latency_seconds", "histogram", "arena row copies, submit to done; no _sum"),
)
_KIND = {name: kind for name, kind, _ in METRICS}
_HELP = {name: text for name, _, text in METRICS}


@dataclass
class Snapshot:
    """One store's counters at one moment (copies: safe to use without the lock)."""

    stats: StoreStats
    engine: dict
    slot_bytes: int
    fire_hist: list
    fire_seconds: float
    by_residency: np.ndarray | None = None  # float64 [layers, 4] (stats.LayerCounters)
    rows_read: np.ndarray | None = None  # int64 [layers]
    gate: object = None  # GateStats, when a gate was registered
    labels: dict = field(default_factory=dict)


def read_snapshot(store, gate=None, labels=None) -> Snapshot:
    """Copy ``store``'s counters under its lock: no fold, no CUDA call (ClosedError when
    the store is closed)."""
    with store.lock:
        stats = store.stats(fold=False)
        engine = store.engine.stats() if hasattr(store.engine, "stats") else {}
        c = store.counters
        layers = c.layers
        snap = Snapshot(
            stats=stats,
            engine=engine,
            slot_bytes=int(store.slot_bytes),
            fire_hist=list(c.fire_hist),
            fire_seconds=float(c.fire_seconds),
            labels=dict(labels or {}),
        )
        if layers is not None:
            snap.by_residency = layers.by_residency.copy()
            snap.rows_read = layers.rows_read.copy()
    snap.gate = gate.stats() if gate is not None else None
    return snap


def _buckets(hist) -> list[tuple[str, float]]:
    """Cumulative (le, count) pairs at EXPORTED_EDGES from log2-us bucket counts."""
    counts = np.asarray(list(hist) + [0] * (LATENCY_BUCKETS - len(hist)), dtype=np.float64)
    cum = np.cumsum(counts)
    out = [(_edge_text(b), float(cum[b])) for b in EXPORTED_EDGES]
    out.append(("+Inf", float(cum[-1])))
    return out


def _edge_text(b: int) -> str:
    return repr((1 << b) * 1e-6)


class _Families:
    """Families by name, created on first use with the store labels + their own."""

    def __init__(self, label_names: tuple[str, ...]):
        self.label_names = label_names
        self.by_name: dict[str, object] = {}

    def add(self, name: str, extra: dict, value: float, labels: dict, sum_value=None) -> None:
        fam = self.by_name.get(name)
        names = self.label_names + tuple(extra)
        if fam is None:
            cls = {
                "counter": CounterMetricFamily,
                "gauge": GaugeMetricFamily,
                "histogram": HistogramMetricFamily,
            }[_KIND[name]]
            fam = self.by_name[name] = cls(PREFIX + name, _HELP[name], labels=names)
        values = [str(labels[k]) for k in self.label_names] + [str(v) for v in extra.values()]
        if _KIND[name] == "histogram":
            fam.add_metric(values, value, sum_value)
        else:
            fam.add_metric(values, float(value))


def families(snapshots: list[Snapshot]) -> list:
    """prometheus_client metric families for every snapshot (label sets must differ)."""
    label_names = tuple(sorted({k for s in snapshots for k in s.labels}))
    out = _Families(label_names)
    for snap in snapshots:
        labels = {k: snap.labels.get(k, "") for k in label_names}
        _store_families(out, snap, labels)
    return list(out.by_name.values())


def _store_families(out: _Families, snap: Snapshot, labels: dict) -> None:
    st, eng = snap.stats, snap.engine
    for tier in TIERS:
        t = getattr(st, tier)
        for name in ("hits", "misses", "distinct_hits", "distinct_misses", "promotions", "evictions"):
            out.add(name, {"tier": tier}, getattr(t, name), labels)
        for name in ("resident", "capacity", "pinned"):
            out.add(name, {"tier": tier}, getattr(t, name), labels)
    if snap.by_residency is not None:
        by = snap.by_residency
        per_tier = {"pool": (by[:, 2] + by[:, 3], by[:, 0] + by[:, 1]), "arena": (by[:, 1], by[:, 0])}
        for layer in range(by.shape[0]):
            key = {"layer": str(layer)}
            for tier, (hits, misses) in per_tier.items():
                out.add("layer_hits", {"tier": tier, **key}, hits[layer], labels)
                out.add("layer_misses", {"tier": tier, **key}, misses[layer], labels)
            out.add("layer_rows_read", key, snap.rows_read[layer], labels)
            out.add("layer_bytes_read", key, snap.rows_read[layer] * snap.slot_bytes, labels)
    for source in SOURCES:
        src = eng.get(source) or {}
        out.add("rows_read", {"source": source}, src.get("rows", 0), labels)
        out.add("bytes_read", {"source": source}, src.get("bytes", 0), labels)
        hist = src.get("latency_hist_us_log2")
        if hist is not None:
            name = "copy_latency_seconds" if source == "arena" else "read_latency_seconds"
            out.add(name, {} if source == "arena" else {"source": source}, _buckets(hist), labels)
    out.add("copied_bytes", {"kind": "h2d"}, eng.get("h2d_bytes", 0), labels)
    out.add("copied_bytes", {"kind": "host"}, eng.get("host_copy_bytes", 0), labels)
    for name, value in (
        ("fires", st.fires),
        ("fire_promoted", st.fire_promoted),
        ("fire_unplaced", st.fire_over_cap),
        ("lazy_promotions", st.lazy_queued),
        ("lazy_rejected", st.lazy_rejected),
        ("failed_reads", st.failed_reads),
        ("quarantined", st.quarantined),
        ("verify_failures", eng.get("checksum_failures", 0)),
        ("verified_rows", eng.get("verified_rows", 0)),
        ("record_dropped", st.record_dropped),
        ("steps", st.step_count),
    ):
        out.add(name, {}, value, labels)
    out.add("slot_bytes", {}, snap.slot_bytes, labels)
    out.add("fire_latency_seconds", {}, _buckets(snap.fire_hist), labels, sum_value=snap.fire_seconds)
    if snap.gate is not None:
        g = snap.gate
        for name, value in (
            ("gate_steps", g.steps),
            ("gate_fires", g.fires),
            ("gate_rounds", g.rounds),
            ("gate_promoted", g.promoted),
            ("gate_still_uncertain", g.still_uncertain),
        ):
            out.add(name, {}, value, labels)
