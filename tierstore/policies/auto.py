"""Auto: a self-tuning policy that learns, online, which fixed policy fits the
routing it sees, with no per-trace knob.

Algorithm (expert selection over shadow caches, in the spirit of ARC's ghost
lists and LeCaR's regret, but choosing among whole policies):
- Experts (``EXPERTS``, nine): ``blend`` (policies/blend.py: phase's expected
  next-use order over the mean of a short and a 32x longer decayed use rate) at
  half-lives 16 (the prior), 4, 64, 2 and 256 steps; ``phase`` at 16, ``hybrid``
  at 512, ``heat`` at 128 and LRU: bursts to long-term popularity, forced
  admission to admit-or-skip.
- Each expert runs a shadow cache of the same capacity (keys only, no bytes):
  every ``on_access`` call is one read of the slot table, its misses filled
  through the one fill routine (``tierstore.policies.fill``) with the call's
  keys protected, exactly as the simulator's demand fill (so a shadow is that
  expert replayed alone).
- Each expert's score is its shadow's hits, each distinct key of a call once (a
  hit saves one read however many tokens it serves: the bandwidth view's unit),
  decayed with a half-life of ``SCORE_HALF_LIFE`` steps (regret over a recent
  window, so the choice follows phase changes).
- The real tier follows the leader (highest score; ties to the earlier expert):
  victims are the leader's coldest among the real resident keys, promotion
  order is the leader's ranking, and ``admit`` is the leader's filter.
Cost: nine shadows make ``on_access`` ~10x a plain policy's; fine at the
store's one fold per step, and the simulator's replay shows it (M acc/s).

Measured (share of the LRU -> MIN gap closed, bandwidth view, 10 / 20 / 40 %
pools; bench/results/hits_eval_*.md has the tables): FLAME +0.131 / +0.208 /
+0.253 (the previous twelve experts: +0.13 / +0.20 / +0.25), the synthetic DS4
trace (seed 0, 256 ticks) +0.091 / +0.199 / +0.290 (was -0.01 / +0.02 / +0.22,
following LRU); the best fixed policy in hindsight there is blend(64) on FLAME
(+0.136 / +0.209 / +0.253) and blend(4) / blend(2) / blend(2) on synthetic
(+0.103 / +0.206 / +0.292): auto trails it by the early ticks it spends finding
it. Tried and not kept: a next-tick use probability learned online (logistic
regression over decayed rates at half-lives 1-256, phase's order over it):
FLAME +0.127 / +0.198 / +0.233 but synthetic -0.13 / -0.07 / -0.10; counting a
key once per tick in the heat (a prefill's tokens as one use): synthetic worse at
20 / 40 % (a prompt's token counts carry topic popularity).

Departures: no per-layer quota expert: with the best static per-layer split
chosen in hindsight (each layer's hybrid(64) hits at every quota, split by
greedy marginal gain) FLAME gains +0.126 / +0.215 / +0.246 of the LRU -> MIN gap
at 10 / 20 / 40 % pools against global phase(64)'s +0.136 / +0.208 / +0.250, and
the synthetic generator's layers are alike, so quotas buy nothing on the traces
we have. Scores reward hits only (every demand policy reads each miss once).
"""
from __future__ import annotations

import numpy as np

from tierstore.policies.admission import PolicyFilter
from tierstore.policies.blend import BlendPolicy
from tierstore.policies.dense import DensePolicy
from tierstore.policies.fill import plan_fill
from tierstore.policies.heat import HeatPolicy
from tierstore.policies.hybrid import HybridPolicy
from tierstore.policies.lru import LRUPolicy
from tierstore.policies.phase import PhasePolicy

_CLASSES = {"blend": BlendPolicy, "phase": PhasePolicy, "hybrid": HybridPolicy,
            "heat": HeatPolicy, "lru": LRUPolicy}
# (policy, half-life in steps), in index order; the first is the prior (ties, and
# no evidence yet, go to the lower index). Blend spans bursts (2, 4) to long-term
# popularity (256: a 8192-step memory); phase(16), hybrid(512), heat(128) and lru
# keep one expert of each other kind for traces unlike the two measured.
EXPERTS = (("blend", 16.0), ("blend", 4.0), ("blend", 64.0), ("blend", 2.0), ("blend", 256.0),
           ("phase", 16.0), ("hybrid", 512.0), ("heat", 128.0), ("lru", None))
SCORE_HALF_LIFE = 128.0  # steps over which an expert's past hits count half


def _experts(n_keys: int, capacity: int) -> list[DensePolicy]:
    return [_CLASSES[name](n_keys, capacity) if h is None
            else _CLASSES[name](n_keys, capacity, half_life=h) for name, h in EXPERTS]


class AutoPolicy(DensePolicy):
    name = "auto"
    # One on_access per read of the slot table: the shadows' fills depend on how
    # accesses are grouped (the simulator must not merge groups for this policy).
    groups_accesses = False

    def __init__(self, n_keys: int, capacity: int, **params):
        super().__init__(n_keys, capacity, **params)
        self.experts = _experts(self.n_keys, self.capacity)
        self._filters = [PolicyFilter(e) for e in self.experts]
        self.expert_scores = np.zeros(len(self.experts))
        self._score_decay = 2.0 ** (-1.0 / SCORE_HALF_LIFE)
        self._blocked = np.zeros(self.n_keys, dtype=bool)
        self.leader = 0  # the prior

    @property
    def leader_policy(self) -> DensePolicy:
        return self.experts[self.leader]

    def leader_name(self) -> str:
        e = self.leader_policy
        return e.name if isinstance(e, LRUPolicy) else f"{e.name}(half_life={e.half_life:g})"

    # -- events -------------------------------------------------------------------
    def on_access(self, keys, weights=None, now=None) -> None:
        arr = self._checked(keys, "on_access")
        if weights is None:  # repeats = one access per token: fold them into weights
            arr, counts = np.unique(arr, return_counts=True)
            w = None if counts.max(initial=1) == 1 else counts.astype(np.float64)
        else:
            w = np.asarray(weights, dtype=np.float64).reshape(-1)
            if arr.size > 1 and np.any(arr[1:] < arr[:-1]):
                # Key order breaks the shadows' ranking ties: make it the callers' common one.
                order = np.argsort(arr, kind="stable")
                arr, w = arr[order], w[order]
        if arr.size == 0:
            return
        blocked = self._blocked
        blocked[arr] = True
        for i, (e, adm) in enumerate(zip(self.experts, self._filters)):
            r = e.is_resident(arr)
            # A hit saves one read however many tokens it serves: the bandwidth view's unit.
            self.expert_scores[i] += float(np.count_nonzero(r))
            e.on_access(arr, w)
            miss = arr[~r]
            if miss.size == 0 or self.capacity == 0:
                continue
            free = self.capacity - e.n_resident
            if miss.size > free and adm.filters:
                miss = e.rank(miss)
            fill = plan_fill(e, miss, free, blocked, adm)
            if fill.victims.size:
                e.on_evict(fill.victims)
            if fill.keys.size:
                e.on_admit(fill.keys)
        blocked[arr] = False
        self.leader = int(np.argmax(self.expert_scores))

    def decay(self, now=None, steps: int = 1) -> None:
        for e in self.experts:
            e.decay(now=now, steps=steps)
        self.expert_scores *= self._score_decay ** steps

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
        """(expert cores, resident, n_resident, capacity, scores, leader, score_decay,
        score_tokens) for ``tierstore._C.replay_auto``: the cores and arrays are live,
        the native loop updates them in place; score_tokens: a shadow hit scores its
        token count (False: one per key). None when an expert has no native state."""
        cores = [getattr(e, "native_state", lambda: None)() for e in self.experts]
        if any(c is None for c in cores):
            return None
        return (cores, self._resident, self._n_resident, self.capacity, self.expert_scores,
                self.leader, self._score_decay, False)  # distinct hits, as on_access

    def load_native_state(self, scalars) -> None:
        """Take back what ``replay_auto`` returns: (n_resident, leader)."""
        for e in self.experts:
            e.load_native_state()
        self._n_resident, self.leader = int(scalars[0]), int(scalars[1])

    def reset(self) -> None:
        super().reset()
        for e in self.experts:
            e.reset()
        self.expert_scores[:] = 0.0
        self.leader = 0

    def check_invariants(self) -> None:
        super().check_invariants()
        for e in self.experts:
            e.check_invariants()
        assert np.all(np.isfinite(self.expert_scores)) and np.all(self.expert_scores >= 0), \
            "expert scores must be finite and >= 0"
        assert 0 <= self.leader < len(self.experts), "leader out of range"
