"""Auto: a self-tuning policy that learns, online, which fixed policy fits the
routing it sees, with no per-trace knob.

Algorithm (expert selection over shadow caches, in the spirit of ARC's ghost
lists and LeCaR's regret, but choosing among whole policies):
- Experts (``EXPERTS``, nine): ``blend`` (policies/blend.py: phase's expected
  next-use order over the mean of a short and a 32x longer decayed use rate) at
  half-lives 16 (the prior), 4, 64, 2 and 256 steps; ``phase`` at 4 and 128,
  ``hybrid`` at 512 and LRU: bursts to long-term popularity, forced admission to
  admit-or-skip.
- Each expert runs a shadow cache of the same capacity (keys only, no bytes):
  every ``on_access`` call is one read of the slot table, its misses filled
  through the one fill routine (``tierstore.policies.fill``) with the call's
  keys protected, exactly as the simulator's demand fill (so a shadow is that
  expert replayed alone).
- Each expert's score is its shadow's hits, each distinct key of a call once (a
  hit saves one read however many tokens it serves: the bandwidth view's unit),
  kept over two windows: decayed with a half-life of ``SCORE_HALF_LIFE`` (16)
  steps, so the choice follows phase changes, and of ``LONG_SCORE_HALF_LIFE``
  (512), so a short run of luck does not move it; the leader is chosen by the
  sum of the two windows' per-step hit rates. With a prefetcher beside it
  (``prefetching=True``) one 128-step window (``PREFETCH_SCORE_HALF_LIFE``).
- The real tier follows the leader (highest score; ties to the earlier expert):
  victims are the leader's coldest among the real resident keys, promotion
  order is the leader's ranking, and ``admit`` is the leader's filter.
Implemented once, natively (csrc/store/include/tierstore/store/auto_core.hpp,
``tierstore._C.AutoCore``): this class is its face (key checks, the weights'
folding, the experts' faces and the decisions, which are the leader's core's),
and the simulator's native replay (``tierstore.sim.native_replay``) runs the
same core over a whole trace, so the live store and the simulator cannot
disagree. Every expert must have a native core on the step clock.
Cost: nine shadows make ``on_access`` ~10x a plain policy's; fine at the
store's one fold per step, and the simulator's replay shows it (M acc/s).

Measured with the two windows (2026-12-06, bench/results/auto_vs_hindsight.md):
auto - best fixed in hindsight -0.0030..+0.0022 over its 24 points, sum -0.0098 (the
one 128-step window: -0.0036..+0.0004, sum -0.0216); over the 39 points of
bench/auto_seeds.py sum -0.0201 / -0.0214 (tune / held-out seeds; one window -0.0428).
Measured with the one 128-step window, now auto+prefetch's (share of the LRU -> MIN gap closed, bandwidth view, 10 / 20 / 40 %
pools; bench/results/auto_vs_hindsight.md, bench/auto_vs_hindsight.py, against the
stored hindsight grid of bench/results/hits_eval_*.json): FLAME +0.130 / +0.206 /
+0.255, synthetic DS4 seed 0 +0.092 / +0.205 / +0.290, held-out settings 0.08-0.77.
auto - best fixed in hindsight (heat/hybrid/phase/blend at half-lives 2-2048, and
lru): -0.0036..+0.0004 over the 24 (trace, pool) points, sum -0.022 (the previous
list, phase(16) and heat(128) in place of phase(4) and phase(128): -0.0083..+0.0000,
sum -0.034; its worst points were held-out settings whose best fixed policy was
phase(4) / phase(128), seed 5 at 307 slots -0.0083 -> -0.0005, seed 2 at 4403
-0.0057 -> -0.0036). Still short of ">= best fixed": what is left is the early
ticks spent finding the leader and leader switches. Also tried, not kept: eleven
experts (both lists' phases and heat: sum -0.024, two more shadows); score
half-lives 64 / 256 (sum -0.019 / -0.024, mixed per point: 128 kept); a leader change
only past a 2 % / 5 % score margin (hits_bounds_flame.md: loses on seed 5).
Earlier, tried and not kept: a next-tick use probability learned online (logistic
regression over decayed rates at half-lives 1-256, phase's order over it):
FLAME +0.127 / +0.198 / +0.233 but synthetic -0.13 / -0.07 / -0.10; counting a
key once per tick in the heat (a prefill's tokens as one use): synthetic worse at
20 / 40 % (a prompt's token counts carry topic popularity). Bounded, not built
(bench/results/hits_bounds_flame.md, FLAME 51 slots): an eviction order that
knows the rest of this token's routes (same-tick cross-layer, an oracle) gains
+0.001 (a key is read once a tick, at its layer); blend(64) already equals the
best static set in hindsight (0.138 vs 0.137); co-occurrence-weighted rates and
OPTgen-learned per-key rates (prototypes) gain nothing; only future popularity
(true counts of the next 256 ticks: +0.22 of the gap) would reach 0.20 there.

Departures: no per-layer quota expert: with the best static per-layer split
chosen in hindsight (each layer's hybrid(64) hits at every quota, split by
greedy marginal gain) FLAME gains +0.126 / +0.215 / +0.246 of the LRU -> MIN gap
at 10 / 20 / 40 % pools against global phase(64)'s +0.136 / +0.208 / +0.250, and
the synthetic generator's layers are alike, so quotas buy nothing on the traces
we have. Scores reward hits only (every demand policy reads each miss once).
"""
from __future__ import annotations

import numpy as np

from tierstore.errors import ConfigError
from tierstore.policies.blend import BlendPolicy
from tierstore.policies.dense import DensePolicy, as_weights
from tierstore.policies.heat import HeatPolicy
from tierstore.policies.hybrid import HybridPolicy
from tierstore.policies.lru import LRUPolicy
from tierstore.policies.native import native_module
from tierstore.policies.phase import PhasePolicy

_CLASSES = {"blend": BlendPolicy, "phase": PhasePolicy, "hybrid": HybridPolicy,
            "heat": HeatPolicy, "lru": LRUPolicy}
# (policy, half-life in steps), in index order; the first is the prior (ties, and
# no evidence yet, go to the lower index). Blend spans bursts (2, 4) to long-term
# popularity (256: a 8192-step memory); phase at 4 and 128 (the best fixed settings of
# held-out synthetic settings that no blend matched), hybrid(512) and lru keep experts of
# the other kinds for traces unlike the ones measured.
# The list is data: the native core takes any list of native experts.
EXPERTS = (("blend", 16.0), ("blend", 4.0), ("blend", 64.0), ("blend", 2.0), ("blend", 256.0),
           ("phase", 4.0), ("phase", 128.0), ("hybrid", 512.0), ("lru", None))
# The leader's score windows (steps over which an expert's past hits count half): a short
# one, and a longer one whose per-step hit rate is added to the short one's when the leader
# is chosen (AutoCore's long_decay; None: off). Measured 2026-12-06
# (bench/results/auto_vs_hindsight_seeds.md, "Two-window grid"): 16 + 512 lifts auto - best
# fixed in hindsight from sum -0.0428 / min -0.0066 / 5 of 39 points >= 0 (the one 128-step
# window) to -0.0201 / -0.0053 / 12 on the tuned seeds and -0.0428 / -0.0070 / 3 to
# -0.0214 / -0.0064 / 12 on held-out seeds; FLAME's bandwidth cells move by < 0.001
# (-0.0015 / -0.0008 / +0.0004 -> -0.0013 / -0.0010 / -0.0003).
SCORE_HALF_LIFE = 16.0
LONG_SCORE_HALF_LIFE = 512.0
# With the prefetcher beside it (``prefetching=True``: ``<policy>+prefetch``, the store's
# ``prefetch=``) auto keeps the one slower window: the prefetcher's credit and holds were
# tuned against that leader, and the faster one drops FLAME's auto+prefetch latency gap
# closed at 51 slots from 0.3532 to 0.34 (below the 0.35 goal) for every two-window variant
# measured. A slower leader also changes the eviction order less under the prefetcher's pins.
PREFETCH_SCORE_HALF_LIFE = 128.0
PREFETCH_LONG_SCORE_HALF_LIFE = None
# With a long window: True follows whichever window's own leader hit more (a regret choice
# between the two windows, decayed over the long one; AutoCore's meta) instead of adding
# the two windows' rates. Off: measured 2026-12-05 (bench/results/auto_vs_hindsight_seeds.md,
# section META_LEADER) with SCORE_HALF_LIFE 8, LONG_SCORE_HALF_LIFE 128 and the 13 experts it is
# worse than adding the rates (seeds 0-1 sum +0.0074 vs +0.0151) and costs FLAME more
# (auto+prefetch latency gap 0.3011 at 51 slots, bandwidth -0.0044 vs shipped -0.0015).
META_LEADER = False


def _experts(n_keys: int, capacity: int) -> list[DensePolicy]:
    return [_CLASSES[name](n_keys, capacity) if h is None
            else _CLASSES[name](n_keys, capacity, half_life=h) for name, h in EXPERTS]


class AutoPolicy(DensePolicy):
    name = "auto"
    # One on_access per read of the slot table: the shadows' fills depend on how
    # accesses are grouped (the simulator must not merge groups for this policy).
    groups_accesses = False

    # policies.make(..., prefetching=True) tells it a prefetcher runs beside it
    takes_prefetching = True

    def __init__(self, n_keys: int, capacity: int, *, prefetching: bool = False, **params):
        super().__init__(n_keys, capacity, **params)
        if not isinstance(prefetching, (bool, np.bool_)):
            raise ConfigError(f"policy 'auto': prefetching must be true or false, "
                              f"got {prefetching!r}")
        self.prefetching = bool(prefetching)
        # Read here, not at import, so bench/auto_seeds_grid.py's variants take effect.
        self.score_half_life, self.long_score_half_life = (
            (PREFETCH_SCORE_HALF_LIFE, PREFETCH_LONG_SCORE_HALF_LIFE) if self.prefetching
            else (SCORE_HALF_LIFE, LONG_SCORE_HALF_LIFE))
        self._experts = _experts(self.n_keys, self.capacity)
        cores = [getattr(e, "native_state", lambda: None)() for e in self._experts]
        for e, c in zip(self._experts, cores):
            if c is None:
                raise ConfigError(f"policy 'auto': expert {e.name!r} has no native core on the "
                                  "step clock (auto's rules run natively)")
        # Scores: this array, updated in place by the core (never rebind it).
        self.expert_scores = np.zeros(len(self._experts))
        self._score_decay = 2.0 ** (-1.0 / self.score_half_life)
        self._core = native_module().AutoCore(cores, self.capacity, self.expert_scores,
                                              self._score_decay,
                                              0.0 if self.long_score_half_life is None
                                              else 2.0 ** (-1.0 / self.long_score_half_life),
                                              bool(META_LEADER))

    @property
    def experts(self) -> list[DensePolicy]:
        """The experts' faces, their resident counts taken from their cores."""
        for e in self._experts:
            e.load_native_state()
        return self._experts

    @property
    def leader(self) -> int:
        return self._core.leader

    @property
    def leader_policy(self) -> DensePolicy:
        e = self._experts[self._core.leader]
        e.load_native_state()
        return e

    def leader_name(self) -> str:
        e = self.leader_policy
        return e.name if isinstance(e, LRUPolicy) else f"{e.name}(half_life={e.half_life:g})"

    # -- events (the core's) --------------------------------------------------------
    def on_access(self, keys, weights=None, now=None) -> None:
        arr = self._checked(keys, "on_access")
        if weights is None:  # repeats = one access per token: fold them into weights
            if arr.size > 1 and not np.all(arr[1:] > arr[:-1]):  # (distinct and ascending:
                arr, counts = np.unique(arr, return_counts=True)  # the simulator's groups)
                w = None if counts.max(initial=1) == 1 else counts.astype(np.float64)
            else:
                w = None
        else:
            w = as_weights(weights, arr.size, "policy 'auto'.on_access")
            if arr.size > 1 and np.any(arr[1:] <= arr[:-1]):
                # Key order breaks the shadows' ranking ties: make it the callers' common one
                # (ascending); a key given twice is one access of the summed weight.
                order = np.argsort(arr, kind="stable")
                arr, w = arr[order], w[order]
                first = np.flatnonzero(np.r_[True, arr[1:] != arr[:-1]])
                if first.size < arr.size:
                    arr, w = arr[first], np.add.reduceat(w, first)
        if arr.size == 0:
            return
        self._core.access(np.ascontiguousarray(arr), w)

    def decay(self, now=None, steps: int = 1) -> None:
        self._core.decay(int(steps))

    # -- decisions (the leader's) ---------------------------------------------------
    def coldest_of(self, cand, n):
        return self.leader_policy.coldest_of(cand, n)

    def rank(self, keys) -> np.ndarray:
        return self.leader_policy.rank(self._checked(keys, "rank"))

    def admit(self, candidate, victim):
        return self.leader_policy.admit(candidate, victim)

    def scores(self) -> np.ndarray:
        return self.leader_policy.scores()

    # -- native replay (tierstore.sim.native_replay, csrc/store/src/auto_replay.cpp) ----
    def native_state(self):
        """(core, resident, n_resident) for ``tierstore._C.replay_auto``: the core and
        the mask are live, the native loop updates them in place."""
        return self._core, self._resident, self._n_resident

    def load_native_state(self, n_resident: int) -> None:
        """Take back the real resident count ``replay_auto`` returns."""
        self._n_resident = int(n_resident)

    def reset(self) -> None:
        super().reset()
        for e in self._experts:
            e.reset()
        self._core.reset()  # the shadows' orders over the reset arrays, scores 0, prior leads

    def check_invariants(self) -> None:
        super().check_invariants()
        for e in self.experts:
            e.check_invariants()
            assert e.n_resident <= self.capacity, "a shadow over capacity"
        assert np.all(np.isfinite(self.expert_scores)) and np.all(self.expert_scores >= 0), \
            "expert scores must be finite and >= 0"
        assert 0 <= self.leader < len(self._experts), "leader out of range"
