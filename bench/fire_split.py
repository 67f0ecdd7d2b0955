"""Where a small fire's time goes between store.fire and the engine (perf_counter
splits of the fire path's phases, median us), on the bench-fire pack.

    python3 bench/fire_split.py PACK [cuda|cpu]

Wraps the phases (the mover's plan / run, the engine submit, the completion's wait
and stream_wait, the pool's publish, the fold) in timers, fires 1 and 8 arena rows
and 1 page-cache row 300 times each, prints one line per phase.
"""
from __future__ import annotations

import collections
import sys
import time

import numpy as np
import torch

import tierstore as ts
from tierstore.io import engine as E
from tierstore.store import expert_store as X, mover as M, pool as P

T = collections.defaultdict(list)


def wrap(cls, name):
    f = getattr(cls, name)

    def timed(*a, **kw):
        t0 = time.perf_counter()
        try:
            return f(*a, **kw)
        finally:
            T[name].append(time.perf_counter() - t0)
    setattr(cls, name, timed)


def main(path: str, device: str) -> None:
    for cls, name in [(M.Mover, "plan"), (M.Mover, "run"), (E.Engine, "submit"),
                      (E.Completion, "wait"), (E.Completion, "stream_wait"),
                      (P.SlotPool, "publish"), (P.SlotPool, "unpublish"),
                      (X.ExpertStore, "_dense"), (X.ExpertStore, "_fold_records"),
                      (M.Mover, "order_after_unpublish")]:
        wrap(cls, name)
    s = ts.ExpertStore(path, vram_slots=64, ram_gb=0.5, device=device, lazy_per_step=0,
                       threads=16, max_promote=64)
    E_ = s.pack.n_experts
    for what, n, arena in (("arena", 1, True), ("arena", 8, True), ("pagecache", 1, False)):
        keys = np.stack([np.arange(n) // E_ + 1, np.arange(n) % E_], axis=1)
        if arena:
            s.load_arena(keys)
        else:
            keys = keys + np.array([[2, 0]])
        lat = []
        for rep in range(350):
            res = s.resident_keys("pool")
            if len(res):
                s.evict(res)
            if rep == 50:
                T.clear()
                lat.clear()
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fr = s.fire(keys)
            t1 = time.perf_counter()
            if device == "cuda":
                torch.cuda.synchronize()
            lat.append((t1 - t0, time.perf_counter() - t0))
            s.release(fr)
        med = np.median(np.array(lat), axis=0) * 1e6
        print(f"{what} {n}: fire {med[0]:.0f} us, fire+sync {med[1]:.0f} us; phases (median us): "
              + ", ".join(f"{k} {np.median(v) * 1e6:.1f}x{len(v) // 300}" for k, v in T.items()))
    s.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "cuda")
