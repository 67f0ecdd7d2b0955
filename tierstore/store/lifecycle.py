"""The store's lifetime (a mixin of ExpertStore): close(), the activity count close()
waits for, and the pack's reader lock.

Activity: every call that reads or moves rows (fire, load_arena, evict) runs
inside ``_activity``: counted, so close() waits for it before the worker stops and the
engine closes, and interrupt-deferred (store/interrupts.py), so a Ctrl-C can never leave
the count raised (close() would wait forever) or the call's pins taken."""

from __future__ import annotations

import contextlib
import os

from tierstore.errors import ClosedError
from tierstore.files.closing import Closing


class Lifecycle(Closing):
    def close(self) -> None:
        """Finish in-flight fires and the running promotion, cancel queued ones
        (their tickets raise ClosedError), stop the worker, close the engine.
        A pipelined fire is active only until its reads are queued: its batch is
        settled here (published, or rolled back on error) before the engine and the
        pack close, so its owner's later wait_layer finds it published.
        Every step is safe to run again: a close() a Ctrl-C cut short is finished by the
        next close() (or by the finalizer), and a section a Ctrl-C left open is finished
        first (store/interrupts.py)."""
        with self.lock:
            if self._close_done:
                return
            self._closed = True
            while self._active:
                self._idle.wait(0.05)  # a token dropped by a Ctrl-C leaves without a notify
        self._journal.drain()
        with self.lock:
            loads = [b.layer_load for b in self._mover.inflight.values() if b.layer_load is not None]
        for load in loads:  # no new one can start: fires are refused from here on
            load.settle(load.batch.stream)
        self._worker.stop()
        with self.lock:  # the callers and the worker are done: a batch still planned was
            planned = [
                b
                for b in self._mover.inflight.values()  # left by a Ctrl-C
                if b.layer_load is None and b.completion is None and b.error is None
            ]
        for batch in planned:
            self._mover._rollback(batch)
        for batch in self._pending_sources:  # publish="step": copies step() did not free
            self._mover.finish_sources(batch)
        self._pending_sources = []
        self._staged = []  # read into the arena, never published
        if self._owns_engine:
            self.engine.close()
        self._drop_pack()
        self._close_done = True

    def _after_fork_in_child(self) -> None:
        """tierstore/process.py, in a fork()ed child, before the store is made inert: the
        child lets go of its copy of the reader lock's fd (the parent's lock must not
        outlive the parent through a child) and counts the store closed."""
        self._closed = self._close_done = True
        fd, self._pack_lock = self._pack_lock, -1
        if fd >= 0:
            os.close(fd)

    def _drop_pack(self) -> None:
        """Release the reader lock (writers may start) and close a pack we opened."""
        fd, self._pack_lock = self._pack_lock, -1
        if fd >= 0:
            os.close(fd)
        if self._owns_pack:
            self.pack.close()

    @contextlib.contextmanager
    def _activity(self, what: str):
        """Counted so close() waits for the call: a token in ``_active`` (a WeakSet),
        added and discarded under the lock. Discarding is idempotent, and a token whose
        call a Ctrl-C cut short, even in this finally, leaves the set with the call's
        frame: nothing can stay counted (store/interrupts.py)."""
        token = _Token()
        try:
            self._enter(what, token)
            yield
        finally:
            self._exit(token)

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise ClosedError(f"{self.pack.path}: {what}() on a closed store")

    def _enter(self, what: str, token) -> None:
        with self.lock:
            self._check_open(what)
            self._active.add(token)

    def _exit(self, token) -> None:
        with self.lock:
            self._active.discard(token)
            self._idle.notify_all()


class _Token:
    """One counted call (weakly referenced by ``_active``)."""

    __slots__ = ("__weakref__",)
