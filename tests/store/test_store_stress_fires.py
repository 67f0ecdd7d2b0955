"""Fires-only storm: the red team's 40k concurrent fires, in CI. Many threads fire on one
CPU store at once: every thread mixes a hot key set all threads share (overlap: fires
wait on, and settle, each other's batches) with a key set of its own (disjoint: fires
that only race for slots); plain and pipelined fires (per-layer and grouped
submissions), each result held a while and released in random order, some by another
thread. One thread also runs record/step, so the worker's lazy promotions load keys the
fires need. Checked on every fire: each pinned key is published and holds its pack row.
Checked at every round end: every published pool slot and resident arena row holds its
pack row, no pin is left, nothing is in flight, the worker goes idle, the invariants
hold; at the end the store closes with no pack fd left and the fires counted here are
the fires the stores counted.

Bounded by fire count for CI (``FIRES``, small rows so it takes well under 2 minutes on
two cores); STRESS_SECONDS=N soaks for N seconds instead (at least ``FIRES`` fires)."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest
from stress_helpers import Crew, check_published_bytes, leaked_pack_fds, stress_seconds

import tierstore as ts
from tierstore.testing.packs import make_random_pack, random_layer_rows

L, E, SLOT, SEED = 4, 32, 256, 41
N_SLOTS, ARENA_ROWS = 64, 24
THREADS = 8
HOT = 16  # keys every thread fires (the overlapping set)
FIRES = 40_000  # fires the CI run must reach (asserted)
FIRES_PER_ROUND = 2_000  # fires between two round-end checks (all threads)
ROUNDS_PER_STORE = 5  # then the store is closed and a fresh one opened


@pytest.fixture(scope="module")
def storm_pack(tmp_path_factory):
    pack = make_random_pack(tmp_path_factory.mktemp("storm"), L, E, SLOT, seed=SEED)
    pack.close()
    rows = np.stack([random_layer_rows(SEED, l, E, SLOT) for l in range(L)]).reshape(L * E, SLOT)
    return pack.path, rows


def _key_sets(seed):
    """The hot set (shared) and THREADS disjoint private sets over the other keys."""
    perm = np.random.default_rng(seed).permutation(L * E)
    hot, rest = perm[:HOT], perm[HOT:]
    return hot, np.array_split(rest, THREADS)


class _Tally:
    """Per-thread counters (no lock: each thread writes its own slot)."""

    def __init__(self):
        self.fires = [0] * THREADS
        self.pipelined = [0] * THREADS
        self.checked_keys = [0] * THREADS
        self.cross_released = [0] * THREADS
        self.waited = [0] * THREADS  # fires that needed a key another batch was loading
        self.no_slot = [0] * THREADS  # fires that found every slot pinned for some key


def _check_pinned(store, fr, rows):
    """Every key the result pins is published and holds its pack row (pinned: stable)."""
    table = store.tier("pool").device_table()
    pool = store.pool.numpy()
    for k in fr.keys.tolist():
        slot = int(table[k])
        assert slot >= 0, f"pinned key {k} is not published"
        assert np.array_equal(pool[slot, :SLOT], rows[k]), f"key {k}: wrong bytes in slot {slot}"
    return len(fr.keys)


def _firer(store, rows, tid, seed, quota, hot, mine, tally, handoff, handoff_lock, crew):
    rng = np.random.default_rng([seed, tid])
    pool_keys = np.concatenate([hot, mine])
    held: list = []

    def release_one():
        i = int(rng.integers(len(held)))  # random order, not fire order
        store.release(held.pop(i))

    for _ in range(quota):
        if crew.stop.is_set():
            break
        n_hot, n_mine = int(rng.integers(0, 4)), int(rng.integers(0, 4))
        keys = np.concatenate(
            [rng.choice(hot, n_hot, replace=False), rng.choice(mine, n_mine, replace=False)]
        )
        if not len(keys):
            keys = rng.choice(pool_keys, 1)
        routed = [(int(k // E), int(k % E)) for k in keys]
        mode = rng.random()
        pipelined = False if mode < 0.6 else (True if mode < 0.85 else 2 * SLOT)
        fr = store.fire(routed, max_promote=int(rng.integers(1, 6)), pipelined=pipelined)
        tally.fires[tid] += 1
        tally.waited[tid] += fr.waited > 0
        tally.no_slot[tid] += fr.no_slot > 0
        if pipelined is not False:
            tally.pipelined[tid] += 1
            how = rng.random()
            if how < 0.4:
                for layer in rng.permutation(L).tolist():  # any order: each publishes its group
                    fr.wait_layer(layer)
                tally.checked_keys[tid] += _check_pinned(store, fr, rows)
            elif how < 0.7:
                fr.wait_all()
                tally.checked_keys[tid] += _check_pinned(store, fr, rows)
            # else: never waited; release() (maybe another thread's) publishes it
        else:
            tally.checked_keys[tid] += _check_pinned(store, fr, rows)
        if rng.random() < 0.1:
            with handoff_lock:
                handoff.append(fr)  # someone else releases it
        else:
            held.append(fr)
        if rng.random() < 0.1:
            with handoff_lock:
                other = handoff.pop(int(rng.integers(len(handoff)))) if handoff else None
            if other is not None:
                store.release(other)
                tally.cross_released[tid] += 1
        while len(held) > int(rng.integers(0, 3)):
            release_one()
        if tid == 0:
            for layer in range(L):
                store.record(layer, rng.choice(pool_keys, (2, 2)) % E)
            if rng.random() < 0.2:
                store.step()
    while held:
        release_one()


def _round_end_checks(store, rows, counts):
    assert store.wait_idle(30), "the worker never went idle"
    counts["checked_rows"] += check_published_bytes(store, rows)
    assert store.stats().pool.pinned == 0, "pool pins leaked"
    assert store.stats().arena.pinned == 0, "arena pins leaked"
    store.check_invariants(idle=True)  # nothing in flight, no lazy promotion left busy


def _storm(pack_path, rows, min_fires, seconds):
    counts = dict(
        fires=0,
        pipelined=0,
        waited=0,
        no_slot=0,
        checked_keys=0,
        checked_rows=0,
        cross_released=0,
        store_fires=0,
        rounds=0,
        stores=0,
    )
    t0 = time.monotonic()
    quota = -(-FIRES_PER_ROUND // THREADS)
    while counts["fires"] < min_fires or time.monotonic() - t0 < seconds:
        store = ts.ExpertStore(
            pack_path,
            vram_slots=N_SLOTS,
            ram_gb=ARENA_ROWS * 4096 / 2**30,
            device="cpu",
            threads=2,
            lazy_per_step=3,
        )
        counts["stores"] += 1
        for _ in range(ROUNDS_PER_STORE):
            seed = counts["rounds"]
            hot, mine = _key_sets(seed)
            tally, handoff, handoff_lock, crew = _Tally(), [], threading.Lock(), Crew()
            for tid in range(THREADS):
                crew.spawn(
                    _firer,
                    store,
                    rows,
                    tid,
                    seed,
                    quota,
                    hot,
                    mine[tid],
                    tally,
                    handoff,
                    handoff_lock,
                    crew,
                    name=f"firer{tid}",
                )
            crew.join(120)
            for fr in handoff:  # left over: released by the main thread
                store.release(fr)
            for name in ("fires", "pipelined", "waited", "no_slot", "checked_keys", "cross_released"):
                counts[name] += sum(getattr(tally, name))
            _round_end_checks(store, rows, counts)
            counts["rounds"] += 1
        counts["store_fires"] += store.stats().fires
        store.close()
        assert not store.worker_alive
        assert not leaked_pack_fds(pack_path), leaked_pack_fds(pack_path)
    elapsed = time.monotonic() - t0
    print(
        f"\nfires storm: {counts} in {elapsed:.1f} s ({counts['fires'] / elapsed:.0f} fires/s)",
        file=sys.stderr,
    )
    return counts


def test_forty_thousand_concurrent_fires_publish_only_pack_bytes_and_leak_nothing(storm_pack):
    pack_path, rows = storm_pack
    counts = _storm(pack_path, rows, FIRES, stress_seconds(0.0))
    assert counts["fires"] >= FIRES
    assert counts["store_fires"] == counts["fires"], "fires counted here != fires the stores counted"
    assert counts["pipelined"] > FIRES // 5
    assert counts["cross_released"] > 0 and counts["waited"] > 0  # shared releases, shared loads
    assert counts["checked_keys"] > FIRES and counts["checked_rows"] > 0
