"""Critical sections that a Ctrl-C must not split, and the fires it must not orphan.

Publishing a batch writes several tables that must agree (the device slot table, its host
mirror, slot states, arena rows, pins). A KeyboardInterrupt landing between two of those
writes would leave them apart: slots published on the device but not in the mirror, arena
rows LOADING forever. ``no_interrupts()`` defers SIGINT (and SIGTERM) for such a section
when it runs on the main thread (the only thread Python delivers signals to) and re-raises
the deferred signal's exception once the tables agree. Other threads need nothing:
signals never interrupt them.

The store runs each whole call that pins or counts activity (fire, release,
ensure_resident, step, load_arena, evict) as one such section: a Ctrl-C then
waits for the call to end (its reads are bounded; the native wait does not return to
Python any sooner anyway) and is raised on leaving it. A fire interrupted so drops its
own pins before the KeyboardInterrupt is raised (the caller never gets the result).

A pipelined fire's ``wait_layer`` / ``wait_all`` are sections too: a Ctrl-C there
settles the whole batch (every layer published, or rolled back on a read error) before
the KeyboardInterrupt is raised, so no batch is left in flight; the result stays pinned
for the caller's ``release`` (or the net below).

What no section can cover is the few bytecodes between a section's end and the caller's
assignment of the result (or between a call's start and its section). For a pipelined
batch, ``watch_batch`` closes that window: the fire registers the batch inside its own
section, before the section ends, and from then until the batch is settled every
section leaves SIGINT/SIGTERM's handler wrapped in ``SettleFirst``, which settles the
main thread's unsettled batches before it runs the handler it stands in for. So a
Ctrl-C anywhere (in the fire's tail, between the fire and the caller's wait_layer, at the
start of wait_layer / wait_all / release) never leaves a batch in flight; the wrapper is
taken off by the first section that ends with nothing left to settle.
``OrphanPins`` is the net for the pins: a fire on the main thread registers its result,
and a result that is garbage collected unreleased hands its keys (and a batch still in
flight, which the wrapper had to leave: this thread held the lock) to the store, which
settles the batch and unpins the keys at its next fire, step or stats call.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import weakref
from typing import Iterator

_DEFERRED = (signal.SIGINT, signal.SIGTERM)
_WATCHED: "weakref.WeakSet" = weakref.WeakSet()   # main-thread pipelined batches (LayerLoads)


def watch_batch(load, stream) -> None:
    """A pipelined batch a main-thread fire started (call inside the fire's section):
    until it is settled, a Ctrl-C settles it (on ``stream``) before it is raised."""
    if threading.current_thread() is threading.main_thread():
        load.settle_stream, load.watched = stream, True
        _WATCHED.add(load)


def _unsettled() -> list:
    """The watched batches still in flight; the settled ones leave the watch list (a
    section's end scans it: a forward's fires would otherwise make it grow)."""
    loads = list(_WATCHED)
    for load in loads:
        if load.batch.done.is_set():
            _WATCHED.discard(load)
    return [load for load in loads if not load.batch.done.is_set()]


def unwatch(load) -> None:
    """``load`` is settled (its owner saw it published or rolled back): it leaves the
    watch list and, on the main thread with nothing left to settle, SettleFirst gives
    the handlers back. Without this, a batch settled by another thread (a racing fire,
    a close() on a thread) left SettleFirst installed until the next section ended."""
    _WATCHED.discard(load)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _DEFERRED:
        handler = signal.getsignal(sig)
        if isinstance(handler, SettleFirst) and not _unsettled():
            signal.signal(sig, handler.inner)


def _event_busy(event) -> bool:
    """``event``'s own lock is taken (by anyone): the signal may have come inside this
    thread's ``wait()`` / ``set()`` of it, and settling would take that plain Lock again."""
    cond = getattr(event, "_cond", None)
    lock = getattr(cond, "_lock", None)
    return bool(lock is not None and lock.locked())


def settle_watched() -> None:
    """Settle the main thread's unsettled pipelined batches (never raises: a failed layer
    is rolled back and reported to its owner). One whose lock this thread holds (the
    signal came inside a locked region), or whose Events are mid wait / set, is left to
    OrphanPins / the next wait: settling it from the handler would wait on a lock the
    interrupted frame holds."""
    for load in _unsettled():
        lock = load.mover.lock
        if getattr(lock, "_is_owned", lambda: False)():
            continue
        if _event_busy(load.batch.done) or _event_busy(load.submitted):
            continue
        load.settle(load.settle_stream)


class SettleFirst:
    """The SIGINT/SIGTERM handler while a watched batch may be unsettled: settles the
    watched batches, then runs ``inner`` (the handler it stands in for)."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, signum, frame):
        # A second Ctrl-C during this settle is deferred to its end: run as a handler
        # again, it would settle the batch this frame is settling, from inside it (and
        # its KeyboardInterrupt would leave the batch half settled).
        with no_interrupts():
            settle_watched()
        if callable(self.inner):
            self.inner(signum, frame)


class _Defer:
    """A section's handler: records the signal for delivery when the section ends."""

    def __init__(self, caught: list):
        self.caught = caught

    def __call__(self, signum, frame):
        self.caught.append((signum, frame))


def _restored(handler):
    """The handler a section puts back: ``handler`` itself, wrapped in SettleFirst while a
    watched batch is unsettled (unwrapped once none is)."""
    if isinstance(handler, _Defer):
        return handler      # an enclosing section's: it settles and wraps when it ends
    inner = handler.inner if isinstance(handler, SettleFirst) else handler
    return SettleFirst(inner) if _unsettled() else inner


@contextlib.contextmanager
def no_interrupts(on_interrupt=None) -> Iterator[list]:
    """Defer SIGINT/SIGTERM for the body (main thread only). Yields the list of signals
    caught so far: non-empty means the exception will be raised when the body ends.
    ``on_interrupt()``: run (still deferred) after the body when a signal was caught, to
    finish what the caller would otherwise leave half done (a pipelined batch)."""
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    caught: list[tuple[int, object]] = []
    previous = {}
    for sig in _DEFERRED:
        old = signal.getsignal(sig)
        if callable(old) or old == signal.default_int_handler:
            previous[sig] = old
            signal.signal(sig, _Defer(caught))
    ran = False
    try:
        yield caught
    finally:
        try:
            if caught and on_interrupt is not None:
                ran = True
                on_interrupt()
        finally:
            restored = {sig: _restored(old) for sig, old in previous.items()}
            for sig, handler in restored.items():
                signal.signal(sig, handler)
            if caught and on_interrupt is not None and not ran:
                on_interrupt()   # a signal caught after the check above, before the restore
            for sig, frame in caught:      # now that the section is whole, deliver them
                handler = restored[sig]
                if callable(handler):
                    handler(sig, frame)


class OrphanPins:
    """Keys (and pipelined batches) of fire results that were dropped without ``release``
    (see the module doc). ``adopt`` runs on the main thread only: other threads never get a
    KeyboardInterrupt."""

    def __init__(self):
        self._dropped: list = []   # list.append / pop are atomic: the finalizer may run anywhere

    def adopt(self, result) -> None:
        if threading.current_thread() is threading.main_thread() and (
                len(result.keys) or result.pending is not None):
            result.guard = weakref.finalize(result, self._dropped.append,
                                            (result.keys, result.pending, result.pending_stream))

    @staticmethod
    def disown(result) -> None:
        """The result is being released: its pins are the caller's business again."""
        if result.guard is not None:
            result.guard.detach()
            result.guard = None

    def drain(self, lock, pool, settle: bool = True) -> int:
        """Settle what dropped results left in flight, then unpin their keys; keys unpinned.
        Called WITHOUT ``lock`` held when ``settle``: settling waits for reads and for other
        threads that publish or roll back the same batch under that lock. Without
        ``settle`` (stats(), which a poolmon snapshot calls under the lock) a result whose
        batch is still in flight stays queued for the next fire or step."""
        n, later = 0, []
        while self._dropped:
            with no_interrupts():
                keys, load, stream = item = self._dropped.pop()
                if load is not None and not load.batch.done.is_set():
                    if not settle:
                        later.append(item)
                        continue
                    load.settle(stream)    # never raises; a failed layer is rolled back
                with lock:
                    pool.unpin(keys)
                n += len(keys)
        self._dropped.extend(later)
        return n
