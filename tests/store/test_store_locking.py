"""The forward path never waits on a read: slow I/O in the worker or in another
thread's fire leaves store.lock, record(), fire() of resident keys and stats() fast.
Also: periodic poolmon snapshots are written by the worker, not by step()."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import tierstore as ts
from tierstore import warm as warmstart
from tierstore.testing.packs import make_random_pack

L, E, SLOT = 2, 16, 3000
SLOW_US = 1_000_000  # every read syscall sleeps 1 s


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return make_random_pack(tmp_path_factory.mktemp("locking"), L, E, SLOT, seed=4)


def test_slow_reads_do_not_hold_the_lock_the_forward_path_takes(pack, device):
    with ts.ExpertStore(pack, vram_slots=8, ram_gb=0, device=device, threads=2) as store:
        resident = store.fire([(0, 0)])
        store.engine._inject_faults(delay_us=SLOW_US)
        ticket = store.promote([(1, 1), (1, 2)])  # worker: slow read
        other = threading.Thread(target=lambda: store.release(store.fire([(1, 5)])))
        other.start()  # another fire: slow read
        deadline = time.monotonic() + 5
        while store.tier("pool").slot_of([E + 1, E + 5]).min() < 0 and time.monotonic() < deadline:
            time.sleep(0.001)  # both batches are LOADING
        t0 = time.perf_counter()
        with store.lock:
            pass
        store.record(0, np.array([[0, 1]]))
        store.release(store.fire([(0, 0)]))  # resident: no read
        store.stats()
        fast = time.perf_counter() - t0
        assert not ticket.done(), "the slow read finished before we measured"
        assert fast < SLOW_US / 1e6 / 4, f"forward calls took {fast:.3f} s during a slow read"
        store.engine._inject_faults()
        assert ticket.wait(10)
        other.join(10)
        store.release(resident)


def test_snapshot_option_writes_poolmon_from_the_worker(pack, tmp_path):
    out = tmp_path / "poolmon.json"
    with ts.ExpertStore(pack, vram_slots=8, device="cpu", snapshot=str(out), snapshot_every_s=0.001) as store:
        store.release(store.fire([(0, 3), (1, 4)]))
        time.sleep(0.01)
        store.step()
        assert store.wait_idle(10)
        snap = warmstart.read_warm_file(out)
        assert sorted(map(tuple, snap.pool.keys.tolist())) == [(0, 3), (1, 4)]
