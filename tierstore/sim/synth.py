"""A seeded synthetic router shaped like DeepSeek-V4-Flash (43 MoE layers x 256
routed experts, top-6), for benchmarks and the demo; ``tierstore.sim.traces``
re-exports it.

Generative model (each knob below says why it exists):
- Popularity: each layer ranks its experts by a random permutation and gives
  rank r the logit ``-zipf_s * log(r + 1)``. Trained MoEs with a load-balancing
  loss are flat over a whole corpus but skewed within a sequence; zipf_s = 0.5
  alone is mild, and with the topics below a layer's top 10% of experts take
  ~39% of its routings over 1024 decode steps (FLAME's one sequence: 13%).
- Drift: the logits take an Ornstein-Uhlenbeck walk (stationary std
  ``drift_std``, mean reversion ``drift_rate`` per step), so the hot set
  changes slowly over thousands of steps as a conversation moves on, and a
  policy that never forgets (pure LFU) pays for it.
- Topics: each sequence carries a latent topic (``n_topics``, topic popularity
  Zipf 1.0); a topic adds ``topic_strength`` to ``topic_experts`` experts in
  every layer. This one latent is what correlates layers within a token (the
  cross-layer structure expert-offload predictors exploit) and, because it
  persists from token to token with probability ``topic_stay``, what gives
  decode its token-to-token locality: with topic_strength 3.5 on 12 experts
  and topic_stay 0.92, ~20% of a token's (layer, expert) pairs were routed at
  the previous token too (chance: 2.3%; FLAME's prefill-like trace: 10.6%
  against 9.4%). Decode has more locality than teacher-forced text, and we
  would rather under- than over-state it.
- Prefill: ``prefill(tokens)`` routes a whole prompt as one step whose tokens
  switch topic with probability ``1 - prefill_stay`` each, so a burst touches
  most experts once (the scan a pool must resist).
- Sampling: experts are drawn without replacement by Gumbel top-k over the
  logits (Plackett-Luce), returned in router rank order (best first).
"""

from __future__ import annotations

import numpy as np

from tierstore.errors import ConfigError
from tierstore.sim.traces import Trace, check_fits_memory, check_key_space

DS4_SHAPE = {"n_layers": 43, "n_experts": 256, "top_k": 6}

DEFAULTS = {
    "zipf_s": 0.5,
    "drift_std": 0.5,
    "drift_rate": 0.002,
    "n_topics": 32,
    "topic_experts": 12,
    "topic_strength": 3.5,
    "topic_stay": 0.92,
    "prefill_stay": 0.5,
}


class SyntheticRouter:
    """Routing on the fly. ``step(batch)`` -> int32 [n_layers, batch, top_k]
    for one decode step of ``batch`` sequences; ``prefill(tokens)`` -> int32
    [n_layers, tokens, top_k] for one prompt. Deterministic for a seed and a
    call sequence. Not thread-safe."""

    def __init__(
        self,
        n_layers: int = 43,
        n_experts: int = 256,
        top_k: int = 6,
        seed: int = 0,
        stream_seed: int | None = None,
        **params,
    ):
        unknown = set(params) - set(DEFAULTS)
        if unknown:
            raise ConfigError(
                f"SyntheticRouter: unknown parameter(s) {', '.join(sorted(unknown))}; "
                f"known: {', '.join(DEFAULTS)}"
            )
        if not (0 < top_k <= n_experts) or n_layers <= 0:
            raise ConfigError(
                f"SyntheticRouter: need n_layers > 0 and 0 < top_k <= n_experts, "
                f"got {n_layers}, {n_experts}, {top_k}"
            )
        self.n_layers, self.n_experts, self.top_k, self.seed = n_layers, n_experts, top_k, seed
        self.params = {**DEFAULTS, **params}
        p = self.params
        self._rng = np.random.default_rng(seed)
        rng = self._rng
        ranks = np.argsort(rng.random((n_layers, n_experts)), axis=1)
        self._base = -p["zipf_s"] * np.log1p(ranks)
        self._drift = rng.normal(0.0, p["drift_std"], (n_layers, n_experts))
        n_topics, m = int(p["n_topics"]), int(min(p["topic_experts"], n_experts))
        self._boost = np.zeros((n_topics, n_layers, n_experts))
        picks = np.argsort(rng.random((n_topics, n_layers, n_experts)), axis=2)[:, :, :m]
        np.put_along_axis(self._boost, picks, p["topic_strength"], axis=2)
        topic_w = 1.0 / np.arange(1, n_topics + 1)
        self._topic_p = topic_w / topic_w.sum()
        self._topics = np.empty(0, dtype=np.int64)  # one per decode stream
        if stream_seed is not None:
            # The same router (popularity, drift start, topics: all from ``seed``) sampled
            # with other randomness: routing a warm start has never seen.
            self._rng = np.random.default_rng((seed, stream_seed))

    def _draw_topics(self, n: int) -> np.ndarray:
        return self._rng.choice(self._topic_p.size, size=n, p=self._topic_p)

    def _advance_drift(self) -> None:
        p = self.params
        theta = p["drift_rate"]
        self._drift *= 1.0 - theta
        self._drift += self._rng.normal(0.0, p["drift_std"] * np.sqrt(2 * theta), self._drift.shape)

    def _route(self, topics: np.ndarray) -> np.ndarray:
        logits = (self._base + self._drift)[:, None, :] + self._boost[topics].transpose(1, 0, 2)
        logits += self._rng.gumbel(size=logits.shape)
        k = self.top_k
        top = np.argpartition(-logits, k - 1, axis=2)[:, :, :k]
        order = np.argsort(-np.take_along_axis(logits, top, axis=2), axis=2)
        return np.take_along_axis(top, order, axis=2).astype(np.int32)

    def step(self, batch: int = 1) -> np.ndarray:
        """One decode step for ``batch`` sequences (streams persist across calls)."""
        if batch <= 0:
            raise ConfigError(f"SyntheticRouter.step: batch must be > 0, got {batch}")
        if self._topics.size != batch:
            keep = self._topics[:batch]
            self._topics = np.concatenate((keep, self._draw_topics(batch - keep.size)))
        switch = self._rng.random(batch) > self.params["topic_stay"]
        if switch.any():
            self._topics[switch] = self._draw_topics(int(switch.sum()))
        self._advance_drift()
        return self._route(self._topics)

    def prefill(self, tokens: int) -> np.ndarray:
        """One prompt of ``tokens`` tokens routed as one step."""
        if tokens <= 0:
            raise ConfigError(f"SyntheticRouter.prefill: tokens must be > 0, got {tokens}")
        topics = np.empty(tokens, dtype=np.int64)
        topics[0] = self._draw_topics(1)[0]
        switch = self._rng.random(tokens) > self.params["prefill_stay"]
        fresh = self._draw_topics(tokens)
        for_each = np.where(switch, fresh, -1)
        for_each[0] = topics[0]
        # carry the last switch forward (vectorised "fill down" of topic ids)
        idx = np.where(for_each >= 0, np.arange(tokens), 0)
        np.maximum.accumulate(idx, out=idx)
        topics = for_each[idx]
        self._advance_drift()
        return self._route(topics)


def _is_prefill(t: int, prefill_tokens: int, prefill_every: int) -> bool:
    return prefill_tokens > 0 and (t == 0 or (prefill_every > 0 and t % prefill_every == 0))


def synthetic_rows(
    n_ticks: int,
    *,
    batch: int = 1,
    prefill_tokens: int = 512,
    prefill_every: int = 1024,
    n_layers: int = 43,
    top_k: int = 6,
) -> int:
    """The rows ``synthetic_trace`` with these arguments makes (counted, not generated)."""
    n_ticks = max(int(n_ticks), 0)
    n_prefill = 0
    if n_ticks and prefill_tokens > 0:  # tick 0, then every prefill_every-th (_is_prefill)
        n_prefill = 1 + ((n_ticks - 1) // prefill_every if prefill_every > 0 else 0)
    tokens = (n_ticks - n_prefill) * int(batch) + n_prefill * int(prefill_tokens)
    return tokens * int(n_layers) * int(top_k)


def synthetic_trace(
    n_ticks: int = 2048,
    *,
    batch: int = 1,
    prefill_tokens: int = 512,
    prefill_every: int = 1024,
    n_layers: int = 43,
    n_experts: int = 256,
    top_k: int = 6,
    seed: int = 0,
    **params,
) -> Trace:
    """A capture-format trace: a prompt of ``prefill_tokens`` (one tick) every
    ``prefill_every`` ticks (0 = only at tick 0; prefill_tokens = 0 = none), the
    other ticks decode steps of ``batch`` sequences. Raises CapacityError, before
    generating, when the trace cannot fit in memory or its key space is too large."""
    rows = synthetic_rows(
        n_ticks,
        batch=batch,
        prefill_tokens=prefill_tokens,
        prefill_every=prefill_every,
        n_layers=n_layers,
        top_k=top_k,
    )
    check_key_space(n_layers, n_experts, "synthetic trace")
    # Each row is held twice while the chunks are joined: int64 tick + int32 layer + expert.
    check_fits_memory(rows * 2 * 16, f"synthetic trace: {rows:,} rows")
    router = SyntheticRouter(n_layers, n_experts, top_k, seed, **params)
    chunks, prefill_ticks = [], []
    for t in range(n_ticks):
        is_prefill = _is_prefill(t, prefill_tokens, prefill_every)
        ids = router.prefill(prefill_tokens) if is_prefill else router.step(batch)
        if is_prefill:
            prefill_ticks.append(t)
        layers = np.broadcast_to(np.arange(n_layers, dtype=np.int32)[:, None, None], ids.shape)
        chunks.append((np.full(ids.size, t, np.int64), layers.reshape(-1), ids.reshape(-1)))
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32))
    ticks = np.concatenate([empty[0]] + [c[0] for c in chunks])  # n_ticks 0: no rows
    layers = np.concatenate([empty[1]] + [c[1] for c in chunks]).astype(np.int32)
    experts = np.concatenate([empty[2]] + [c[2] for c in chunks]).astype(np.int32)
    meta = {
        "name": f"synthetic_ds4_seed{seed}",
        "generator": "tierstore.sim.synth.synthetic_trace",
        "seed": seed,
        "n_ticks": n_ticks,
        "batch": batch,
        "prefill_tokens": prefill_tokens,
        "prefill_every": prefill_every,
        "prefill_ticks": prefill_ticks,
        "num_layers": n_layers,
        "num_experts": n_experts,
        "top_k": top_k,
        "params": router.params,
    }
    return Trace(ticks, layers, experts, np.arange(n_layers, dtype=np.int64), n_experts, meta["name"], meta)
