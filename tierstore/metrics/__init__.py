"""Prometheus metrics of ExpertStores: hits and misses per tier and per layer, rows and
bytes read per source, read / copy / fire latency histograms, fires, verify failures,
pool and arena occupancy, pins (the full list: docs/METRICS.md).

Standalone, one process::

    from tierstore import metrics
    metrics.register_store(store)          # when the store opens
    exporter = metrics.serve(9400)         # http://127.0.0.1:9400/metrics

Stores in worker processes, ``/metrics`` in another (vLLM)::

    metrics.setup_scrape_process()         # in the serving process, before workers start
    metrics.register_store(store, {"rank": str(rank)})   # in each worker, at store open

Cost: nothing is incremented per row or per call for metrics. A store keeps plain
counters anyway; with the ``metrics`` setting on it also counts per layer (one bincount
per fold and per load batch) and every fire lands in a latency histogram (one bucket
add). Families are built from those counters at scrape time (in-process) or every
``metrics_interval_s`` by a writer thread (multiprocess). ``TIERSTORE_METRICS=0`` turns
all of it off: ``register_store`` returns None and stores count nothing per layer.
"""

from tierstore.metrics.exporter import Exporter, scrape_registry, serve, setup_scrape_process, start_exporter
from tierstore.metrics.families import METRICS, PREFIX
from tierstore.metrics.registry import (
    StoreMetrics,
    metrics_dir,
    register_store,
    registered,
    unregister_store,
    write_now,
)

__all__ = [
    "register_store",
    "unregister_store",
    "registered",
    "StoreMetrics",
    "serve",
    "start_exporter",
    "Exporter",
    "scrape_registry",
    "setup_scrape_process",
    "metrics_dir",
    "write_now",
    "METRICS",
    "PREFIX",
]
