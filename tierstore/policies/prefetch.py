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
# Standard deviations of a proposal's cost kept in credit. A wide margin cuts short the
# proposals of many uncertain candidates, so the price (threshold) rises and the same reads
# go to likelier ones (FLAME, 51 slots, auto+prefetch at LRU's reads, the old auto experts:
# Z 2 / 5 / 8 / 20 close 0.33 / 0.34 / 0.354 / 0.37 of the latency gap, 0.3455 at Z 8 with
# auto's current experts; at 102 / 205 slots Z 8 gives 0.46 / 0.51
# against 0.43 / 0.50; synthetic seed 0 / 1 and the batched setting unchanged within 0.01).
# Holding resident keys by calibrated p, or not at all, moved FLAME 51 by < 0.002: not the lever.
Z = 8.0
# Credit charged per recently wasted prefetch (reads). The victim's own re-read is priced at
# proposal time (the harm term), so a full read here counted it twice: FLAME 51 / 102 / 205
# 0.3455 / 0.4629 / 0.5088 -> 0.3532 / 0.4628 / 0.5160 of the latency gap with the harm
# term and 0.5 (reads <= LRU's), batched 1.29 / 1.15 / 1.00 -> 1.30 / 1.18 / 1.00,
# synthetic seeds 0 / 1 within 0.003. No charge (0) spent past LRU's reads on FLAME 51;
# the harm term at a full read cost the batched setting 0.04 at 410 slots.
WASTED_READ = 0.5
N_BINS = 20                 # calibration bins over the raw probability
CAL_PRIOR = 2.0             # observations' weight of the raw estimate in a bin
CAL_FLOOR = 0.01            # raw probability below which a candidate is not scored


class Prefetcher:
    """Online prefetch proposals for one tier of ``capacity`` slots over
    ``n_layers`` x ``n_experts`` dense keys (see module doc). ``top_k``: experts
    a token routes per layer (tokens of a group = its routings / top_k; None:
    the fewest routings a group had so far). ``cross`` / ``temporal``: which
    predictors run (both by default). Not thread safe: the tier serialises calls."""

    def __init__(self, n_layers: int, n_experts: int, capacity: int, *, read_ratio: float = 1.0,
                 lead: int = 1, threshold: float = 0.2, half_life: float = 512.0,
                 max_per_read: int | None = None, top_k: int | None = None,
                 cross: bool = True, temporal: bool = True):
        L, E = int(n_layers), int(n_experts)
        if L <= 0 or E <= 0 or int(capacity) < 0:
            raise ConfigError(f"prefetch: need n_layers, n_experts > 0 and capacity >= 0, "
                              f"got {n_layers}, {n_experts}, {capacity}")
        if not 1 <= int(lead) <= max(L - 1, 1):
            raise ConfigError(f"prefetch: lead must be in [1, {max(L - 1, 1)}] layers, got {lead}")
        if not (read_ratio >= 0 and 0.0 < threshold <= 1.0):
            raise ConfigError(f"prefetch: read_ratio must be >= 0 and threshold in (0, 1], "
                              f"got {read_ratio}, {threshold}")
        if top_k is not None and int(top_k) <= 0:
            raise ConfigError(f"prefetch: top_k must be > 0, got {top_k}")
        self.n_layers, self.n_experts, self.n_keys = L, E, L * E
        self.capacity, self.lead = int(capacity), int(lead)
        self.read_ratio, self.threshold = float(read_ratio), float(threshold)
        self.hold_threshold = float(threshold)  # resident keys are held at the starting bar
        self.max_per_read = None if max_per_read is None else int(max_per_read)
        self.top_k = None if top_k is None else int(top_k)
        self.use_cross, self.use_temporal = bool(cross), bool(temporal)
        self.model = CoRouting(L, E, self.lead, half_life)
        self.shadow = LRUPolicy(self.n_keys, max(self.capacity, 1))
        self._shadow_blocked = np.zeros(self.n_keys, dtype=bool)
        self.held_mask = np.zeros(self.n_keys, dtype=bool)
        self._routed = np.zeros(self.n_keys, dtype=bool)  # scratch: the keys of the read
        self._held: list[np.ndarray] = [_EMPTY] * L     # target layer -> pinned keys
        self._fetched: list[np.ndarray] = [_EMPTY] * L  # target layer -> keys read for it
        self._fetched_p: list[np.ndarray] = [_EMPTY] * L  # their calibrated p
        self._scored: list[tuple | None] = [None] * L   # target layer -> (keys, bins) scored
        self._pending: list[tuple | None] = [None] * L  # target layer -> (p_cross, p_temp)
        self._this: list[np.ndarray | None] = [None] * L  # layer -> experts this tick
        self._prev: list[np.ndarray | None] = [None] * L  # layer -> experts last tick
        self._tok_this = np.zeros(L)  # layer -> tokens of its group this tick (0: none)
        self._tok_prev = np.zeros(L)
        self._decay = 2.0 ** (-1.0 / PRECISION_HALF_LIFE)
        self._useful_w = self._issued_w = 0.0   # decayed, for the precision estimate
        self._wasted_w = 0.0                    # decayed wasted prefetches (credit margin)
        # Calibration per kind of target (0: same tick, cross-layer available; 1: the
        # next tick's first layer, next-token only) and bin: each earns its own trust.
        self._cal_n = np.zeros((2, N_BINS))     # decayed candidates scored per bin
        self._cal_hit = np.zeros((2, N_BINS))   # of which routed by their target
        self._k_seen = 0                        # fewest routings of a group so far
        self.lru_reads = self.misses = self.issued = self.useful = self.held_resident = 0
        self.in_flight = 0
        self.in_flight_p = 0.0                  # expected savings of the reads in flight
        self.last_cost = 0.0                    # the last proposal's expected cost (tests)

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
        """Expected reads the budget allows now (see module doc)."""
        return (self.read_ratio * self.lru_reads - self.reads + self.in_flight_p
                - WASTED_READ * self._wasted_w)

    def calibrated(self, p: np.ndarray, kind: int = 0) -> np.ndarray:
        """The measured chance that a candidate of raw probability ``p`` is routed
        by its target layer (per kind of target and bin, shrunk toward ``p``)."""
        b = self._bins(p)
        return (self._cal_hit[kind, b] + CAL_PRIOR * p) / (self._cal_n[kind, b] + CAL_PRIOR)

    # -- events -----------------------------------------------------------------------
    def on_read(self, layer: int, experts: np.ndarray, hit: np.ndarray,
                routings: int | None = None) -> np.ndarray:
        """Layer ``layer`` read the slot table for ``experts`` (unique, ascending),
        ``hit`` = which were resident; ``routings``: the group's routed (token,
        expert) pairs (default: one per expert). Returns the keys to unpin."""
        layer = int(layer)
        experts = np.asarray(experts, dtype=np.int64)
        keys = layer * self.n_experts + experts
        release = self._held[layer]
        if release.size:
            self.held_mask[release] = False
            self._held[layer] = _EMPTY
        routed_mask = self._routed  # membership in this read by lookup, not np.isin
        routed_mask[keys] = True
        fetched = self._fetched[layer]
        if fetched.size:
            used = int(np.count_nonzero(routed_mask[fetched]))
            self.useful += used
            self._useful_w += used
            self._wasted_w += fetched.size - used
            self.in_flight -= fetched.size
            self.in_flight_p -= float(self._fetched_p[layer].sum())
            self._fetched[layer] = self._fetched_p[layer] = _EMPTY
        scored = self._scored[layer]
        if scored is not None:
            routed = routed_mask[scored[0]]
            kind = scored[2]
            self._cal_n[kind] += np.bincount(scored[1], minlength=N_BINS)
            self._cal_hit[kind] += np.bincount(scored[1], weights=routed, minlength=N_BINS)
            self._scored[layer] = None
        routed_mask[keys] = False
        self.misses += int(hit.size - np.count_nonzero(hit))
        r = int(experts.size if routings is None else routings)
        if experts.size and (self._k_seen == 0 or r < self._k_seen):
            self._k_seen = r
        self._tok_this[layer] = self._tokens(r) if experts.size else 0.0
        self._learn(layer, experts)
        self._shadow_read(keys)
        return release

    def propose(self, layer: int, resident: np.ndarray,
                victims=None) -> tuple[np.ndarray, np.ndarray]:
        """After ``layer``'s read (``resident``: bool [n_keys], resident or loading):
        (fetch, hold) dense keys, ``fetch`` to read now (likeliest first), ``hold``
        (``fetch`` included) to pin until their layer reads (see module doc).
        ``victims(n, blocked)``: the tier's answer to "which keys would n new rows
        evict, in order" (int64, -1 = a free slot; ``blocked``: bool [n_keys], keys
        that may not be victims); None: no victim is harmed (h = 0)."""
        layer = int(layer)
        m = layer + self.lead
        wraps = m >= self.n_layers
        m -= self.n_layers if wraps else 0
        E = self.n_experts
        self.last_cost = 0.0
        p = self.predict(layer, m, wraps)
        if p is None:
            return _EMPTY, _EMPTY
        keys = m * E + np.arange(E)
        free = ~self.held_mask[keys]  # not already held for this layer (it did not read)
        res = resident[keys]
        expect = max(int(math.ceil(float(p.sum()))), 1)
        cap = expect if self.max_per_read is None else min(expect, self.max_per_read)
        # Hold the resident ones among the expected routed count, likeliest first.
        order = np.argsort(-p, kind="stable")[:expect]
        keep = keys[order[free[order] & res[order] & (p[order] >= self.hold_threshold)]]
        # Fetch candidates: non-resident, scored for calibration, ranked by calibrated p.
        scored = np.flatnonzero(free & ~res & (p >= CAL_FLOOR))
        # Fetch only among the likeliest ``expect``: a token routes a fixed count, so a
        # key outside them competes with likelier ones (measured: FLAME at 205 slots,
        # 0.41 of the gap fetching any candidate, 0.51 only these).
        top = np.zeros(E, dtype=bool)
        top[order] = True
        cand = scored[top[scored]]
        fetch = _EMPTY
        if scored.size:
            self._scored[m] = (keys[scored], self._bins(p[scored]), int(wraps))
        if cand.size:
            pc = self.calibrated(p[cand], int(wraps))
            top = np.argsort(-pc, kind="stable")
            cand, pc = cand[top], pc[top]
            ok = pc >= self.threshold
            cand, pc = cand[ok][:cap], pc[ok][:cap]
            credit = self.credit()
            cost = (1.0 - pc) * (1.0 + self._harm(layer, m, p, keep, cand.size, victims))
            need = np.cumsum(cost) + Z * np.sqrt(np.cumsum(pc * (1.0 - pc)))
            # A candidate of cost 0 never adds expected reads, whatever the credit.
            n = (int(np.searchsorted(need > max(credit, 0.0), True)) if self.read_ratio > 0
                 else 0)
            self._tune(n < cand.size, credit - (float(need[n - 1]) if n else 0.0))
            fetch, fp = keys[cand[:n]], pc[:n]
            self.last_cost = float(cost[:n].sum())
        else:
            self._tune(False, self.credit())
        hold = np.concatenate((keep, fetch))
        if hold.size:
            self.held_mask[hold] = True
            self._held[m] = np.concatenate((self._held[m], hold)) if self._held[m].size else hold
        if fetch.size:
            self._fetched[m] = np.concatenate((self._fetched[m], fetch))
            self._fetched_p[m] = np.concatenate((self._fetched_p[m], fp))
            self.issued += fetch.size
            self._issued_w += fetch.size
            self.in_flight += fetch.size
            self.in_flight_p += float(fp.sum())
        self.held_resident += keep.size
        return fetch, hold

    def predict(self, layer: int, m: int, wraps: bool) -> np.ndarray | None:
        """float64 [n_experts]: P(routed by the target group) of layer ``m``'s experts,
        after ``layer`` read (``wraps``: ``m`` reads next tick); None: no prediction.
        The one place a proposal's probabilities come from (a bound overrides it)."""
        model, E = self.model, self.n_experts
        src_c = None if wraps or not self.use_cross else self._this[layer]
        p_cross = None if src_c is None else model.predict(layer, src_c, temporal=False)
        src_t = (self._this[m] if wraps else self._prev[m]) if self.use_temporal else None
        p_temp = None if src_t is None else model.predict(m, src_t, temporal=True)
        self._pending[m] = (p_cross, p_temp)
        if p_cross is None and p_temp is None and (wraps or not self.use_cross):
            return None
        q = model.mix(p_cross, p_temp) if model.seen(m) else None
        # The target group's tokens: this layer's (same tick), or at a wrap into the
        # next tick the fewer of the last two ticks' (a prefill is not followed by one).
        tokens = (min(self._tok_this[m], self._tok_prev[m]) if wraps
                  else self._tok_this[layer])
        return model.present(q, max(tokens, 1.0), self._per_token(), E)

    def end_tick(self) -> None:
        self.model.tick()
        self._prev, self._this = self._this, [None] * self.n_layers
        self._tok_prev, self._tok_this = self._tok_this, np.zeros(self.n_layers)
        d = self._decay
        self._useful_w *= d
        self._issued_w *= d
        self._wasted_w *= d
        self._cal_n *= d
        self._cal_hit *= d

    # -- internals --------------------------------------------------------------------
    def _harm(self, layer: int, m: int, p: np.ndarray, keep: np.ndarray, n: int,
              victims) -> np.ndarray | float:
        """float64 [n]: P(the victim of the i-th fetch is routed at its layer's next
        read) (module doc); 0 for a free slot or without ``victims``."""
        if victims is None or n == 0:
            return 0.0
        E = self.n_experts
        blocked = self.held_mask.copy()
        blocked[keep] = True  # held by this proposal
        if self._this[layer] is not None:
            blocked[layer * E + self._this[layer]] = True  # the group being read
        v = np.asarray(victims(n, blocked), dtype=np.int64)[:n]
        h = np.zeros(n)
        real = np.flatnonzero(v >= 0)
        if real.size == 0:
            return h
        lv, ev = np.divmod(v[real], E)
        model = self.model
        q = np.clip(model.marginal[lv, ev] / np.maximum(model.marginal_n[lv], 1e-300), 0.0, 1.0)
        # Tokens of the victim's next read: this tick's for a layer still to read, else
        # the fewer of the last two ticks' (as a wrap's target).
        tok = np.where(lv > layer, self._tok_this[layer],
                       np.minimum(self._tok_this[lv], self._tok_prev[lv]))
        hv = 1.0 - (1.0 - q) ** np.maximum(tok, 1.0)
        same = lv == m  # the target layer: its own prediction
        hv[same] = p[ev[same]]
        h[real] = hv
        return h

    def _tune(self, short: bool, spare: float) -> None:
        """The threshold is the price of a read: raised when the budget cut a
        proposal short, lowered while credit is left over after one, so the
        reads the budget allows go to the likeliest candidates over time."""
        if short:
            self.threshold = min(self.threshold * THRESHOLD_STEP, MAX_THRESHOLD)
        elif spare >= 1.0:
            self.threshold = max(self.threshold / THRESHOLD_STEP, MIN_THRESHOLD)

    def _per_token(self) -> float:
        return float(self.top_k if self.top_k is not None else max(self._k_seen, 1))

    def _tokens(self, routings: int) -> float:
        return max(routings / self._per_token(), 1.0)

    @staticmethod
    def _bins(p: np.ndarray) -> np.ndarray:
        return np.minimum((p * N_BINS).astype(np.int64), N_BINS - 1)

    def _learn(self, layer: int, experts: np.ndarray) -> None:
        model = self.model
        pend = self._pending[layer]
        if pend is not None:
            model.score(pend[0], pend[1], experts, max(int(round(self._per_token())), 1))
            self._pending[layer] = None
        tok = max(self._tok_this[layer], 1.0)
        src = layer - self.lead
        if src >= 0 and self._this[src] is not None:
            model.learn(src, self._this[src], experts, temporal=False,
                        weight=1.0 / max(tok, self._tok_this[src]))
        if self._prev[layer] is not None:
            model.learn(layer, self._prev[layer], experts, temporal=True,
                        weight=1.0 / max(tok, self._tok_prev[layer]))
        self._this[layer] = experts
        model.observe(layer, experts, 1.0 / tok)
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
