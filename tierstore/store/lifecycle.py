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
from tierstore.store.interrupts import no_interrupts


class Lifecycle(Closing):
    def close(self) -> None:
        """Finish in-flight fires and the running promotion, cancel queued ones
        (their tickets raise ClosedError), stop the worker, close the engine.
        A pipelined fire is active only until its reads are queued: its batch is
        settled here (published, or rolled back on error) before the engine and the
        pack close, so its owner's later wait_layer finds it published.
        One interrupt-deferred section: a Ctrl-C during close() is raised once the store
        is closed whole (a KeyboardInterrupt out of its settle left a batch in flight
        and the worker running, with ``closed`` already true: nothing would ever finish
        them)."""
        with no_interrupts():
            with self.lock:
                if self._closed:
                    return
                self._closed = True
                while self._active:
                    self._idle.wait()
                loads = [b.layer_load for b in self._mover.inflight.values()
                         if b.layer_load is not None]
            for load in loads:   # no new one can start: fires are refused from here on
                load.settle(load.batch.stream)
            self._worker.stop()
            for batch in self._pending_sources:   # publish="step": copies step() did not free
                self._mover.finish_sources(batch)
            self._pending_sources = []
            self._staged = []                      # read into the arena, never published
            if self._owns_engine:
                self.engine.close()
            self._drop_pack()

    def _drop_pack(self) -> None:
        """Release the reader lock (writers may start) and close a pack we opened."""
        fd, self._pack_lock = self._pack_lock, -1
        if fd >= 0:
            os.close(fd)
        if self._owns_pack:
            self.pack.close()


    @contextlib.contextmanager
    def _activity(self, what: str):
        with no_interrupts():
            self._enter(what)
            try:
                yield
            finally:
                self._exit()

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise ClosedError(f"{self.pack.path}: {what}() on a closed store")

    def _enter(self, what: str) -> None:
        with self.lock:
            self._check_open(what)
            self._active += 1

    def _exit(self) -> None:
        with self.lock:
            self._active -= 1
            self._idle.notify_all()
