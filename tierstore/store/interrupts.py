"""Critical sections that a Ctrl-C must not split, and the fires it must not orphan.

Publishing a batch writes several tables that must agree (the device slot table, its host
mirror, slot states, arena rows, pins). A KeyboardInterrupt landing between two of those
writes would leave them apart: slots published on the device but not in the mirror, arena
rows LOADING forever. ``no_interrupts()`` defers SIGINT (and SIGTERM) for such a section
when it runs on the main thread (the only thread Python delivers signals to) and re-raises
the deferred signal's exception once the tables agree. Other threads need nothing:
signals never interrupt them.

The store runs each whole call that pins or counts activity (fire, release,
ensure_resident, step, load_arena, read_rows, evict) as one such section: a Ctrl-C then
waits for the call to end (its reads are bounded; the native wait does not return to
Python any sooner anyway) and is raised on leaving it. A fire interrupted so drops its
own pins before the KeyboardInterrupt is raised (the caller never gets the result).

What no section can cover is the few bytecodes between a section's end and the caller's
assignment of the result. ``OrphanPins`` is the net for that: a fire on the main thread
registers its result, and a result that is garbage collected unreleased hands its keys
to the store, which unpins them at its next fire, step or stats call.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import weakref
from typing import Iterator

_DEFERRED = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def no_interrupts() -> Iterator[list]:
    """Defer SIGINT/SIGTERM for the body (main thread only). Yields the list of signals
    caught so far: non-empty means the exception will be raised when the body ends."""
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    caught: list[tuple[int, object]] = []
    previous = {}
    for sig in _DEFERRED:
        old = signal.getsignal(sig)
        if callable(old) or old == signal.default_int_handler:
            previous[sig] = old
            signal.signal(sig, lambda s, f: caught.append((s, f)))
    try:
        yield caught
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        for sig, frame in caught:      # now that the section is whole, deliver them
            handler = previous[sig]
            if callable(handler):
                handler(sig, frame)


class OrphanPins:
    """Keys of fire results that were dropped without ``release`` (see the module doc).
    ``adopt`` runs on the main thread only: other threads never get a KeyboardInterrupt."""

    def __init__(self):
        self._keys: list = []     # list.append / pop are atomic: the finalizer may run anywhere

    def adopt(self, result) -> None:
        if threading.current_thread() is threading.main_thread() and len(result.keys):
            result.guard = weakref.finalize(result, self._keys.append, result.keys)

    @staticmethod
    def disown(result) -> None:
        """The result is being released: its pins are the caller's business again."""
        if result.guard is not None:
            result.guard.detach()
            result.guard = None

    def drain(self, pool) -> int:
        """Unpin what dropped results held (caller holds the store lock); keys unpinned."""
        n = 0
        while self._keys:
            keys = self._keys.pop()
            pool.unpin(keys)
            n += len(keys)
        return n
