"""Serving the metrics: a standalone exporter, and the scraping side of several processes.

* ``serve(port)``: one call starts an HTTP exporter (prometheus_client's, a daemon
  thread) on ``addr:port`` (default 127.0.0.1; port 0 picks a free one) serving the
  registry below; returns an ``Exporter`` with the bound ``port`` and ``close()``.
* ``scrape_registry()``: what a ``/metrics`` of this process should serve: with a
  metrics directory, a fresh registry reading every process's files there
  (``MultiProcessCollector``); else prometheus_client's global ``REGISTRY``, where
  ``register_store`` put its in-process collector.
* ``setup_scrape_process()``: for a server whose ``/metrics`` runs in another process
  than its stores (vLLM's API server), called there BEFORE the worker processes start.
  With ``PROMETHEUS_MULTIPROC_DIR`` set (vLLM with several API servers, or the user's)
  nothing is needed: the workers write into it and vLLM's own multiprocess registry
  reads it. Without it (vLLM's default: one API server serving the global ``REGISTRY``)
  a private temporary directory is made, exported as ``TIERSTORE_METRICS_DIR`` for the
  workers to inherit, and a ``MultiProcessCollector`` over it is registered in the
  global ``REGISTRY``, so the tierstore families appear on the server's own ``/metrics``
  next to vLLM's. ``PROMETHEUS_MULTIPROC_DIR`` is never set by us: that would switch
  vLLM's own registry to multiprocess mode and hide its in-process metrics.
"""

from __future__ import annotations

import os
import tempfile
import threading
from dataclasses import dataclass

from tierstore import settings
from tierstore.errors import ConfigError
from tierstore.metrics.registry import metrics_dir

_setup_lock = threading.Lock()
_private: tempfile.TemporaryDirectory | None = None
_collector_dirs: set[str] = set()  # directories whose collector this process registered


def scrape_registry():
    """The registry a /metrics endpoint of this process serves (see the module doc)."""
    from prometheus_client import REGISTRY, CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    directory = metrics_dir()
    if directory is None or directory in _collector_dirs:
        return REGISTRY
    if not os.path.isdir(directory):
        raise ConfigError(
            f"metrics directory {directory} does not exist (set by "
            f"PROMETHEUS_MULTIPROC_DIR or TIERSTORE_METRICS_DIR)"
        )
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)
    return registry


def setup_scrape_process() -> str:
    """Make worker processes' store metrics reach this process's ``/metrics`` (module
    doc); call before the workers start. Returns the directory they write into.
    Idempotent."""
    global _private
    from prometheus_client import REGISTRY
    from prometheus_client.multiprocess import MultiProcessCollector

    with _setup_lock:
        shared = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if shared:
            return shared
        directory = os.environ.get("TIERSTORE_METRICS_DIR") or settings.get("metrics_dir")
        if not directory:
            _private = tempfile.TemporaryDirectory(prefix="tierstore-metrics-")
            directory = _private.name
        elif not os.path.isdir(directory):
            raise ConfigError(f"TIERSTORE_METRICS_DIR={directory}: not a directory")
        os.environ["TIERSTORE_METRICS_DIR"] = directory  # inherited by the workers
        settings.set("metrics_dir", directory)
        if directory not in _collector_dirs:
            MultiProcessCollector(REGISTRY, path=directory)
            _collector_dirs.add(directory)
        return directory


def _forget_private_in_child() -> None:
    # A forked worker must not remove the scraping process's directory when it exits.
    if _private is not None:
        _private._finalizer.detach()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_private_in_child)


@dataclass
class Exporter:
    """A running exporter: ``port`` it listens on, ``close()`` stops it."""

    port: int
    addr: str
    _server: object
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve(port: int = 9400, addr: str = "127.0.0.1") -> Exporter:
    """Start an HTTP exporter of this process's metrics (``scrape_registry()``) on
    ``addr:port``; port 0 picks a free port (``Exporter.port``). ConfigError when the
    port is taken or the address cannot be bound."""
    from prometheus_client import start_http_server

    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"metrics.serve: port must be an int in [0, 65535], found {port!r}")
    try:
        server, thread = start_http_server(port, addr=addr, registry=scrape_registry())
    except OSError as exc:
        raise ConfigError(
            f"metrics.serve: cannot listen on {addr}:{port} ({exc.strerror or exc}); choose another port"
        ) from None
    return Exporter(port=int(server.server_port), addr=addr, _server=server, _thread=thread)


start_exporter = serve
