"""fire + release of an all-resident DS4 decode step on the main thread and on a worker thread.

    python3 bench/fire_release_threads.py [TREE ...]   # default: the installed tierstore

Each TREE is a directory holding a ``tierstore/`` package (a ``git archive`` of another
commit with the built ``_C`` linked in), so two commits are compared in one run. The
main-thread figure is what an engine's forward thread pays; before the journal
(store/interrupts.py) it paid six signal-handler swaps per fire + release there.
DS4 geometry (43 layers x 256 experts, top-6: 257 distinct keys), CPU pool, 64-byte
rows (bookkeeping only), median of 3000 calls, best of 3 rounds.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import threading
import time


def measure() -> str:
    import numpy as np

    import tierstore as ts
    from tierstore.testing.packs import make_random_pack

    L, E = 43, 256
    pack = make_random_pack(tempfile.mkdtemp(), L, E, 64, seed=1)
    store = ts.ExpertStore(pack, vram_slots=2000, device="cpu", lazy_per_step=0)
    rng = np.random.default_rng(0)
    keys = np.unique(np.stack([np.repeat(np.arange(L), 6), rng.integers(0, E, L * 6)], 1), axis=0)
    store.release(store.fire(keys, max_promote=len(keys)))

    def run(n=3000):
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            store.release(store.fire(keys))
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6

    main = min(run() for _ in range(3))
    worker: list[float] = []
    t = threading.Thread(target=lambda: worker.extend(run() for _ in range(3)))
    t.start()
    t.join()
    store.close()
    return (
        f"{ts.__file__.rsplit('/tierstore/', 1)[0]}: fire+release of {len(keys)} resident "
        f"keys, median us: main thread {main:.1f}, worker thread {min(worker):.1f}"
    )


def main() -> None:
    trees = sys.argv[1:]
    if not trees:
        print(measure())
        return
    for tree in trees:
        code = (
            f"import sys; sys.path.insert(0, {tree!r}); "
            "sys.meta_path = [f for f in sys.meta_path if 'Redirecting' not in "
            f"type(f).__name__]; sys.path.insert(0, {sys.path[0]!r}); import fire_release_threads as b; "
            "print(b.measure())"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        print(out.stdout.strip() or out.stderr.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
