"""The live store replayed as a policy (as Caffeine's simulator replays real caches):
a routing trace driven through a CPU-pool ``ExpertStore`` the way a forward pass
drives it, counting what the simulator counts, so tests can assert that
``tierstore.sim`` predicts the store exactly.

Two drives:
- ``fire``: each (tick, layer) group records its routing and fires its experts
  (promoted on demand, no admission), released before the next group
  (``granularity="layer"``); or one fire per tick over every layer's experts
  (``"tick"``). ``step()`` ends each tick. The simulator's twin is
  ``replay_demand_fill(..., admission=ADMIT_ALL)``.
- ``lazy``: records only, ``step()`` per tick and its background promotions
  awaited (the store's lazy path). Twin: ``replay_lazy(..., candidates="seen")``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class StoreCounts:
    distinct_hits: int  # (tick, key) occurrences resident when read
    token_hits: int  # the same, weighted by tokens
    reads: int  # rows the store read into the pool
    evictions: int


def replay_store(store, trace, drive: str = "fire", granularity: str = "layer") -> StoreCounts:
    """Drive ``store`` (pool on the CPU, no arena) with ``trace`` (see module doc)."""
    E = trace.n_experts
    keys, starts = trace.keys, trace.tick_starts
    distinct = 0
    for i in range(starts.size - 1):
        k = keys[starts[i] : starts[i + 1]]
        layers = k // E
        bounds = np.flatnonzero(np.diff(layers)) + 1
        groups = np.split(k, bounds)
        if drive == "lazy":
            for g in groups:
                store.record(int(g[0] // E), (g % E).astype(np.int64))
        elif granularity == "layer":
            for g in groups:
                layer = int(g[0] // E)
                store.record(layer, (g % E).astype(np.int64))
                fr = store.fire(np.stack([np.full(g.size, layer), g % E], axis=1))
                distinct += fr.already_resident
                store.release(fr)
        else:
            for g in groups:
                store.record(int(g[0] // E), (g % E).astype(np.int64))
            u = np.unique(k)
            fr = store.fire(np.stack([u // E, u % E], axis=1))
            distinct += fr.already_resident
            store.release(fr)
        store.step()
        if drive == "lazy":
            store.promote(np.empty((0, 2), dtype=np.int64)).wait()  # the worker runs in order
    st = store.stats()
    if drive == "lazy":
        distinct = st.pool.distinct_hits
    return StoreCounts(int(distinct), int(st.pool.hits), int(st.pool.promotions), int(st.pool.evictions))
