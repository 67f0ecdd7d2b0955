"""Targeted regressions of what the stress tests found (tests/store/test_store_stress.py).

The hang: a fire that needs a key another batch is loading waited for that batch's
``done`` event. A pipelined fire's batch is only done once its owner publishes it
(``wait_layer`` / ``release``), so a second fire on the same thread, two pipelined fires
crossing on two threads, or a fire racing a close() whose ``release`` was refused,
waited forever (and close() with it, waiting for the active fire). Now the waiting
fire publishes the landed layers itself (LayerLoad.settle)."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from store_helpers import assert_store_consistent
from stress_helpers import Crew, check_published_bytes, leaked_pack_fds

import tierstore as ts
from tierstore.store.mover import Mover
from tierstore.testing.packs import make_random_pack, random_layer_rows

L, E, SLOT, SEED = 4, 16, 4000, 3


@pytest.fixture
def pack(tmp_path):
    return make_random_pack(tmp_path, L, E, SLOT, seed=SEED)


def _rows():
    return np.stack([random_layer_rows(SEED, l, E, SLOT) for l in range(L)]).reshape(L * E, SLOT)


def _in_thread(fn, seconds=20.0):
    crew = Crew()
    out = {}
    crew.spawn(lambda: out.setdefault("value", fn()), name="caller")
    crew.join(seconds)  # a hang fails with every thread's stack
    return out.get("value")


def test_fire_needing_a_pipelined_fires_keys_on_the_same_thread_does_not_hang(pack, device):
    with ts.ExpertStore(pack, vram_slots=8, device=device, lazy_per_step=0) as store:
        first = store.fire([(1, 3), (2, 5)], pipelined=True)  # LOADING until published
        second = _in_thread(lambda: store.fire([(1, 3), (2, 2)]))
        assert int(store.slot_table[1, 3]) >= 0 and int(store.slot_table[2, 2]) >= 0
        first.wait_layer(1)  # already published: no-op
        store.release(second)
        store.release(first)
        assert store.stats().pool.pinned == 0
        assert check_published_bytes(store, _rows()) >= 3
        assert_store_consistent(store)


def test_two_pipelined_fires_crossing_keys_on_two_threads_do_not_deadlock(pack, device):
    with ts.ExpertStore(pack, vram_slots=12, device=device, lazy_per_step=0) as store:
        for round_ in range(20):
            a = [(0, round_ % E), (1, (round_ + 1) % E)]
            b = [(1, (round_ + 1) % E), (2, (round_ + 2) % E), (0, round_ % E)]
            results, crew = {}, Crew()
            crew.spawn(lambda: results.setdefault("a", store.fire(a, pipelined=True)), name="a")
            crew.spawn(lambda: results.setdefault("b", store.fire(b, pipelined=True)), name="b")
            crew.join(20)
            for fr in results.values():
                fr.wait_all()
                store.release(fr)
        assert store.stats().pool.pinned == 0
        check_published_bytes(store, _rows())
        assert_store_consistent(store)


def test_close_while_a_fire_waits_on_a_refused_pipelined_release_finishes(pack, monkeypatch):
    store = ts.ExpertStore(pack, vram_slots=8, device="cpu", lazy_per_step=0)
    first = store.fire([(3, 1), (3, 2)], pipelined=True)
    entered = threading.Event()

    def waiting_fire():
        real = Mover.plan

        def plan_then_signal(mover, *a, **k):  # the fire is active: close() must wait for it
            entered.set()
            return real(mover, *a, **k)

        monkeypatch.setattr(Mover, "plan", plan_then_signal)
        try:
            store.release(store.fire([(3, 1), (0, 0)]))
        except ts.ClosedError:
            pass  # release() after close(): refused, not hung

    crew = Crew()
    crew.spawn(waiting_fire)
    assert entered.wait(20)
    crew.spawn(store.close, name="closer")
    crew.join(20)  # neither the fire nor close() hangs
    with pytest.raises(ts.ClosedError):
        store.release(first)
    assert store.closed


def test_a_failed_pipelined_layer_settled_by_another_fire_is_reported_to_its_owner(pack):
    with ts.ExpertStore(pack, vram_slots=8, device="cpu", lazy_per_step=0) as store:
        store.engine._inject_faults(every_nth=1)
        first = store.fire([(2, 4)], pipelined=True)
        comp = first.pending.comps[2]
        deadline = time.monotonic() + 20
        while not comp.done() and time.monotonic() < deadline:  # the read failed first
            time.sleep(0.001)
        store.engine._inject_faults(every_nth=0)
        second = _in_thread(lambda: store.fire([(2, 4)]))  # retries it in its next round
        with pytest.raises(ts.TierIOError, match="layer 2 expert 4"):
            first.wait_layer(2)
        store.release(first)
        store.release(second)
        assert store.stats().pool.pinned == 0
        assert_store_consistent(store)


def test_store_opened_by_path_closes_its_pack_fd(pack):
    path = pack.path
    pack.close()
    store = ts.ExpertStore(path, vram_slots=4, device="cpu")
    store.release(store.fire([(0, 1)]))
    store.close()
    assert not leaked_pack_fds(path), leaked_pack_fds(path)
    assert os.path.exists(path)


def test_close_publishes_a_pipelined_fires_pending_layers_before_dropping_the_pack(pack):
    """Found by the stress suite: close() waited for active fires only, but a pipelined
    fire is active only until its reads are queued. Its owner's wait_layer after close()
    then checked the pack through a closed fd ("pack file is gone", a FormatError) or
    raced the engine's cancel. Now close() settles every pending pipelined batch first."""
    store = ts.ExpertStore(pack, vram_slots=8, device="cpu", lazy_per_step=0)
    fr = store.fire([(0, 1), (1, 2), (3, 3)], pipelined=True)
    assert fr.pending is not None and not fr.pending.done
    store.close()
    assert fr.pending.done and store.batches_in_flight == 0
    for layer in range(L):
        fr.wait_layer(layer)  # published by close(): a no-op
    assert check_published_bytes(store, _rows()) == 3
    with pytest.raises(ts.ClosedError):
        store.release(fr)


def test_close_racing_the_owners_wait_layer_never_fails_a_published_layer(pack):
    for round_ in range(30):
        store = ts.ExpertStore(pack, vram_slots=8, device="cpu", lazy_per_step=0)
        fr = store.fire([(l, (round_ + l) % E) for l in range(L)], pipelined=True)
        crew = Crew()
        crew.spawn(store.close, name="closer")
        for layer in range(L):
            fr.wait_layer(layer)  # never "pack file is gone"
        crew.join(20)
        assert check_published_bytes(store, _rows()) == L
