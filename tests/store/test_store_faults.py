"""Faults: reads failing mid-fire / mid-promotion, a pack truncated under the store,
close() with promotions in flight. After every fault the store must hold no leaked
slot, no pin, and only byte-exact published rows (store_helpers)."""

from __future__ import annotations

import errno
import os
import time

import numpy as np
import pytest
from store_helpers import assert_store_consistent

import tierstore as ts
from tierstore.errors import ClosedError, TierIOError
from tierstore.testing.packs import make_random_pack

L, E, SLOT = 3, 16, 5000
ARENA_GB = 6 * 8192 / 2**30


@pytest.fixture
def pack(tmp_path):
    return make_random_pack(tmp_path, L, E, SLOT, seed=9)


@pytest.fixture
def store(pack, device):
    s = ts.ExpertStore(pack, vram_slots=8, ram_gb=ARENA_GB, device=device, threads=2)
    yield s
    s.close()


def no_slot_in_flight(store):
    for name in ("pool", "arena"):
        assert not len(store.tier(name).in_flight()), name


def test_read_failing_mid_fire_names_file_offset_layer_expert_and_leaks_nothing(store, pack):
    # Some residents, left pinned on purpose: the result stays referenced, since a dropped
    # result's pins are released by its finalizer.
    _held = store.fire([(0, 0), (0, 1)])
    before = store.resident_keys("pool").tolist()
    bad = pack.row_offset(1, 7)
    store.engine._inject_faults(fail_offset=bad + 100, errno=errno.EIO)
    with pytest.raises(TierIOError) as err:
        store.fire([(1, 6), (1, 7), (1, 8), (2, 2)])
    msg = str(err.value)
    assert pack.path in msg and "layer 1 expert 7" in msg and f"{bad:#x}" in msg and "EIO" in msg
    assert err.value.errno == errno.EIO
    assert store.resident_keys("pool").tolist() == before  # nothing published
    assert store.stats().pool.pinned == 2  # only the first fire's pins
    assert store.tier("pool").n_free == 6 and store.tier("arena").n_free == 4  # rows of the first fire only
    no_slot_in_flight(store)
    assert_store_consistent(store)
    store.engine._inject_faults()
    fr = store.fire([(1, 6), (1, 7)])  # the same keys load fine now
    assert fr.promoted == 2
    assert_store_consistent(store)


def test_failed_fire_returns_arena_rows_and_pins(store, pack):
    store.load_arena([(2, 3)])
    store.engine._inject_faults(fail_offset=pack.row_offset(2, 4))
    with pytest.raises(TierIOError, match="layer 2 expert 4"):
        store.fire([(2, 3), (2, 4)])  # an arena hit + a failing read
    assert store.stats().arena.pinned == 0 and store.stats().pool.pinned == 0
    assert store.resident_keys("arena").tolist() == [[2, 3]]  # the good arena row stays
    no_slot_in_flight(store)
    assert_store_consistent(store)


def test_every_nth_read_failing_in_background_promotions(store, pack):
    store.engine._inject_faults(every_nth=3)
    rng = np.random.default_rng(1)
    failures = 0
    for _ in range(12):
        keys = [(int(k // E), int(k % E)) for k in rng.choice(L * E, size=4, replace=False)]
        try:
            store.promote(keys).wait(10)
        except TierIOError as exc:
            failures += 1
            assert "layer" in str(exc) and pack.path in str(exc)
        no_slot_in_flight(store)
        assert_store_consistent(store)
    assert failures > 0
    assert store.stats().failed_reads == failures


def test_pack_truncated_under_a_live_store_fails_cleanly(store, pack):
    store.fire([(0, 3)])
    os.truncate(pack.path, pack.row_offset(2, 8) + 100)  # cut inside row (2, 8)
    with pytest.raises(ts.TierstoreError, match=r"layer 2 expert (8|9)|offset|end of file"):
        store.fire([(2, 8), (2, 9)])
    no_slot_in_flight(store)
    assert_store_consistent(store)


def test_fire_retries_a_key_whose_background_load_failed(store, pack):
    key = (1, 11)
    store.engine._inject_faults(fail_offset=pack.row_offset(*key), delay_us=1_000_000)
    ticket = store.promote([key])
    deadline = time.monotonic() + 5
    while store.tier("pool").slot_of(key[0] * E + key[1]) < 0 and time.monotonic() < deadline:
        time.sleep(0.002)
    time.sleep(0.2)  # the worker's read syscall has started (and sleeps 1 s, then fails)
    store.engine._inject_faults()  # the in-flight read still fails
    fr = store.fire([key])
    with pytest.raises(TierIOError):
        ticket.wait(5)
    assert fr.rounds == 2 and fr.promoted == 1 and fr.waited == 0
    assert fr.keys.tolist() == [key[0] * E + key[1]]
    assert_store_consistent(store)


def test_fire_waits_for_a_key_the_worker_is_loading(store, pack):
    key = (2, 12)
    store.engine._inject_faults(delay_us=300_000)
    ticket = store.promote([key])
    deadline = time.monotonic() + 5
    while store.tier("pool").slot_of(key[0] * E + key[1]) < 0 and time.monotonic() < deadline:
        time.sleep(0.002)
    fr = store.fire([key])  # does not read it twice: waits for the worker
    assert (fr.waited, fr.promoted, fr.rounds) == (1, 0, 1) and ticket.done()
    assert store.stats().bytes_read == SLOT
    assert_store_consistent(store)


def test_close_with_promotions_in_flight_cancels_queued_and_leaks_nothing(pack, device):
    store = ts.ExpertStore(pack, vram_slots=8, ram_gb=ARENA_GB, device=device, threads=2)
    store.engine._inject_faults(delay_us=20_000)
    tickets = [store.promote([(l, e)]) for l in range(L) for e in range(4)]
    time.sleep(0.01)
    store.close()
    outcomes = {"ok": 0, "closed": 0}
    for t in tickets:
        assert t.done()
        try:
            t.wait(0)
            outcomes["ok"] += 1
        except ClosedError as exc:
            assert "closed before this promotion" in str(exc)
            outcomes["closed"] += 1
    assert outcomes["closed"] > 0 and sum(outcomes.values()) == len(tickets)
    no_slot_in_flight(store)
    assert_store_consistent(store)
    with pytest.raises(ClosedError):
        store.promote([(0, 0)])
