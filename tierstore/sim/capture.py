"""Routing capture from a running engine into the trace format (traces.py), bounded.

A face hands the routing it sees to a :class:`RoutingCapture` from the forward thread:
``record(layer, ids)`` (host ids of one layer) or ``record_counts(table)`` (an engine's
``seen`` table of one step: token counts, or 1 flags), then ``step()`` at each step end.
The capture keeps whole steps only, and stops at ``max_steps`` steps or ``max_bytes`` of
rows (12 bytes a row), whichever comes first: a step that would pass either bound is
dropped and the capture is full. Then (or at ``close()``) it writes ONE trace, atomically
(``save_trace``: temp file, fsync, rename; the ``.meta.json`` beside it the same way), on
a background thread ``tierstore-capture`` so the forward thread never waits on the disk.
The file feeds ``tierstore bench hits --trace``, ``tierstore plan --trace`` (hit-rate
curve, recommended pool, ``--warm-out`` warm-start file) like any capture-format trace.

Rows of a step keep the order the face gave them (a counts table: by layer, then expert;
each key repeated by its count, so token weight survives). Ticks count steps from 0.
Thread safety: ``record*`` and ``step`` from one thread (the forward thread); ``close``
from any thread after the last ``step``.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import numpy as np

from tierstore.errors import ConfigError
from tierstore.sim.traces import save_trace

log = logging.getLogger("tierstore.capture")
ROW_BYTES = 12  # int32 [tick, layer, expert]


class RoutingCapture:
    """A bounded routing capture written to ``path`` (see the module doc).

    ``max_steps`` / ``max_bytes``: the bounds (None: the ``capture_max_steps`` /
    ``capture_max_mb`` settings). ``meta``: fields for the trace's ``.meta.json`` (the
    model, the engine...); ``num_experts`` there lets readers size the key space."""

    def __init__(
        self, path, *, max_steps: int | None = None, max_bytes: int | None = None, meta: dict | None = None
    ):
        from tierstore import settings

        self.path = Path(os.fspath(path))
        if self.path.suffix != ".npy":
            raise ConfigError(f"routing capture {self.path}: the file name must end in .npy")
        if not self.path.parent.is_dir():
            raise ConfigError(f"routing capture {self.path}: directory {self.path.parent} does not exist")
        self.max_steps = int(settings.get("capture_max_steps") if max_steps is None else max_steps)
        mb = settings.get("capture_max_mb")
        self.max_bytes = int(mb * (1 << 20)) if max_bytes is None else int(max_bytes)
        if self.max_steps < 1 or self.max_bytes < ROW_BYTES:
            raise ConfigError(
                f"routing capture {self.path}: max_steps must be >= 1 and "
                f"max_bytes >= {ROW_BYTES}, found {self.max_steps}, {self.max_bytes}"
            )
        self.meta = dict(meta or {})
        self.tick = 0
        self.rows = 0
        self.full_reason: str | None = None
        self._chunks: list[np.ndarray] = []  # committed steps
        self._step: list[np.ndarray] = []  # the step being recorded
        self._step_rows = 0
        self._writer: threading.Thread | None = None
        self._saved: Path | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, meta: dict | None = None, path=None) -> RoutingCapture | None:
        """A capture to ``path`` (default the ``capture`` setting, TIERSTORE_CAPTURE), or
        None when neither names a file."""
        from tierstore import settings

        path = path or settings.get("capture")
        return None if not path else cls(path, meta=meta)

    @property
    def full(self) -> bool:
        return self.full_reason is not None

    @property
    def n_bytes(self) -> int:
        return self.rows * ROW_BYTES

    # -- the forward thread --------------------------------------------------------------
    def record(self, layer: int, ids) -> None:
        """Routed expert ids of ``layer`` in this step (host ids: a numpy array or a CPU
        tensor, any shape; ids < 0 are padding and dropped)."""
        if self.full:
            return
        flat = np.asarray(ids).reshape(-1)
        flat = flat[flat >= 0]
        chunk = np.empty((flat.size, 3), dtype=np.int32)
        chunk[:, 0] = self.tick
        chunk[:, 1] = int(layer)
        chunk[:, 2] = flat
        self._step.append(chunk)
        self._step_rows += flat.size

    def record_counts(self, counts) -> None:
        """One step's routing as a table ``[n_layers, n_experts]`` of token counts (or 1
        flags): each (layer, expert) becomes ``count`` rows, by layer then expert."""
        if self.full:
            return
        table = np.asarray(counts)
        if table.ndim != 2:
            raise ConfigError(
                f"routing capture: counts must be [n_layers, n_experts], found shape {list(table.shape)}"
            )
        self.meta.setdefault("num_experts", int(table.shape[1]))
        flat = table.reshape(-1).astype(np.int64, copy=False)
        keys = np.flatnonzero(flat > 0)
        keys = np.repeat(keys, flat[keys])
        chunk = np.empty((keys.size, 3), dtype=np.int32)
        chunk[:, 0] = self.tick
        chunk[:, 1], chunk[:, 2] = np.divmod(keys, table.shape[1])
        self._step.append(chunk)
        self._step_rows += keys.size

    def step(self) -> None:
        """End of a step: keep it if both bounds still hold, else the capture is full
        (this step dropped) and the trace is written in the background."""
        if self.full:
            return
        if (self.rows + self._step_rows) * ROW_BYTES > self.max_bytes:
            self._fill("max_bytes")
        else:
            self._chunks.extend(self._step)
            self.rows += self._step_rows
            self.tick += 1
            self._step, self._step_rows = [], 0
            if self.tick == self.max_steps:
                self._fill("max_steps")

    def _fill(self, reason: str) -> None:
        self.full_reason = reason
        self._step, self._step_rows = [], 0
        if not self.tick:  # not even the first step fits: nothing to write
            log.warning(
                "routing capture %s: the first step alone passes max_bytes=%d; nothing captured",
                self.path,
                self.max_bytes,
            )
            return
        log.info(
            "routing capture %s full (%s): %d steps, %d rows; writing it",
            self.path,
            reason,
            self.tick,
            self.rows,
        )
        self._start_writer()

    # -- writing -----------------------------------------------------------------------------
    def _start_writer(self) -> None:
        with self._lock:
            if self._writer is not None or self._saved is not None:
                return
            self._writer = threading.Thread(target=self._write, name="tierstore-capture", daemon=True)
            self._writer.start()

    def _write(self) -> None:
        try:
            self._saved = self._save_now()
        except BaseException as exc:  # noqa: BLE001 - reported by close()
            self._error = exc
            log.warning("routing capture %s: writing failed: %s", self.path, exc)

    def _save_now(self) -> Path:
        rows = np.concatenate(self._chunks) if self._chunks else np.empty((0, 3), dtype=np.int32)
        layers = sorted(int(x) for x in np.unique(rows[:, 1])) if len(rows) else []
        meta = {
            **self.meta,
            "name": self.path.stem,
            "n_ticks": self.tick,
            "columns": ["tick", "layer", "expert"],
            "layers_present": layers,
            "captured_by": "tierstore.sim.capture.RoutingCapture",
            "max_steps": self.max_steps,
            "max_bytes": self.max_bytes,
            "truncated": self.full_reason,
        }
        return save_trace(self.path, rows, meta)

    def close(self, timeout: float | None = 60.0) -> Path | None:
        """Write what was captured (if the capture is not full yet; an unfinished step is
        dropped) and wait for the writer. Returns the trace path, or None when no step
        was captured. Raises what the write raised (TierIOError naming the file)."""
        if not self.full and self.tick:
            self._fill("closed")
        writer = self._writer
        if writer is not None:
            writer.join(timeout)
            if writer.is_alive():
                raise ConfigError(f"routing capture {self.path}: still writing after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._saved
