"""Which stores report metrics, and how their numbers leave the process.

``register_store(store, labels)`` adds a store. Then, per process, one of two ways:

* **in-process** (no metrics directory): one ``StoreCollector`` in prometheus_client's
  global ``REGISTRY`` builds the families of every registered store at scrape time, from
  the store's own counters. Whatever serves that registry shows them (``serve()``, or an
  application's own ``/metrics``).
* **multiprocess** (``PROMETHEUS_MULTIPROC_DIR``, or the ``metrics_dir`` setting): a
  daemon thread, ``tierstore-metrics``, writes the families into the directory every
  ``metrics_interval_s`` seconds (and once more when a store is unregistered); the
  process serving ``/metrics`` reads the directory (multiproc.py).

The thread only takes each store's lock to copy counters (no fold, no CUDA call, no
I/O under the lock), so it is safe while an engine captures CUDA graphs. After a fork
the child starts with no registered store (the parent's stores are not the child's).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import weakref

from tierstore import settings
from tierstore.errors import ClosedError, ConfigError
from tierstore.metrics.families import families, read_snapshot

log = logging.getLogger("tierstore.metrics")

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_RESERVED = {"tier", "layer", "source", "kind", "le", "pid", "quantile"}


def metrics_dir() -> str | None:
    """The directory worker processes write into: PROMETHEUS_MULTIPROC_DIR (the
    scraping side's own multiprocess registry reads it), else the ``metrics_dir``
    setting (TIERSTORE_METRICS_DIR), else None (in-process metrics)."""
    return (
        os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        or os.environ.get("TIERSTORE_METRICS_DIR")
        or settings.get("metrics_dir")
    )


class StoreMetrics:
    """One registered store. ``close()`` (or ``unregister_store(store)``) ends it; a
    closed store stops reporting by itself at the next collection."""

    def __init__(self, store, labels: dict, gate=None):
        self._store = weakref.ref(store)
        self.labels = labels
        self.gate = gate

    @property
    def store(self):
        return self._store()

    def snapshot(self):
        """This store's counters now, or None when it is gone or closed."""
        store = self._store()
        if store is None or store.closed:
            return None
        try:
            return read_snapshot(store, self.gate, self.labels)
        except ClosedError:
            return None

    def close(self) -> None:
        _REGISTRY.remove(self)

    def __repr__(self) -> str:
        return f"StoreMetrics({self.labels})"


class _Registry:
    def __init__(self):
        self.lock = threading.Lock()
        self.entries: list[StoreMetrics] = []
        self.collector = None  # StoreCollector in REGISTRY (in-process mode)
        self.writer = None  # MultiprocWriter (multiprocess mode)
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()

    # -- collection -------------------------------------------------------------------
    def snapshots(self) -> list:
        with self.lock:
            entries = list(self.entries)
        out = []
        for e in entries:
            snap = e.snapshot()
            if snap is None:
                self.remove(e, final=False)
            else:
                out.append(snap)
        return out

    def collect(self):
        return families(self.snapshots())

    # -- membership ---------------------------------------------------------------------
    def add(self, entry: StoreMetrics) -> None:
        with self.lock:
            # stores closed or collected since the last collection leave first
            self.entries = [e for e in self.entries if e.store is not None and not e.store.closed]
            for e in self.entries:
                if e.store is entry.store and entry.store is not None:
                    raise ConfigError(
                        f"register_store: {entry.store!r} is already registered (labels {e.labels})"
                    )
                if e.labels == entry.labels:
                    raise ConfigError(
                        f"register_store: labels {entry.labels} are already used "
                        f"by {e.store!r}; give each store distinct labels "
                        f"(e.g. rank=...)"
                    )
            self.entries.append(entry)
            directory = metrics_dir()
            if directory is None:
                self._install_collector()
            else:
                self._start_writer(directory)

    def remove(self, entry: StoreMetrics, final: bool = True) -> None:
        with self.lock:
            if entry not in self.entries:
                return
            if self.writer is not None:
                self._write_one(entry, last=True, final=final)
            self.entries.remove(entry)
            if not self.entries and self.writer is not None:
                self.stop.set()
                self.writer.close(dead=True)
                self.writer = None

    def _install_collector(self) -> None:
        if self.collector is None:
            from prometheus_client import REGISTRY

            self.collector = StoreCollector(self)
            REGISTRY.register(self.collector)

    def _start_writer(self, directory: str) -> None:
        if self.writer is not None:
            return
        if not os.path.isdir(directory):
            raise ConfigError(
                f"metrics directory {directory} does not exist (set by "
                f"PROMETHEUS_MULTIPROC_DIR or TIERSTORE_METRICS_DIR)"
            )
        from tierstore.metrics.multiproc import MultiprocWriter

        self.writer = MultiprocWriter(directory)
        # A fresh event per writer: a thread of an earlier writer (its event set) exits.
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=self._loop, args=(self.stop,), name="tierstore-metrics", daemon=True
        )
        self.thread.start()

    # -- the writer thread ------------------------------------------------------------------
    def _loop(self, stop: threading.Event) -> None:
        while not stop.wait(settings.get("metrics_interval_s")):
            self.write_now()

    def write_now(self) -> None:
        """Write every registered store's families now (multiprocess mode)."""
        snaps = self.snapshots()
        with self.lock:
            if self.writer is not None and snaps:
                try:
                    self.writer.write(families(snaps))
                except OSError as exc:  # a full disk, a removed directory: log, keep serving
                    log.warning("writing metrics into %s failed: %s", self.writer.directory, exc)

    def _write_one(self, entry: StoreMetrics, last: bool, final: bool) -> None:
        """(lock held) The store's last values, its gauges zeroed (it leaves the sum)."""
        snap = entry.snapshot() if final else None
        if snap is not None:
            try:
                self.writer.write(families([snap]), zero_gauges=last)
            except OSError as exc:
                log.warning("writing metrics into %s failed: %s", self.writer.directory, exc)

    def reset_after_fork(self) -> None:
        """In a forked child: nothing registered, no thread, no files (the parent's)."""
        self.lock = threading.Lock()
        self.entries = []
        self.writer = None
        self.thread = None
        self.stop = threading.Event()


class StoreCollector:
    """prometheus_client collector over the registered stores (in-process mode)."""

    def __init__(self, registry: _Registry):
        self._registry = registry

    def collect(self):
        return self._registry.collect()

    def describe(self):
        return []  # families depend on what is registered: collected at scrape time


_REGISTRY = _Registry()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_REGISTRY.reset_after_fork)


def _check_labels(labels: dict) -> dict:
    out = {}
    for k, v in labels.items():
        if not isinstance(k, str) or not _LABEL_NAME.match(k) or k.startswith("__"):
            raise ConfigError(
                f"register_store: label name {k!r} is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)"
            )
        if k in _RESERVED:
            raise ConfigError(
                f"register_store: label {k!r} is used by tierstore's own "
                f"metrics ({', '.join(sorted(_RESERVED))}); choose another name"
            )
        out[k] = str(v)
    return out


def register_store(store, labels: dict | None = None, *, gate=None) -> StoreMetrics | None:
    """Report ``store``'s metrics (docs/METRICS.md) under ``labels`` (default
    ``{"tag": <pack tag>}``; label sets must differ between stores of one process).
    ``gate``: an UncertaintyGate whose counters are reported with the store's.

    Returns the handle (``.close()`` ends it), or None when the ``metrics`` setting is
    off. Call it when the store opens; nothing changes on the store's hot path (its own
    counters are read at collection). ConfigError for bad labels, a store registered
    twice, or a metrics directory that does not exist."""
    if not settings.get("metrics"):
        return None
    if store.counters.layers is None:
        log.info("%s: opened with the metrics setting off: no per-layer counts", store)
    given = dict(labels) if labels is not None else {"tag": store.pack.tag}
    entry = StoreMetrics(store, _check_labels(given), gate)
    _REGISTRY.add(entry)
    return entry


def unregister_store(store) -> bool:
    """Stop reporting ``store`` (its last values are written first in multiprocess
    mode). False when it was not registered."""
    with _REGISTRY.lock:
        found = [e for e in _REGISTRY.entries if e.store is store]
    for e in found:
        _REGISTRY.remove(e)
    return bool(found)


def registered() -> list[StoreMetrics]:
    with _REGISTRY.lock:
        return list(_REGISTRY.entries)


def write_now() -> None:
    """Multiprocess mode: write every registered store's metrics now (tests, shutdown)."""
    _REGISTRY.write_now()
