"""The store's background worker: one thread per store runs promotions, deferred
source unpins and snapshots off the forward thread; ``Ticket`` is the handle a caller
of ``promote`` waits on."""

from __future__ import annotations

import queue
import threading
import weakref

from tierstore import process, settings


class Worker:
    """One daemon thread that runs an owner's jobs in order: ``owner._run_job(job)``.

    It holds only a weak reference to the owner between jobs, so a store nobody closed
    can still be collected (and its ``__del__`` closes it). The idle condition is its
    own, not the store's lock: waiting for the worker never blocks the forward thread."""

    def __init__(self, owner, name: str):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._cv = threading.Condition()
        self._open = 0  # queued or running jobs
        self._stopping = False
        self.thread = threading.Thread(target=_loop, args=(weakref.ref(owner), self), name=name, daemon=True)
        self.thread.start()

    def submit(self, job) -> bool:
        """Queue ``job``; False (not queued) once ``stop`` has begun."""
        with self._cv:
            if self._stopping:
                return False
            self._open += 1
            self._jobs.put(job)  # under the condition: never after stop()'s sentinel
        return True

    def _done_one(self) -> None:
        with self._cv:
            self._open -= 1
            self._cv.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: self._open == 0, timeout)

    def stop(self) -> None:
        """Run what is queued, then end the thread (joined unless called from it)."""
        with self._cv:
            self._stopping = True
            self._jobs.put(None)
        if threading.current_thread() is not self.thread:
            self.thread.join()


def _loop(owner_ref, worker: Worker) -> None:
    while True:
        job = worker._jobs.get()
        owner = owner_ref()
        if job is None or owner is None:
            return
        try:
            owner._run_job(job)
        finally:
            worker._done_one()
            del owner


class Ticket:
    """Handle of an asynchronous promotion. ``wait`` re-raises the promotion's error."""

    def __init__(self, requested: int, path: str | None = None):
        self.requested = int(requested)
        self.promoted = 0
        self._error: BaseException | None = None
        self._event = threading.Event()
        self._born, self._path = process.generation(), path  # see wait()

    def _finish(self, promoted: int = 0, error: BaseException | None = None) -> None:
        self.promoted, self._error = int(promoted), error
        self._event.set()

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """True once the promotion finished (False on timeout); raises its error. In a
        fork()ed child a ticket of the parent that had not finished raises ForkedError
        (the worker that would finish it stayed in the parent)."""
        if self._born != process.generation() and not self._event.is_set():
            raise process.forked_error("wait() on a promotion ticket", self._born, "ExpertStore", self._path)
        if not self._event.wait(settings.timeout("Ticket.wait: timeout", timeout)):
            return False
        if self._error is not None:
            raise self._error
        return True
