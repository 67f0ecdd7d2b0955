"""The latency view's lead-time model: when a read lands, so whether a row is
resident when its layer reads (the latency view of ``tierstore bench hits``).

Two rules, always:
- a prefetch is issued after layer l has read the slot table and targets layer
  l + ``lead`` or later (``lead`` >= 1, the prefetcher's own parameter): it can
  never help the layer that asked;
- a demand miss blocks its layer: it is a latency miss however fast it lands.

When a read lands:
- untimed (``row_seconds == 0``, the default): a prefetch lands before the layer
  it targets reads, i.e. ``row_bytes / bandwidth`` plus queueing is assumed to
  fit within ``lead`` layers of compute. An upper bound for prefetch.
- timed (``row_seconds > 0``): one read queue, first in first out (the store's
  order: a layer's prefetch is queued at its record, before the fire's demand
  reads). A read starts when the queue is free, occupies it ``row_seconds``
  (= row_bytes / the measured bandwidth) and lands ``latency_seconds`` later.
  Each (tick, layer) read group takes ``layer_seconds`` of compute after its
  rows are in; a group whose resident rows have not all landed, or that
  demand-reads, waits for them. A row resident but not landed when its layer
  reads is a latency miss (a stall) and not a second read.
Only prefetching models can differ between the two (every row a demand fill made
resident has landed before the next group reads).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from tierstore.errors import ConfigError


@dataclass(frozen=True)
class LeadTime:
    lead: int = 1  # layers between the read that issues a prefetch and its target
    row_seconds: float = 0.0  # queue time per row (row_bytes / bandwidth); 0: untimed
    latency_seconds: float = 0.0  # from a read's end in the queue to the row being usable
    layer_seconds: float = 0.0  # compute per (tick, layer) read group

    def __post_init__(self):
        if int(self.lead) < 1:
            raise ConfigError(
                f"lead time: a prefetch must be issued at least one layer ahead, got lead {self.lead}"
            )
        if min(self.row_seconds, self.latency_seconds, self.layer_seconds) < 0:
            raise ConfigError(
                f"lead time: seconds must be >= 0, got row {self.row_seconds}, "
                f"latency {self.latency_seconds}, layer {self.layer_seconds}"
            )
        if self.row_seconds > 0 and self.layer_seconds <= 0:
            raise ConfigError(
                "lead time: a timed model (row seconds > 0) needs the "
                "compute time of a layer (layer seconds > 0)"
            )

    @classmethod
    def measured(
        cls,
        lead: int = 1,
        row_bytes: int = 0,
        read_gbps: float | None = None,
        layer_us: float | None = None,
        latency_us: float = 0.0,
    ) -> LeadTime:
        """From a row size and a measured read bandwidth (GB/s, 1e9 B/s); untimed
        when ``read_gbps`` is None."""
        if read_gbps is None:
            return cls(int(lead))
        if row_bytes <= 0 or not read_gbps > 0 or layer_us is None or not layer_us > 0:
            raise ConfigError(
                f"lead time: a read bandwidth ({read_gbps} GB/s) needs row bytes "
                f"> 0 and a layer time > 0 (got {row_bytes} B, {layer_us} us)"
            )
        return cls(int(lead), row_bytes / (read_gbps * 1e9), latency_us * 1e-6, layer_us * 1e-6)

    @property
    def timed(self) -> bool:
        return self.row_seconds > 0

    def describe(self) -> str:
        """One line stating the model (printed with every latency table)."""
        head = (
            f"lead-time model: a prefetch is issued after layer l reads and targets layer "
            f"l+{self.lead} or later; a demand miss blocks its layer"
        )
        if not self.timed:
            return head + (
                "; untimed: a prefetch is assumed to land before its target layer reads (upper bound)"
            )
        return head + (
            f"; timed: one FIFO read queue, {self.row_seconds * 1e6:.1f} us per "
            f"row, +{self.latency_seconds * 1e6:.1f} us latency, "
            f"{self.layer_seconds * 1e6:.1f} us compute per layer; a row not "
            f"landed when its layer reads is a miss"
        )

    def as_dict(self) -> dict:
        return {**asdict(self), "timed": self.timed, "text": self.describe()}


class Clock:
    """The timed model's state over one replay (see module doc): the read queue,
    the time now, and when each key's last read lands."""

    def __init__(self, model: LeadTime, n_keys: int):
        self.m = model
        self.now = 0.0
        self.queue_free = 0.0
        self.lands = np.zeros(int(n_keys))

    def landed(self, u: np.ndarray, resident: np.ndarray) -> np.ndarray:
        """Of group keys ``u`` with residency ``resident``: which had landed at the
        group's read. Moves the clock to when every resident one has."""
        t = self.lands[u]
        ok = resident & (t <= self.now)
        late = resident & ~ok
        if late.any():
            self.now = max(self.now, float(t[late].max()))
        return ok

    def issue(self, keys: np.ndarray) -> None:
        """Queue reads of ``keys`` now, in order."""
        n = int(keys.size)
        if n == 0:
            return
        start = max(self.queue_free, self.now)
        ends = start + self.m.row_seconds * np.arange(1, n + 1)
        self.lands[keys] = ends + self.m.latency_seconds
        self.queue_free = float(ends[-1])

    def demand(self, keys: np.ndarray) -> None:
        """Queue demand reads of ``keys`` and wait for them."""
        if keys.size:
            self.issue(keys)
            self.now = max(self.now, float(self.lands[keys].max()))

    def compute(self) -> None:
        self.now += self.m.layer_seconds
