"""Online co-routing counts: which experts a layer will route, predicted from the
routing already seen (the prefetcher's model, ``tierstore.policies.prefetch``).

Per (layer, distance ``d``), decayed counts (half-life ``half_life`` ticks, lazy
global gain as in heat.py, so a tick costs O(1) and not O(counts)):
- cross-layer: ``C[l, f, e]`` = how often expert f at layer l and expert e at
  layer l + d were routed in the same tick. Given layer l's experts F,
  P(e at l + d) = sum_f C[l, f, e] / sum_f N[l, f]: a pooled mixture over F
  (sums to the routed count per token over e), shrunk toward layer l + d's
  marginal frequency with the weight of ``prior_weight`` observations, so a pair
  seen twice does not look certain.
- next-token: ``T[l, g, e]`` = expert g at layer l one tick earlier and e at
  layer l now; the same pooled, shrunk estimate.
- the two mix with weights learned online, Bayesian model averaging with
  forgetting: each one's weight is exp of its decayed log-likelihood of what was
  then actually routed, so a predictor that is consistently worse gets no say
  (on FLAME the next-token one, near chance, diluted the cross-layer one:
  0.31 / 0.41 / 0.51 of the latency gap mixed by mean probability mass against
  0.33 / 0.45 / 0.50 cross-layer alone).
- a read group of T tokens (a prefill, a batch) is one observation of weight
  1/T: its pairs did not all share a token, so it says little about what one
  token routes next. ``present`` turns the per-token estimate into the chance
  that any of the next group's T tokens routes the expert, 1 - (1 - q)^T; a
  layer with no observations yet is uniform (q = k / E).
Everything is learned from the past only: ``learn`` is told what was routed,
``predict`` answers from the counts so far.
"""
from __future__ import annotations

import numpy as np

_RENORM_EXPONENT = 256.0


class CoRouting:
    """Cross-layer (distance ``distance``) and next-token co-routing counts over
    ``n_layers`` dense layers of ``n_experts`` experts (see module doc)."""

    def __init__(self, n_layers: int, n_experts: int, distance: int = 1,
                 half_life: float = 512.0, prior_weight: float = 4.0):
        self.n_layers, self.n_experts = int(n_layers), int(n_experts)
        self.distance = int(distance)
        shape = (max(self.n_layers - self.distance, 1), self.n_experts, self.n_experts)
        self.cross = np.zeros(shape)
        self.cross_n = np.zeros(shape[:2])
        self.temporal = np.zeros((self.n_layers, self.n_experts, self.n_experts))
        self.temporal_n = np.zeros((self.n_layers, self.n_experts))
        self.marginal = np.zeros((self.n_layers, self.n_experts))  # decayed routings
        self.marginal_n = np.zeros(self.n_layers)                  # decayed reads
        self.half_life = float(half_life)
        self.prior_weight = float(prior_weight)
        self._t = 0.0
        self._gain = 1.0
        self.loglik = np.zeros(2)  # decayed log-likelihood of the truth: cross, next-token

    def tick(self) -> None:
        self._t += 1.0
        exponent = self._t / self.half_life
        if exponent > _RENORM_EXPONENT:
            for arr in (self.cross, self.cross_n, self.temporal, self.temporal_n,
                        self.marginal, self.marginal_n):
                arr *= 2.0 ** -exponent
            self._t, exponent = 0.0, 0.0
        self._gain = 2.0 ** exponent

    def observe(self, layer: int, experts: np.ndarray, weight: float = 1.0) -> None:
        """``layer`` routed ``experts`` (their marginal: the predictions' prior);
        ``weight``: 1 / the group's tokens (module doc)."""
        self.marginal[layer][experts] += self._gain * weight
        self.marginal_n[layer] += self._gain * weight

    def learn(self, layer: int, src: np.ndarray, dst: np.ndarray, *, temporal: bool,
              weight: float = 1.0) -> None:
        """``src`` experts (layer ``layer``; or layer ``layer`` one tick earlier) were
        followed by ``dst`` (layer ``layer + distance``; or ``layer`` now); ``weight``:
        1 / the tokens of the larger group (module doc)."""
        if src.size == 0 or dst.size == 0:
            return
        counts, totals = ((self.temporal, self.temporal_n) if temporal
                          else (self.cross, self.cross_n))
        w = self._gain * weight
        counts[layer][np.ix_(src, dst)] += w
        totals[layer][src] += w

    def seen(self, layer: int) -> bool:
        """Whether ``layer`` has been observed (else ``present`` is uniform)."""
        return bool(self.marginal_n[layer] > 0)

    @staticmethod
    def present(q: np.ndarray | None, tokens: float, per_token: float, n_experts: int) -> np.ndarray:
        """P(routed by any of ``tokens`` tokens) from the per-token estimate ``q``
        (None: no observation, uniform ``per_token / n_experts``)."""
        if q is None:
            q = np.full(n_experts, min(per_token / max(n_experts, 1), 1.0))
        q = np.clip(q, 0.0, 1.0)
        return q if tokens <= 1.0 else 1.0 - (1.0 - q) ** tokens

    def predict(self, layer: int, src: np.ndarray, *, temporal: bool) -> np.ndarray:
        """float64 [n_experts]: P(each expert routed) at layer ``layer + distance``
        (cross) or at ``layer`` next tick (temporal), given ``src`` at ``layer``."""
        counts, totals = ((self.temporal, self.temporal_n) if temporal
                          else (self.cross, self.cross_n))
        dst = layer if temporal else layer + self.distance
        denom = totals[layer][src].sum() if src.size else 0.0
        if denom <= 0 or self.marginal_n[dst] <= 0:
            return np.zeros(self.n_experts)
        prior = self.marginal[dst] / self.marginal_n[dst]
        return (counts[layer][src].sum(axis=0) + self.prior_weight * prior) / \
            (denom + self.prior_weight)

    def mix(self, p_cross: np.ndarray | None, p_temp: np.ndarray | None) -> np.ndarray | None:
        if p_cross is None:
            return p_temp
        if p_temp is None:
            return p_cross
        d = np.clip(self.loglik - self.loglik.max(), -700.0, 0.0)
        w = np.exp(d)
        w /= w.sum()
        return w[0] * p_cross + w[1] * p_temp

    def score(self, p_cross, p_temp, actual: np.ndarray, per_token: int) -> None:
        """Credit each predictor with the log-likelihood it gave ``actual`` (per routed
        expert; both scored only when both predicted, so the weights compare them on
        the same reads)."""
        if p_cross is None or p_temp is None or actual.size == 0:
            return
        decay = 2.0 ** (-1.0 / self.half_life)
        for i, p in enumerate((p_cross, p_temp)):
            ll = np.log(np.clip(p[actual], 1e-6, 1.0)).sum() / max(per_token, 1)
            self.loglik[i] = self.loglik[i] * decay + ll
