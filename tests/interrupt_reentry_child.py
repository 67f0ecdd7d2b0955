"""Child process of tests/test_store_interrupt_reentry.py (not a test module).

Two Ctrl-Cs in a row during a pipelined forward or its close(): the first SIGINT at the
``first``-th line tierstore runs, the second ``gap`` lines later, so the second can land
inside the first's own settle (SettleFirst, store/interrupts.py) or inside close()'s.
A deadlock there hangs this process: the parent's timeout is what catches it. Every
check failing exits non-zero with the reason on stderr.

    python tests/interrupt_reentry_child.py PACK_DIR {wait|close} GAP [GAP ...]
"""
from __future__ import annotations

import faulthandler
import gc
import os
import signal
import sys

import tierstore as ts
from tierstore.testing.packs import make_random_pack

sys.path.insert(0, os.path.dirname(__file__))
from store_helpers import assert_store_consistent  # noqa: E402

L, E, SLOT = 3, 16, 3000
ROOT = os.path.dirname(ts.__file__)
KEYS = [(0, 1), (1, 2), (2, 3), (1, 5)]


class SigintsAt:
    """Trace hook: raise SIGINT at each of the ``ats`` lines executed inside tierstore
    (handler frames included: a signal handler's Python code is traced too)."""

    def __init__(self, ats=()):
        self.ats, self.n = set(ats), 0
        self.inside = set()   # the handlers / calls on the stack when a SIGINT came


    def __call__(self, frame, event, arg):
        if not frame.f_code.co_filename.startswith(ROOT):
            return None if event == "call" else self
        if event == "line":
            self.n += 1
            if self.n in self.ats:
                self.inside.update(_on_stack(frame))
                signal.raise_signal(signal.SIGINT)
        return self


def _on_stack(frame):
    """Which of the calls this file is about run at ``frame``: SettleFirst's handler,
    close()."""
    found = set()
    while frame is not None:
        name = frame.f_code.co_qualname
        if name in ("SettleFirst.__call__", "Lifecycle.close"):
            found.add(name)
        frame = frame.f_back
    return found


def forward(store, how):
    """fire(pipelined) then, as a forward's caller does, every layer's wait and the
    release; or the caller gives up and closes the store with the batch in flight."""
    fr = store.fire(KEYS, None, None, True)
    if how == "close":
        store.close()
        return
    for layer in range(L):
        fr.wait_layer(layer)
    store.release(fr)


def run(hook, pack, how):
    store = ts.ExpertStore(pack, vram_slots=6, ram_gb=8 * 4096 / 2**30, device="cpu",
                           lazy_per_step=0)
    interrupted = False
    sys.settrace(hook)
    try:
        forward(store, how)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        sys.settrace(None)
    gc.collect()
    return store, interrupted


def main(argv) -> int:
    pack_dir, how, gaps = argv[0], argv[1], [int(g) for g in argv[2:]]
    pack = make_random_pack(pack_dir, L, E, SLOT, seed=7)
    counter = SigintsAt()
    store, _ = run(counter, pack, how)
    store.close()
    n_lines, runs, interrupted, reentered, in_close = counter.n, 0, 0, 0, 0
    for first in range(1, n_lines + 1, 3):
        for gap in gaps:
            # one run takes milliseconds: 60 s is a hang, whatever the machine's load;
            # the stacks go to stderr and the child exits non-zero
            faulthandler.dump_traceback_later(60, exit=True)
            hook = SigintsAt((first, first + gap))
            store, hit = run(hook, pack, how)
            where = f"SIGINTs at lines {first} and {first + gap} of {n_lines} ({how})"
            if not store.closed:
                store.step()                       # unpins what a dropped result held
                if store._mover.inflight:
                    sys.exit(f"a batch left in flight: {where}")
                if store._pool.key_pins.any():
                    sys.exit(f"pool pins leaked: {where}")
                assert_store_consistent(store)
            elif store._mover.inflight:
                sys.exit(f"close() left a batch in flight: {where}")
            if store._active:
                sys.exit(f"activity count leaked: {where}")
            store.close()
            if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
                sys.exit(f"SIGINT's handler left changed: {where}")
            runs += 1
            interrupted += hit
            reentered += "SettleFirst.__call__" in hook.inside
            in_close += "Lifecycle.close" in hook.inside
    faulthandler.cancel_dump_traceback_later()
    print(f"runs={runs} interrupted={interrupted} reentered={reentered} in_close={in_close} "
          f"lines={n_lines}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
