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
- a prefetch is issued only while ``read_ratio * lru_reads - reads`` plus the
  expected savings of the prefetches still in flight (their count times the
  measured precision) is >= 1: with ``read_ratio = 1`` total reads stay at LRU's
  (a useful prefetch replaces the demand read it saves; only wasted ones and
  their victims' misses spend the credit that a better replacement policy earns);
- precision (usefulness) is measured: a fetched row is useful when its target
  layer routes it (it is pinned until then, so it is still resident), wasted
  otherwise; it also caps a proposal at the measured routed experts per read;
- candidates are the target layer's experts with predicted probability >=
  ``threshold``, best first; resident ones are held (pinned, no read), the
  others fetched while the budget lasts.
Past only: every decision at a read depends on the reads before it and on the
current read, never on later ones (tests/test_prefetch.py permutes the future).
"""
from __future__ import annotations

import math

import numpy as np

from tierstore.errors import ConfigError
from tierstore.policies.admission import ADMIT_ALL
from tierstore.policies.corouting import CoRouting
from tierstore.policies.fill import plan_fill
from tierstore.policies.lru import LRUPolicy

_EMPTY = np.empty(0, dtype=np.int64)
PRECISION_HALF_LIFE = 64.0  # ticks over which measured usefulness counts half
THRESHOLD_STEP = 1.02       # the threshold's multiplicative step per proposal
MIN_THRESHOLD, MAX_THRESHOLD = 0.1, 0.9
SAFETY = 0.005              # share of the budget held back (late victim misses)


class Prefetcher:
    """Online prefetch proposals for one tier of ``capacity`` slots over
    ``n_layers`` x ``n_experts`` dense keys (see module doc). Not thread safe:
    the tier serialises calls."""

    def __init__(self, n_layers: int, n_experts: int, capacity: int, *, read_ratio: float = 1.0,
                 lead: int = 1, threshold: float = 0.2, half_life: float = 512.0,
                 max_per_read: int | None = None):
        L, E = int(n_layers), int(n_experts)
        if L <= 0 or E <= 0 or int(capacity) < 0:
            raise ConfigError(f"prefetch: need n_layers, n_experts > 0 and capacity >= 0, "
                              f"got {n_layers}, {n_experts}, {capacity}")
        if not 1 <= int(lead) <= max(L - 1, 1):
            raise ConfigError(f"prefetch: lead must be in [1, {max(L - 1, 1)}] layers, got {lead}")
        if not (read_ratio >= 0 and 0.0 < threshold <= 1.0):
            raise ConfigError(f"prefetch: read_ratio must be >= 0 and threshold in (0, 1], "
                              f"got {read_ratio}, {threshold}")
        self.n_layers, self.n_experts, self.n_keys = L, E, L * E
        self.capacity, self.lead = int(capacity), int(lead)
        self.read_ratio, self.threshold = float(read_ratio), float(threshold)
        self.hold_threshold = float(threshold)  # resident keys are held at the starting bar
        self.max_per_read = None if max_per_read is None else int(max_per_read)
        self.model = CoRouting(L, E, self.lead, half_life)
        self.shadow = LRUPolicy(self.n_keys, max(self.capacity, 1))
        self._shadow_blocked = np.zeros(self.n_keys, dtype=bool)
        self.held_mask = np.zeros(self.n_keys, dtype=bool)
        self._held: list[np.ndarray] = [_EMPTY] * L     # target layer -> pinned keys
        self._fetched: list[np.ndarray] = [_EMPTY] * L  # target layer -> keys read for it
        self._pending: list[tuple | None] = [None] * L  # target layer -> (p_cross, p_temp)
        self._this: list[np.ndarray | None] = [None] * L  # layer -> experts this tick
        self._prev: list[np.ndarray | None] = [None] * L  # layer -> experts last tick
        self._decay = 2.0 ** (-1.0 / PRECISION_HALF_LIFE)
        self._useful_w = self._issued_w = 0.0   # decayed, for the precision estimate
        self._k_w = self._reads_w = 0.0         # decayed routed experts per read
        self.lru_reads = self.misses = self.issued = self.useful = self.held_resident = 0
        self.in_flight = 0

    # -- accounting -------------------------------------------------------------------
    @property
    def reads(self) -> int:
        """The tier's reads as the budget counts them: misses + prefetches issued."""
        return self.misses + self.issued

    @property
    def precision(self) -> float:
        """Measured share of fetched rows routed by their target layer (prior 0.5)."""
        return (self._useful_w + 0.5) / (self._issued_w + 1.0)

    def credit(self) -> float:
        """Reads the budget allows now (see module doc), less a safety share and one
        proposal's worth held back: the misses a prefetch's victims cause come
        later than the prefetch, so the budget sees them late."""
        return (self.read_ratio * (1.0 - SAFETY) * self.lru_reads - self.reads
                + self.precision * self.in_flight - self._cap())

    # -- events -----------------------------------------------------------------------
    def on_read(self, layer: int, experts: np.ndarray, hit: np.ndarray) -> np.ndarray:
        """Layer ``layer`` read the slot table for ``experts`` (unique, ascending),
        ``hit`` = which were resident. Returns the keys to unpin."""
        layer = int(layer)
        experts = np.asarray(experts, dtype=np.int64)
        keys = layer * self.n_experts + experts
        release = self._held[layer]
        if release.size:
            self.held_mask[release] = False
            self._held[layer] = _EMPTY
        fetched = self._fetched[layer]
        if fetched.size:
            used = int(np.count_nonzero(np.isin(fetched, keys, assume_unique=True)))
            self.useful += used
            self._useful_w += used
            self.in_flight -= fetched.size
            self._fetched[layer] = _EMPTY
        self.misses += int(hit.size - np.count_nonzero(hit))
        self._k_w += experts.size
        self._reads_w += 1.0
        self._learn(layer, experts)
        self._shadow_read(keys)
        return release

    def propose(self, layer: int, resident: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """After ``layer``'s read (``resident``: bool [n_keys], resident or loading):
        (fetch, hold) dense keys, ``fetch`` to read now (hottest first), ``hold``
        (``fetch`` included) to pin until their layer reads (see module doc)."""
        m = int(layer) + self.lead
        wraps = m >= self.n_layers
        m -= self.n_layers if wraps else 0
        model = self.model
        layer = int(layer)
        p_cross = None if wraps else model.predict(layer, self._this[layer], temporal=False)
        src = self._this[m] if wraps else self._prev[m]
        p_temp = None if src is None else model.predict(m, src, temporal=True)
        p = model.mix(p_cross, p_temp)
        self._pending[m] = (p_cross, p_temp)
        if p is None:
            return _EMPTY, _EMPTY
        cand = np.flatnonzero(p >= min(self.threshold, self.hold_threshold))
        if cand.size == 0:
            self._tune(False, max(int(math.floor(self.credit())), 0))
            return _EMPTY, _EMPTY
        cand = cand[np.argsort(-p[cand], kind="stable")][:self._cap()]
        pk = p[cand]
        keys = m * self.n_experts + cand
        fresh = ~self.held_mask[keys]  # not already held for this layer (it did not read)
        keys, pk = keys[fresh], pk[fresh]
        res = resident[keys]
        keep = keys[res & (pk >= self.hold_threshold)]
        want = keys[~res & (pk >= self.threshold)]
        allow = max(int(math.floor(self.credit())), 0)
        fetch = want[:allow]
        self._tune(want.size > allow, allow - fetch.size)
        hold = np.concatenate((keep, fetch))
        if hold.size:
            self.held_mask[hold] = True
            self._held[m] = np.concatenate((self._held[m], hold)) if self._held[m].size else hold
        if fetch.size:
            self._fetched[m] = (np.concatenate((self._fetched[m], fetch))
                                if self._fetched[m].size else fetch)
            self.issued += fetch.size
            self._issued_w += fetch.size
            self.in_flight += fetch.size
        self.held_resident += keep.size
        return fetch, hold

    def end_tick(self) -> None:
        self.model.tick()
        self._prev, self._this = self._this, [None] * self.n_layers
        d = self._decay
        self._useful_w *= d
        self._issued_w *= d
        self._k_w *= d
        self._reads_w *= d

    # -- internals --------------------------------------------------------------------
    def _tune(self, short: bool, spare: int) -> None:
        """The threshold is the price of a read: raised when the budget cut a
        proposal short, lowered while credit is left over after one, so the
        reads the budget allows go to the likeliest candidates over time."""
        if short:
            self.threshold = min(self.threshold * THRESHOLD_STEP, MAX_THRESHOLD)
        elif spare >= self._cap():
            self.threshold = max(self.threshold / THRESHOLD_STEP, MIN_THRESHOLD)

    def _cap(self) -> int:
        k = self._k_w / self._reads_w if self._reads_w > 0 else 1.0
        cap = max(int(math.ceil(k)), 1)
        return cap if self.max_per_read is None else min(cap, self.max_per_read)

    def _learn(self, layer: int, experts: np.ndarray) -> None:
        model = self.model
        pend = self._pending[layer]
        if pend is not None:
            model.score(pend[0], pend[1], experts, max(int(round(self._k_w / self._reads_w)), 1))
            self._pending[layer] = None
        src = layer - self.lead
        if src >= 0 and self._this[src] is not None:
            model.learn(src, self._this[src], experts, temporal=False)
        if self._prev[layer] is not None:
            model.learn(layer, self._prev[layer], experts, temporal=True)
        self._this[layer] = experts
        model.observe(layer, experts)

    def _shadow_read(self, keys: np.ndarray) -> None:
        """Plain LRU demand fill of the same read (the budget's reference)."""
        sh = self.shadow
        r = sh.is_resident(keys)
        sh.on_access(keys)
        miss = keys[~r]
        self.lru_reads += miss.size
        if miss.size == 0 or self.capacity == 0:
            return
        blocked = self._shadow_blocked
        blocked[keys] = True
        fill = plan_fill(sh, miss, self.capacity - sh.n_resident, blocked, ADMIT_ALL)
        blocked[keys] = False
        if fill.victims.size:
            sh.on_evict(fill.victims)
        if fill.keys.size:
            sh.on_admit(fill.keys)
