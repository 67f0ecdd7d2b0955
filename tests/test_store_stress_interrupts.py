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

from store_helpers import assert_store_consistent

L, E, SLOT = 3, 16, 3000
ROOT = os.path.dirname(ts.__file__)
KEYS = [(0, 1), (1, 2), (2, 3), (1, 5)]


class _SigintAt:
    """Trace hook: raise SIGINT at the ``at``-th line executed inside tierstore."""

    def __init__(self, at):
        self.at, self.n = at, 0

    def __call__(self, frame, event, arg):
        if not frame.f_code.co_filename.startswith(ROOT):
            return None if event == "call" else self
        if event == "line":
            self.n += 1
            if self.n == self.at:
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
