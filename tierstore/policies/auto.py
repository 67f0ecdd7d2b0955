"""Auto: a self-tuning policy that learns, online, which fixed policy fits the
routing it sees, with no per-trace knob.

Algorithm (expert selection over shadow caches, in the spirit of ARC's ghost
lists and LeCaR's regret, but choosing among whole policies):
- Experts: LRU, and decayed frequency (``heat``) and heat-with-admission
  (``hybrid``: may skip caching a miss colder than its victim) at half-lives of
  32, 128, 512 and 2048 steps, and ``phase`` (hybrid whose victims are the keys
  of latest expected next use, counting each key's layer position within the
  tick: policies/phase.py) at 128 (the prior), 32 and 512: twelve policies
  spanning recency to long-term popularity, forced admission to admit-or-skip.
- Each expert runs a shadow cache of the same capacity (keys only, no bytes):
  every ``on_access`` call is one read of the slot table, its misses filled
  through the one fill routine (``tierstore.policies.fill``) with the call's
  keys protected, exactly as the simulator's demand fill.
- Each expert's score is its shadow's token-weighted hits, decayed with a
  half-life of ``SCORE_HALF_LIFE`` steps (regret over a recent window, so the
  choice follows phase changes).
- The real tier follows the leader (highest score; ties to the earlier expert):
  victims are the leader's coldest among the real resident keys, promotion
  order is the leader's ranking, and ``admit`` is the leader's filter.
Cost: twelve shadows make ``on_access`` ~13x a plain policy's; fine at the
store's one fold per step, and the simulator's replay shows it (M acc/s).

Measured (bench/results/hits_eval_*.md): on FLAME auto follows phase(128) and
closes ~0.12-0.25 of the LRU->MIN gap; on decode-shaped synthetic traces with
token-to-token locality it follows LRU. A next-layer co-occurrence predictor
(protect keys the next layer is predicted to read) was tried and moved FLAME by
2 reads in 85k: not kept.

Departures: no per-layer quota expert (the victim API does not name the
candidate's layer); scores reward hits only (every demand policy reads each
miss once, so hits are also the bandwidth view's currency).
"""
from __future__ import annotations

import numpy as np

from tierstore.policies.admission import PolicyFilter
from tierstore.policies.dense import DensePolicy
from tierstore.policies.fill import plan_fill
from tierstore.policies.heat import HeatPolicy
from tierstore.policies.hybrid import HybridPolicy
from tierstore.policies.lru import LRUPolicy
from tierstore.policies.phase import PhasePolicy

HALF_LIVES = (32.0, 128.0, 512.0, 2048.0)
PHASE_HALF_LIVES = (128.0, 32.0, 512.0)  # first = the prior
SCORE_HALF_LIFE = 128.0  # steps over which an expert's past hits count half


def _experts(n_keys: int, capacity: int) -> list[DensePolicy]:
    # The first is the prior (ties, and no evidence yet, go to it): phase at 128
    # steps (hybrid's order plus the within-tick next-use offset, policies/phase.py).
    out: list[DensePolicy] = [PhasePolicy(n_keys, capacity, half_life=h) for h in PHASE_HALF_LIVES]
    out += [HeatPolicy(n_keys, capacity, half_life=h) for h in HALF_LIVES]
    out += [HybridPolicy(n_keys, capacity, half_life=h) for h in HALF_LIVES]
    out.append(LRUPolicy(n_keys, capacity))
    return out


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
            self.expert_scores[i] += float(np.count_nonzero(r)) if w is None else float(w[r].sum())
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
                self.leader, self._score_decay, True)

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
