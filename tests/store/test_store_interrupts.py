"""Ctrl-C inside the store, with no signal handler ever touched (store/interrupts.py).

A trace hook raises SIGINT (delivered by Python's own handler) at the Nth line the store
runs. The sections that write several tables (a batch's publish, its rollback, a
pipelined layer's publish) are interrupted at EVERY one of their lines; whole fires at
a stride of lines. Afterwards, once the next call into the store has run: no pin, no
counted call, no batch in flight, no half-written section, and every table agrees with
the bytes. A second Ctrl-C during the roll-forward is finished by the next call.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from store_helpers import assert_store_consistent

import tierstore as ts
from tierstore.errors import TierIOError
from tierstore.testing.packs import make_random_pack

L, E, SLOT = 3, 16, 3000
ROOT = os.path.dirname(ts.__file__)
KEYS = [(0, 1), (1, 2), (2, 3), (1, 5)]
ALL = [(layer, e) for layer in range(L) for e in range(E)]


class _SigintAt:
    """Trace hook: SIGINT at the ``at``-th counted line inside tierstore (every line, or
    only lines run while one of ``store``'s sections is open). Checks on every line that
    SIGINT's handler is Python's own: nothing on the path swaps it."""

    def __init__(self, at, store=None):
        self.at, self.n, self.store = at, 0, store

    def __call__(self, frame, event, arg):
        if not frame.f_code.co_filename.startswith(ROOT):
            return None if event == "call" else self
        if event == "line":
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
            if self.store is None or self.store.sections_open:
                self.n += 1
                if self.n == self.at:
                    signal.raise_signal(signal.SIGINT)
        return self


def _traced(hook, fn, *args):
    sys.settrace(hook)
    try:
        return fn(*args)
    finally:
        sys.settrace(None)


def _settled(store):
    """What the next call finds: the journal and the orphan net run, nothing held. A
    result the KeyboardInterrupt's traceback kept alive is freed first (a young
    generation collection; a full one, 90 ms with torch loaded, only when that was not
    enough)."""
    gc.collect(0)
    store.stats()
    try:
        store.check_invariants(idle=True)
    except AssertionError:
        gc.collect()
        store.stats()
        store.check_invariants(idle=True)
    assert_store_consistent(store)


def _fire_and_release(store, keys=KEYS, pipelined=False):
    fr = store.fire(keys, pipelined=pipelined)
    fr.wait_all()
    store.release(fr)


def _every_section_line(store, run, reset, expect=KeyboardInterrupt):
    """Run ``run(store)`` once counting the lines inside sections, then once per such
    line with SIGINT there; returns how many lines were interrupted."""
    try:  # once untraced: the arena then holds what later
        reset(store)  # runs find there, so every run takes one path
        run(store)
    except expect:
        pass
    _settled(store)
    counter = _SigintAt(0, store)
    reset(store)
    try:
        _traced(counter, run, store)
    except expect:
        pass
    assert counter.n > 5, "no section ran"
    hit = 0
    for at in range(1, counter.n + 1):
        reset(store)
        try:
            _traced(_SigintAt(at, store), run, store)
        except expect:
            hit += 1
        _settled(store)
    return hit, counter.n


@pytest.mark.parametrize("ram_rows", [0, 8])
def test_sigint_at_every_line_of_a_publish_section_leaves_the_store_whole(tmp_path, ram_rows):
    pack = make_random_pack(tmp_path, L, E, SLOT, seed=4)
    with ts.ExpertStore(
        pack, vram_slots=6, ram_gb=ram_rows * 4096 / 2**30, device="cpu", lazy_per_step=0
    ) as store:
        hit, n = _every_section_line(store, _fire_and_release, lambda s: s.evict(ALL))
        assert hit == n  # every line of every section was interrupted
        fr = store.fire(KEYS)  # and the store still serves what it published
        assert fr.promoted + fr.already_resident == len(KEYS)
        store.release(fr)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("how", [True, 2 * SLOT], ids=["layers", "grouped"])
def test_sigint_at_every_line_of_a_pipelined_publish_leaves_the_store_whole(tmp_path, how):
    pack = make_random_pack(tmp_path, L, E, SLOT, seed=5)
    with ts.ExpertStore(pack, vram_slots=6, ram_gb=8 * 4096 / 2**30, device="cpu", lazy_per_step=0) as store:
        hit, n = _every_section_line(
            store, lambda s: _fire_and_release(s, pipelined=how), lambda s: s.evict(ALL)
        )
        assert hit == n


def test_sigint_at_every_line_of_a_rollback_section_leaves_the_store_whole(tmp_path):
    """A fire whose read fails (a rotted row, verify on) rolls its batch back; a Ctrl-C
    anywhere in that rollback still gives every slot and pin back."""
    pack = make_random_pack(tmp_path, L, E, SLOT, seed=6)
    with open(pack.path, "r+b") as f:  # layer 1 expert 2 rots on disk
        f.seek((1 * E + 2) * pack.stride + 10)
        f.write(b"\x00" * 32)
    pack.close()
    pack = ts.Pack.open(pack.path)
    with ts.ExpertStore(
        pack, vram_slots=6, ram_gb=8 * 4096 / 2**30, device="cpu", lazy_per_step=0, verify="always"
    ) as store:
        with pytest.raises(TierIOError, match="layer 1 expert 2"):
            _fire_and_release(store)
        _settled(store)
        hit, n = _every_section_line(
            store, _fire_and_release, lambda s: s.evict(ALL), expect=(KeyboardInterrupt, TierIOError)
        )
        assert hit == n
        assert not store.resident_keys().size or (1, 2) not in map(tuple, store.resident_keys())


@pytest.mark.parametrize("pipelined", [False, True], ids=["fire", "pipelined"])
def test_sigint_anywhere_in_a_fire_or_step_leaves_no_pin_and_no_call_counted(tmp_path, pipelined):
    pack = make_random_pack(tmp_path, L, E, SLOT, seed=7)

    def forward(store):
        _fire_and_release(store, pipelined=pipelined)
        store.ensure_resident(2, np.array([4, 5, 6]))
        store.step()

    with ts.ExpertStore(pack, vram_slots=6, ram_gb=8 * 4096 / 2**30, device="cpu", lazy_per_step=2) as store:
        counter = _SigintAt(0)
        _traced(counter, forward, store)
        hit = 0
        for at in range(1, counter.n + 1, 7):
            store.evict(ALL)
            try:
                _traced(_SigintAt(at), forward, store)
            except KeyboardInterrupt:
                hit += 1
            store.wait_idle(10)
            store.step()  # a prefill's pins are held to the step's end by design
            store.wait_idle(10)
            _settled(store)
        assert hit > 20


_SECOND_SIGINT_CHILD = r'''
import gc, os, signal, sys, tempfile
import faulthandler
faulthandler.dump_traceback_later(60, exit=True)   # a deadlock says where, then exits
import tierstore as ts
from tierstore.testing.packs import make_random_pack
ROOT = os.path.dirname(ts.__file__)
pack = make_random_pack(tempfile.mkdtemp(), 3, 16, 3000, seed=8)
store = ts.ExpertStore(pack, vram_slots=6, ram_gb=8 * 4096 / 2**30, device="cpu", lazy_per_step=0)
ALL = [(l, e) for l in range(3) for e in range(16)]

class Twice:
    """SIGINT at the first-th section line, and again ``gap`` section lines later."""
    def __init__(self, first, gap):
        self.marks, self.n = {first, first + gap}, 0
    def __call__(self, frame, event, arg):
        if not frame.f_code.co_filename.startswith(ROOT):
            return None if event == "call" else self
        if event == "line" and store.sections_open:
            self.n += 1
            if self.n in self.marks:
                signal.raise_signal(signal.SIGINT)
        return self

def run(pipelined):
    fr = store.fire([(0, 1), (1, 2), (2, 3)], pipelined=pipelined)
    fr.wait_all()
    store.release(fr)

left = 0
for pipelined in (False, True):
    for first in range(1, 60, 2):
        for gap in (1, 2, 4, 8):
            store.evict(ALL)
            sys.settrace(Twice(first, gap))
            try:
                run(pipelined)
            except KeyboardInterrupt:
                pass
            finally:
                sys.settrace(None)
            left += bool(store.sections_open)   # the second one cut the roll-forward
            gc.collect(0)
            store.stats()                    # the next call finishes what was left
            try:
                store.check_invariants(idle=True)
            except AssertionError:
                gc.collect()                 # a result only a full collection frees
                store.stats()
                store.check_invariants(idle=True)
store.close()
print(f"left_open={left}")
'''


def test_a_second_sigint_during_the_roll_forward_is_finished_by_the_next_call():
    done = subprocess.run(
        [sys.executable, "-c", _SECOND_SIGINT_CHILD], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    counts = dict(kv.split("=") for kv in done.stdout.split())
    assert int(counts["left_open"]) > 10, done.stdout  # the case this test is for happened


def test_no_store_call_touches_signal_handlers(tmp_path, monkeypatch):
    pack = make_random_pack(tmp_path, L, E, SLOT, seed=9)

    def refuse(*a, **k):
        raise AssertionError("a library call changed a signal handler")

    monkeypatch.setattr(signal, "signal", refuse)
    with ts.ExpertStore(pack, vram_slots=6, ram_gb=8 * 4096 / 2**30, device="cpu", lazy_per_step=2) as store:
        _fire_and_release(store)
        _fire_and_release(store, KEYS[:2], pipelined=True)
        store.ensure_resident(1, np.array([7, 8]))
        store.record(0, np.array([[1, 2]]))
        store.step()
        store.promote([(2, 9)]).wait(10)
        store.stats()
