"""Threaded hammer: a forward thread (record / fire / check bytes / release / step), the
store's background worker (lazy promotions), a user thread calling promote(), and a
stats reader, all at once on a pool much smaller than the key space."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from store_helpers import assert_store_consistent

import tierstore as ts
from tierstore.testing.packs import make_random_pack, random_layer_rows

L, E, SLOT, SEED = 4, 32, 3000, 17


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return make_random_pack(tmp_path_factory.mktemp("hammer"), L, E, SLOT, seed=SEED)


def test_forward_worker_and_user_threads_hammer_the_store(pack, device):
    rows = np.stack([random_layer_rows(SEED, l, E, SLOT) for l in range(L)]).reshape(L * E, SLOT)
    store = ts.ExpertStore(
        pack, vram_slots=24, ram_gb=16 * 4096 / 2**30, device=device, threads=2, lazy_per_step=4
    )
    errors: list[BaseException] = []
    stop = threading.Event()
    counts = {"fires": 0, "promotes": 0, "checked": 0}

    def guarded(fn):
        def run():
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(exc)
                stop.set()

        return run

    @guarded
    def forward():
        rng = np.random.default_rng(1)
        hot = rng.choice(L * E, size=20, replace=False)
        for step in range(150):
            if stop.is_set():
                return
            for layer in range(L):
                ids = np.where(
                    rng.random((2, 3)) < 0.8, hot[rng.integers(0, 20, (2, 3))] % E, rng.integers(0, E, (2, 3))
                )
                store.record(layer, ids)
            if step % 3 == 0:
                routed = [(int(k // E), int(k % E)) for k in rng.choice(L * E, 6, replace=False)]
                fr = store.fire(routed, max_promote=4)
                counts["fires"] += 1
                table = (
                    store.tier("pool").device_table()
                    if device != "cpu"
                    else store.slot_table.view(-1).numpy()
                )
                pool = store.pool.cpu().numpy() if device != "cpu" else store.pool.numpy()
                for k in fr.keys.tolist():  # pinned: must stay put while we read it
                    slot = int(table[k])
                    assert slot >= 0, f"pinned key {k} not published"
                    assert np.array_equal(pool[slot], rows[k]), f"pinned key {k}: wrong bytes"
                    counts["checked"] += 1
                store.release(fr)
            store.step()

    @guarded
    def user():
        rng = np.random.default_rng(2)
        while not stop.is_set():
            keys = [(int(k // E), int(k % E)) for k in rng.choice(L * E, 5, replace=False)]
            assert store.promote(keys).wait(10)
            counts["promotes"] += 1

    @guarded
    def reader():
        while not stop.is_set():
            st = store.stats()
            assert st.pool.resident <= 24
            store.resident_keys("arena")
            time.sleep(0.001)

    threads = [threading.Thread(target=f) for f in (forward, user, reader)]
    for t in threads:
        t.start()
    threads[0].join(60)
    stop.set()
    for t in threads[1:]:
        t.join(30)
    try:
        assert not errors, errors[0]
        assert store.wait_idle(10)
        assert counts["fires"] == 50 and counts["promotes"] > 0 and counts["checked"] > 0
        st = store.stats()
        assert st.step_count == 150 and st.pool.evictions > 0 and st.lazy_queued > 0
        assert store.stats().pool.pinned == 0 and store.stats().arena.pinned == 0
        assert_store_consistent(store)
    finally:
        store.close()
