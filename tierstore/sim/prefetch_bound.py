"""Prefetch bounds (latency view): a Prefetcher told its probabilities
instead of predicting them, so a replay shows what better prediction could gain
under the same budget, calibration, ranking, pins and lead-time model. It sees
the future (``routes_table``: the true routes), so it is a bound, never a policy:
``bench/prefetch_bound.py`` reports it beside the learned prefetcher."""

from __future__ import annotations

import numpy as np

from tierstore.policies.prefetch import Prefetcher
from tierstore.sim.counting import Prepared


class ToldPrefetcher(Prefetcher):
    """A Prefetcher whose proposal for target layer ``m`` uses
    ``table[(tick, m)]`` (float [n_experts], P(routed)); a missing entry: no
    proposal. Everything else (budget, calibration, its model's bookkeeping) is
    the Prefetcher's."""

    def __init__(self, table: dict, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.table, self.tick = table, 0

    def predict(self, layer, m, wraps):
        super().predict(layer, m, wraps)  # the model learns as it would
        return self.table.get((self.tick + (1 if wraps else 0), int(m)))

    def end_tick(self) -> None:
        super().end_tick()
        self.tick += 1


def routes_table(prep: Prepared) -> dict:
    """{(tick, layer): 1.0 where the layer routes the expert at that tick, else 0}."""
    E = prep.trace.n_experts
    out = {}
    for g in range(prep.gstarts.size - 1):
        a, b = int(prep.gstarts[g]), int(prep.gstarts[g + 1])
        p = np.zeros(E)
        p[prep.dkeys[a:b] % E] = 1.0
        out[(int(prep.dtick[a]), int(prep.dlayer[a]))] = p
    return out
