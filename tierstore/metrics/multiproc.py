"""Writing a process's store metrics into prometheus_client's multiprocess files.

When the process that serves ``/metrics`` is not the one holding the stores (vLLM: the
API server vs the EngineCore / one worker per GPU), each worker writes its families into
a shared directory in prometheus_client's multiprocess format, and the serving process
reads the directory with ``prometheus_client.multiprocess.MultiProcessCollector`` (vLLM
does exactly that for its own metrics when ``PROMETHEUS_MULTIPROC_DIR`` is set).

Why our own writer and not prometheus_client's ``Counter`` / ``Gauge`` objects: those
pick in-memory or file-backed values once, when prometheus_client is first imported, so a
worker forked from a process that imported it earlier would keep its values in memory,
unseen. The writer uses prometheus_client's own file layer (``MmapedDict``, ``mmap_key``)
directly, in files named ``<type>_tierstore-<pid>.db`` (never the names prometheus_client
itself uses in the same process). Values are absolute: counters are this process's totals
(the collector sums over processes; a dead worker's file keeps its last totals), gauges
are ``livesum`` (summed over live processes; removed when the process unregisters its
last store), histogram buckets are written per bucket (the collector accumulates them).
"""

from __future__ import annotations

import os

from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import mark_process_dead

GAUGE_MODE = "livesum"


def process_token(pid: int | None = None) -> str:
    """The pid part of this process's file names."""
    return f"tierstore-{os.getpid() if pid is None else pid}"


class MultiprocWriter:
    """Writes metric families into ``directory`` for one process. Not thread-safe: the
    registry's lock serialises every call."""

    def __init__(self, directory: str):
        self.directory = os.fspath(directory)
        self.pid = os.getpid()
        self._files: dict[str, MmapedDict] = {}

    def _file(self, prefix: str) -> MmapedDict:
        f = self._files.get(prefix)
        if f is None:
            name = os.path.join(self.directory, f"{prefix}_{process_token(self.pid)}.db")
            f = self._files[prefix] = MmapedDict(name)
        return f

    def write(self, families, zero_gauges: bool = False) -> None:
        """Write every sample of ``families`` (prometheus_client metric families);
        ``zero_gauges``: gauges as 0 (a store that left: its share of a livesum ends)."""
        for fam in families:
            if fam.type == "gauge":
                f = self._file(f"gauge_{GAUGE_MODE}")
            else:
                f = self._file(fam.type)
            samples = fam.samples
            if fam.type == "histogram":
                samples = _per_bucket(samples)
            for s in samples:
                labels = dict(s.labels)
                value = 0.0 if (zero_gauges and fam.type == "gauge") else float(s.value)
                key = mmap_key(fam.name, s.name, list(labels), list(labels.values()), fam.documentation)
                f.write_value(key, value, 0.0)

    def close(self, dead: bool = False) -> None:
        """Close the files; ``dead``: also remove this process's live gauges (no store
        left), as prometheus_client's mark_process_dead does for a worker that exits."""
        for f in self._files.values():
            f.close()
        self._files.clear()
        if dead:
            mark_process_dead(process_token(self.pid), self.directory)


def _per_bucket(samples) -> list:
    """Histogram samples as the multiprocess files keep them: each bucket's own count
    (not cumulative), and ``_sum``; ``_count`` is derived by the collector."""
    out, last = [], {}
    for s in samples:
        if s.name.endswith("_bucket"):
            rest = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            prev = last.get(rest, 0.0)
            last[rest] = s.value
            out.append(s._replace(value=s.value - prev))
        elif s.name.endswith("_sum"):
            out.append(s)
    return out
