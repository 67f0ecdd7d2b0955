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

Why it is built this way (the figures behind each point are in bench/RESULTS.md, "Pool
hits" and "Decisions"):
- Shadows of whole policies rather than one tuned policy: the best fixed policy in
  hindsight differs between traces and pool sizes (blend at one half-life on FLAME, phase
  or another blend on synthetic settings), and auto lands within a few thousandths of
  whichever it is, without a knob.
- Two score windows whose rates are added: the short one follows a phase change, the long
  one keeps a short run of luck from moving the leader. A regret choice between the two
  windows, and a margin a challenger must pass, both did worse.
- One slower window beside a prefetcher: the prefetcher's credit and holds are tuned
  against that leader, and a faster one moves the eviction order under its pins.
- Scores count hits only: every demand policy reads each miss once, so a hit is exactly
  a read saved.
- No per-layer quota expert: the best static per-layer split in hindsight gains nothing
  over one global order on the traces measured (the synthetic generator's layers are
  alike). Not kept either: more experts (cost without gain), an online-learned next-tick
  use probability (better on FLAME, worse on synthetic), counting a key once per tick.
  An eviction oracle that knows the rest of the token's routes gains about a thousandth,
  so what is left to gain needs popularity predicted many ticks ahead.
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

_CLASSES = {
    "blend": BlendPolicy,
    "phase": PhasePolicy,
    "hybrid": HybridPolicy,
    "heat": HeatPolicy,
    "lru": LRUPolicy,
}
# (policy, half-life in steps), in index order; the first is the prior (ties, and
# no evidence yet, go to the lower index). Blend spans bursts (2, 4) to long-term
# popularity (256: a 8192-step memory); phase at 4 and 128 (the best fixed settings of
# held-out synthetic settings that no blend matched), hybrid(512) and lru keep experts of
# the other kinds for traces unlike the ones measured.
# The list is data: the native core takes any list of native experts.
EXPERTS = (
    ("blend", 16.0),
    ("blend", 4.0),
    ("blend", 64.0),
    ("blend", 2.0),
    ("blend", 256.0),
    ("phase", 4.0),
    ("phase", 128.0),
    ("hybrid", 512.0),
    ("lru", None),
)
# The leader's score windows (steps over which an expert's past hits count half): a short
# one, and a longer one whose per-step hit rate is added to the short one's when the leader
# is chosen (AutoCore's long_decay; None: off). 16 + 512 halved auto's shortfall against the
# best fixed policy in hindsight over the one 128-step window, on tuned and held-out
# synthetic seeds alike, with FLAME unchanged (bench/RESULTS.md, "Decisions").
SCORE_HALF_LIFE = 16.0
LONG_SCORE_HALF_LIFE = 512.0
# With the prefetcher beside it (``prefetching=True``: ``<policy>+prefetch``, the store's
# ``prefetch=``) auto keeps the one slower window: the prefetcher's credit and holds were
# tuned against that leader, and every two-window variant measured lowered FLAME's
# auto+prefetch latency figure below its goal. A slower leader also changes the eviction
# order less under the prefetcher's pins.
PREFETCH_SCORE_HALF_LIFE = 128.0
PREFETCH_LONG_SCORE_HALF_LIFE = None
# With a long window: True follows whichever window's own leader hit more (a regret choice
# between the two windows, decayed over the long one; AutoCore's meta) instead of adding
# the two windows' rates. Off: it did worse than adding the rates on the synthetic seeds and
# cost FLAME more (bench/RESULTS.md, "Decisions").
META_LEADER = False


def _experts(n_keys: int, capacity: int) -> list[DensePolicy]:
    return [
        _CLASSES[name](n_keys, capacity) if h is None else _CLASSES[name](n_keys, capacity, half_life=h)
        for name, h in EXPERTS
    ]


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
            raise ConfigError(f"policy 'auto': prefetching must be true or false, got {prefetching!r}")
        self.prefetching = bool(prefetching)
        # Read here, not at import, so a caller that sets the module constants (an
        # experiment with another variant) gets them without reloading the module.
        self.score_half_life, self.long_score_half_life = (
            (PREFETCH_SCORE_HALF_LIFE, PREFETCH_LONG_SCORE_HALF_LIFE)
            if self.prefetching
            else (SCORE_HALF_LIFE, LONG_SCORE_HALF_LIFE)
        )
        self._experts = _experts(self.n_keys, self.capacity)
        cores = [getattr(e, "native_state", lambda: None)() for e in self._experts]
        for e, c in zip(self._experts, cores):
            if c is None:
                raise ConfigError(
                    f"policy 'auto': expert {e.name!r} has no native core on the "
                    "step clock (auto's rules run natively)"
                )
        # Scores: this array, updated in place by the core (never rebind it).
        self.expert_scores = np.zeros(len(self._experts))
        self._score_decay = 2.0 ** (-1.0 / self.score_half_life)
        self._core = native_module().AutoCore(
            cores,
            self.capacity,
            self.expert_scores,
            self._score_decay,
            0.0 if self.long_score_half_life is None else 2.0 ** (-1.0 / self.long_score_half_life),
            bool(META_LEADER),
        )

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
        assert np.all(np.isfinite(self.expert_scores)) and np.all(self.expert_scores >= 0), (
            "expert scores must be finite and >= 0"
        )
        assert 0 <= self.leader < len(self._experts), "leader out of range"
