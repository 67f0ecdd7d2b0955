"""The prefetcher: cross-layer and next-token prefetch, budgeted in reads, learned
online. One implementation, driven the same way by the simulator
(``tierstore.sim.prefetching``) and the live store (``tierstore.store.prefetch``).

What a tier does with it, at every read of the slot table by layer ``l``
(one (tick, layer) group), in this order:

1. count hits (residency before anything below) and fold the accesses into its policy;
2. ``release = on_read(l, experts, hit)``: unpin ``release`` (what was held for
   layer ``l``), the prefetcher learns from what ``l`` routed;
3. ``fetch, hold = propose(l, resident)``: pin ``hold`` (until its layer reads)
   and read ``fetch`` (a subset of ``hold``, hottest first) into slots, over the
   policy's victims, neither the group's own keys nor anything pinned;
4. demand-fill the group's misses (if the tier does), the same keys protected.
At the end of a tick, ``end_tick()``.

Prediction (``tierstore.policies.corouting``): after layer l reads at tick t,
the target is layer m = l + ``lead`` (same tick; cross-layer counts from l's
experts mixed with next-token counts from m's experts at t - 1) or, past the
last layer, layer m - L at t + 1 (next-token counts from its experts at t).
``lead`` is the lead-time model: a prefetch issued after layer l is usable
from layer l + lead (1: a row lands within one layer's compute).

Budget, in reads, self-tuned (no per-trace knob):
- a shadow LRU of the tier's capacity (keys only) counts the reads plain LRU
  demand fill makes on the same accesses (``lru_reads``); the tier's reads are
  its misses (every miss counted as a read, so a tier that serves misses from
  elsewhere is counted conservatively) plus the prefetches issued;
- a useful prefetch replaces the demand read it anticipates, so a candidate of
  calibrated probability p costs 1 - p reads in expectation (a wasted read). The
  credit is ``read_ratio * lru_reads - reads`` plus the expected savings of the
  prefetches still in flight (the sum of their p), less ``WASTED_READ`` reads per
  recently wasted prefetch (decayed, half-life ``PRECISION_HALF_LIFE`` ticks): its
  victim may miss later, after the budget saw the prefetch;
- the harm to a fetch's victim: given ``victims`` (the keys whose slots the
  fetches would take, in order, -1 for a free slot), a wasted fetch also costs
  the victim's re-read when its layer next routes it, so a candidate of
  calibrated p whose victim's layer routes the victim next with probability h
  costs (1 - p)(1 + h) (h from the same model: the target layer's prediction
  for a victim of that layer, else its layer's decayed marginal over the tokens
  of its next read). A fetch that evicts a likely key costs more credit, so
  the budget cuts it first. A proposal fetches the
  best candidates while their summed expected cost plus ``Z`` standard
  deviations of it stays within the credit. With ``read_ratio = 1`` total reads
  stay at LRU's; candidates that pay for themselves (p = 1) need no credit, so
  only inaccurate prediction is ever refused (bench/prefetch_bound.py);
- the probabilities are calibrated online: every non-resident candidate scored
  (fetched or not) is checked when its target layer reads, per bin of its raw
  estimate, so a model that is not accurate gets low calibrated p, spends
  nothing and the tier is its demand policy;
- a price (``threshold`` on the calibrated p) rises when the credit cut a
  proposal short and falls while credit is left over, so scarce reads go to
  the likeliest candidates over time;
- candidates are the target layer's experts ranked by predicted probability of
  being routed by the group's tokens; resident ones among the expected routed
  count are held (pinned, no read), only non-resident ones are fetched.
Past only: every decision at a read depends on the reads before it and on the
current read, never on later ones (tests/sim/test_prefetch.py permutes the future).

Implemented once, natively (csrc/store/include/tierstore/store/prefetcher.hpp,
``tierstore._C.Prefetcher``, with the budget's constants and the measurements that
chose them): this class is its face (the checks, and ``predict`` as the one place a
proposal's probabilities come from, so a bound can override it). It was a Python
loop of ~60 numpy calls per read (~110 us a layer at 43 x 256 keys, under the store
lock); the native core does the same steps in a few microseconds.
"""

from __future__ import annotations

import numpy as np

from tierstore.errors import ConfigError
from tierstore.policies.corouting import check_tables_fit
from tierstore.policies.native import native_module


class Prefetcher:
    """Online prefetch proposals for one tier of ``capacity`` slots over
    ``n_layers`` x ``n_experts`` dense keys (see module doc). ``top_k``: experts
    a token routes per layer (tokens of a group = its routings / top_k; None:
    the fewest routings a group had so far). ``cross`` / ``temporal``: which
    predictors run (both by default). Not thread safe: the tier serialises calls."""

    def __init__(
        self,
        n_layers: int,
        n_experts: int,
        capacity: int,
        *,
        read_ratio: float = 1.0,
        lead: int = 1,
        threshold: float = 0.2,
        half_life: float = 512.0,
        max_per_read: int | None = None,
        top_k: int | None = None,
        cross: bool = True,
        temporal: bool = True,
    ):
        L, E = int(n_layers), int(n_experts)
        if L <= 0 or E <= 0 or int(capacity) < 0:
            raise ConfigError(
                f"prefetch: need n_layers, n_experts > 0 and capacity >= 0, "
                f"got {n_layers}, {n_experts}, {capacity}"
            )
        if not 1 <= int(lead) <= max(L - 1, 1):
            raise ConfigError(f"prefetch: lead must be in [1, {max(L - 1, 1)}] layers, got {lead}")
        if not (read_ratio >= 0 and 0.0 < threshold <= 1.0):
            raise ConfigError(
                f"prefetch: read_ratio must be >= 0 and threshold in (0, 1], got {read_ratio}, {threshold}"
            )
        if top_k is not None and int(top_k) <= 0:
            raise ConfigError(f"prefetch: top_k must be > 0, got {top_k}")
        if max_per_read is not None and int(max_per_read) < 0:
            raise ConfigError(f"prefetch: max_per_read must be >= 0, got {max_per_read}")
        if not half_life > 0:
            raise ConfigError(f"prefetch: half_life must be > 0, got {half_life}")
        check_tables_fit(L, E, "prefetch")
        self._core = native_module().Prefetcher(
            L,
            E,
            int(capacity),
            float(read_ratio),
            int(lead),
            float(threshold),
            float(half_life),
            -1 if max_per_read is None else int(max_per_read),
            -1 if top_k is None else int(top_k),
            bool(cross),
            bool(temporal),
        )
        self.n_layers, self.n_experts, self.n_keys = L, E, L * E
        self.capacity, self.lead = int(capacity), int(lead)
        self.read_ratio = float(read_ratio)
        self.max_per_read = None if max_per_read is None else int(max_per_read)
        self.top_k = None if top_k is None else int(top_k)
        self.use_cross, self.use_temporal = bool(cross), bool(temporal)
        # bool [n_keys], the core's own: pinned by a proposal until its layer reads.
        self.held_mask = self._core.held_mask
        self.model = self._core.model  # tierstore._C.CoRouting (corouting.py)

    # -- accounting (the core's counters) ----------------------------------------------
    lru_reads = property(
        lambda self: self._core.lru_reads,
        lambda self, v: setattr(self._core, "lru_reads", int(v)),
        doc="Reads plain LRU demand fill made on the same accesses.",
    )
    misses = property(lambda self: self._core.misses, doc="Reads the tier missed.")
    issued = property(lambda self: self._core.issued, doc="Prefetches proposed.")
    useful = property(lambda self: self._core.useful, doc="Of those, routed by their target.")
    held_resident = property(
        lambda self: self._core.held_resident, doc="Resident keys held (pinned, no read) for a later layer."
    )
    in_flight = property(lambda self: self._core.in_flight, doc="Prefetches not yet read.")
    in_flight_p = property(
        lambda self: self._core.in_flight_p, doc="Expected savings of the reads in flight."
    )
    last_cost = property(
        lambda self: self._core.last_cost, doc="The last proposal's expected cost in reads (tests)."
    )
    threshold = property(
        lambda self: self._core.threshold,
        lambda self, v: setattr(self._core, "threshold", float(v)),
        doc="The price: the calibrated p a fetch needs now.",
    )
    hold_threshold = property(
        lambda self: self._core.hold_threshold,
        lambda self, v: setattr(self._core, "hold_threshold", float(v)),
        doc="The p a resident key needs to be held.",
    )

    @property
    def reads(self) -> int:
        """The tier's reads as the budget counts them: misses + prefetches issued."""
        return self._core.reads

    @property
    def precision(self) -> float:
        """Measured share of fetched rows routed by their target layer (prior 0.5)."""
        return self._core.precision

    def credit(self) -> float:
        """Expected reads the budget allows now (see module doc)."""
        return self._core.credit()

    def calibrated(self, p: np.ndarray, kind: int = 0) -> np.ndarray:
        """The measured chance that a candidate of raw probability ``p`` is routed
        by its target layer (per kind of target and bin, shrunk toward ``p``)."""
        return self._core.calibrated(np.ascontiguousarray(p, dtype=np.float64), int(kind))

    @property
    def _held(self) -> list[np.ndarray]:
        """Target layer -> the keys pinned for it (tests)."""
        return [self._core.held(m) for m in range(self.n_layers)]

    @property
    def _this(self) -> list[np.ndarray | None]:
        """Layer -> the experts it read this tick, None if it has not (tests)."""
        return [self._core.this_experts(m) for m in range(self.n_layers)]

    # -- events -----------------------------------------------------------------------
    def on_read(
        self, layer: int, experts: np.ndarray, hit: np.ndarray, routings: int | None = None
    ) -> np.ndarray:
        """Layer ``layer`` read the slot table for ``experts`` (unique, ascending),
        ``hit`` = which were resident; ``routings``: the group's routed (token,
        expert) pairs (default: one per expert). Returns the keys to unpin."""
        try:
            return self._core.on_read(
                int(layer),
                np.ascontiguousarray(experts, dtype=np.int64),
                np.ascontiguousarray(hit, dtype=bool),
                -1 if routings is None else int(routings),
            )
        except (IndexError, ValueError) as e:  # out of range, repeated, unpaired flags
            shown = np.asarray(experts).ravel()[:8].tolist()
            raise ConfigError(f"{e}: layer {layer}, experts {shown}") from None

    def propose(self, layer: int, resident: np.ndarray, victims=None) -> tuple[np.ndarray, np.ndarray]:
        """After ``layer``'s read (``resident``: bool [n_keys], resident or loading):
        (fetch, hold) dense keys, ``fetch`` to read now (likeliest first), ``hold``
        (``fetch`` included) to pin until their layer reads (see module doc).
        ``victims(n, blocked)``: the tier's answer to "which keys would n new rows
        evict, in order" (int64, -1 = a free slot; ``blocked``: bool [n_keys], keys
        that may not be victims); None: no victim is harmed (h = 0)."""
        core = self._core
        m, wraps = core.target(int(layer))
        p = self.predict(int(layer), m, wraps)
        if p is not None:
            p = np.ascontiguousarray(p, dtype=np.float64)
        answer = (
            None
            if victims is None
            else (lambda n, blocked: np.ascontiguousarray(victims(n, blocked), dtype=np.int64))
        )
        return core.propose(int(layer), p, np.ascontiguousarray(resident, dtype=bool), answer)

    def predict(self, layer: int, m: int, wraps: bool) -> np.ndarray | None:
        """float64 [n_experts]: P(routed by the target group) of layer ``m``'s experts,
        after ``layer`` read (``wraps``: ``m`` reads next tick); None: no prediction.
        The one place a proposal's probabilities come from (a bound overrides it; the
        model's own outputs are still recorded, to be scored when ``m`` reads)."""
        return self._core.predict(int(layer), int(m), bool(wraps))

    def end_tick(self) -> None:
        self._core.end_tick()
