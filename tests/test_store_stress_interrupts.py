"""Ctrl-C at many points of a fire (SIGINT raised from a trace hook at the Nth line the
store runs, delivered by Python's own handler machinery): afterwards no pin is left,
the activity count is zero (close() cannot hang), and every table agrees with the
bytes. The fire and release run as interrupt-deferred sections; a result a Ctrl-C kept
from its caller is unpinned at the next fire / step / stats (store/interrupts.py)."""
from __future__ import annotations

import gc
import os
import signal
import sys

import pytest

import tierstore as ts
from tierstore.testing.packs import make_random_pack

from tierstore.store.interrupts import SettleFirst

from store_helpers import assert_store_consistent

L, E, SLOT = 3, 16, 3000
ROOT = os.path.dirname(ts.__file__)
KEYS = [(0, 1), (1, 2), (2, 3), (1, 5)]


class _SigintAt:
    """Trace hook: raise SIGINT at the ``at``-th line executed inside tierstore."""

    def __init__(self, at):
        self.at, self.n = at, 0
        self.in_section = False    # the SIGINT came while an interrupt-deferred section ran

    def __call__(self, frame, event, arg):
        if not frame.f_code.co_filename.startswith(ROOT):
            return None if event == "call" else self
        if event == "line":
            self.n += 1
            if self.n == self.at:
                handler = signal.getsignal(signal.SIGINT)   # SettleFirst: no section, a watched batch
                self.in_section = handler is not signal.default_int_handler and not isinstance(
                    handler, SettleFirst)
                signal.raise_signal(signal.SIGINT)
        return self


def _fire_and_release(store):
    store.release(store.fire(KEYS))


@pytest.mark.parametrize("ram_rows", [0, 8])
def test_sigint_anywhere_in_a_fire_leaves_no_pin_and_consistent_tables(tmp_path, ram_rows):
    pack = make_random_pack(tmp_path, L, E, SLOT, seed=4)
    store = ts.ExpertStore(pack, vram_slots=6, ram_gb=ram_rows * 4096 / 2**30, device="cpu",
                           lazy_per_step=0)
    counter = _SigintAt(0)
    sys.settrace(counter)
    try:
        _fire_and_release(store)
    finally:
        sys.settrace(None)
    interrupted = 0
    for at in range(1, counter.n + 1, 5):
        store.evict([(l, e) for l in range(L) for e in range(E)])   # the fire reads again
        sys.settrace(_SigintAt(at))
        try:
            _fire_and_release(store)
        except KeyboardInterrupt:
            interrupted += 1
        finally:
            sys.settrace(None)
        gc.collect()
        store.stats()                                  # unpins what a dropped result held
        assert not store._pool.key_pins.any(), f"pool pins leaked (SIGINT at line {at})"
        assert not store._arena.key_pins.any(), f"arena pins leaked (SIGINT at line {at})"
        assert store._active == 0, f"activity count leaked (SIGINT at line {at})"
        assert not store._mover.inflight, f"a batch left in flight (SIGINT at line {at})"
        assert_store_consistent(store)
    assert interrupted > 10
    store.close()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


class _Phase:
    """Which call of the forward the KeyboardInterrupt came out of (``hit``: the first),
    and the result a caller that catches it still holds (``kept``)."""
    name = hit = ""
    kept = None


def _call(phase, name, fn, *args):
    phase.name = name
    try:
        return fn(*args)
    except KeyboardInterrupt:
        phase.hit = phase.hit or name
        raise


def _pipelined_forward(store, how, phase, keep):
    """fire(pipelined) -> wait (every layer, or wait_all) -> release, as a forward does;
    with ``keep`` a KeyboardInterrupt out of the wait leaves the result in ``phase.kept``
    (the caller still holds it and releases it later)."""
    phase.hit, phase.kept = "", None
    fr = _call(phase, "fire", store.fire, KEYS, None, None, True if how != "grouped" else 2 * SLOT)
    try:
        if how == "layers":
            for layer in range(L):
                _call(phase, "wait", fr.wait_layer, layer)
        else:
            _call(phase, "wait", fr.wait_all)
    except KeyboardInterrupt:
        if keep:
            phase.kept = fr
        raise
    _call(phase, "release", store.release, fr)


@pytest.mark.parametrize("how,keep", [("layers", True), ("grouped", False)])
def test_sigint_anywhere_in_a_pipelined_fire_settles_or_rolls_back_its_batch(tmp_path, how, keep):
    """A Ctrl-C inside wait_layer / wait_all: once the KeyboardInterrupt is out, the batch
    is published whole or rolled back (never left in flight), no pin is left once the
    result is released or dropped, the worker goes idle, the tables agree with the bytes."""
    pack = make_random_pack(tmp_path, L, E, SLOT, seed=5)
    store = ts.ExpertStore(pack, vram_slots=6, ram_gb=8 * 4096 / 2**30, device="cpu",
                           lazy_per_step=0)
    phase = _Phase()
    counter = _SigintAt(0)
    sys.settrace(counter)
    try:
        _pipelined_forward(store, how, phase, keep)
    finally:
        sys.settrace(None)
    by_phase = dict(fire=0, wait=0, release=0, settled_in_wait=0)
    for at in range(1, counter.n + 1, 9):
        store.evict([(l, e) for l in range(L) for e in range(E)])   # the fire reads again
        hook = _SigintAt(at)
        sys.settrace(hook)
        try:
            _pipelined_forward(store, how, phase, keep)
        except KeyboardInterrupt:
            sys.settrace(None)
            by_phase[phase.hit] += 1
            if phase.hit == "wait" and hook.in_section:   # the batch ended inside the call
                assert not store._mover.inflight, f"batch in flight (SIGINT at line {at})"
                by_phase["settled_in_wait"] += 1
            if phase.kept is not None:
                store.release(phase.kept)      # the caller's release still works, once
                phase.kept = None
        finally:
            sys.settrace(None)
        gc.collect()
        store.step()                                   # settles / unpins a dropped result
        where = f"SIGINT at line {at} of {counter.n}, in {phase.hit or phase.name}"
        assert not store._mover.inflight, f"a batch left in flight ({where})"
        assert not store._pool.key_pins.any(), f"pool pins leaked ({where})"
        assert not store._arena.key_pins.any(), f"arena pins leaked ({where})"
        assert store._active == 0, f"activity count leaked ({where})"
        assert store.wait_idle(10), f"the worker never went idle ({where})"
        assert_store_consistent(store)
    assert by_phase["settled_in_wait"] > 5 and by_phase["fire"] > 5, by_phase
    store.close()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("how", ["layers", "grouped"])
def test_sigint_at_every_line_of_a_pipelined_forward_leaves_no_batch_in_flight(tmp_path, how):
    """Every line, the fire's tail and the first lines of wait_layer / wait_all included
    (before their sections start), with the result dropped: as the KeyboardInterrupt
    comes out the batch is already published or rolled back, with no fire, step or stats
    after it (the watched batch, store/interrupts.py). Before: 17-18 lines left it in
    flight until the next fire or step."""
    pack = make_random_pack(tmp_path, L, E, SLOT, seed=6)
    store = ts.ExpertStore(pack, vram_slots=6, ram_gb=8 * 4096 / 2**30, device="cpu",
                           lazy_per_step=0)
    phase, counter = _Phase(), _SigintAt(0)
    sys.settrace(counter)
    try:
        _pipelined_forward(store, how, phase, keep=False)
    finally:
        sys.settrace(None)
    left, hits = [], dict(fire=0, wait=0, release=0)
    for at in range(1, counter.n + 1):
        store.evict([(l, e) for l in range(L) for e in range(E)])   # the fire reads again
        sys.settrace(_SigintAt(at))
        try:
            _pipelined_forward(store, how, phase, keep=False)
        except KeyboardInterrupt:
            hits[phase.hit] += 1
        finally:
            sys.settrace(None)
        if store._mover.inflight:          # nothing has run since the KeyboardInterrupt
            left.append((at, phase.hit))
        gc.collect()
        store.step()                       # the dropped result's pins (OrphanPins)
        assert not store._pool.key_pins.any(), f"pool pins leaked (SIGINT at line {at})"
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, at
        assert_store_consistent(store)
    assert not left, f"a batch left in flight after SIGINT at (line, call) {left}"
    assert hits["fire"] > 50 and hits["wait"] > 50, hits
    store.close()
