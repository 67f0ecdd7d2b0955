"""The store's background jobs (a mixin of ExpertStore): promote() tickets, lazy
promotions queued by step(), deferred unpins of copy sources and poolmon snapshots, all run
by the store's Worker thread so the forward thread never waits on the disk.

Every queued promotion finishes its Ticket: with the rows promoted, with the read's
TierIOError, or with ClosedError when close() came first (also when close() races the
submit itself: the worker refuses jobs once it is stopping)."""

from __future__ import annotations

import logging

import numpy as np

from tierstore import settings
from tierstore.errors import ClosedError
from tierstore.store.worker import Ticket

log = logging.getLogger("tierstore.store")


class BackgroundJobs:
    def promote(self, keys) -> Ticket:
        """Queue keys for the background worker (evicting cold unpinned keys); returns a
        Ticket. Bad keys raise here; I/O errors surface at ``ticket.wait()``."""
        dense = self._dense(keys)
        self._check_open("promote")
        ticket = Ticket(len(dense), self.pack.path)
        # publish="step": read into arena rows now (the ticket is done then), published at
        # the next step()
        kind = "stage" if self.config.publish == "step" else "promote"
        self._submit_job((kind, dense, ticket, False))
        return ticket

    def _run_job(self, job) -> None:
        kind = job[0]
        if kind in ("promote", "stage"):  # stage: publish="step", read only (_stage_now)
            _, keys, ticket, lazy = job
            try:
                if self._closed:
                    raise ClosedError(
                        f"{self.pack.path}: store closed before this promotion of {len(keys)} keys ran"
                    )
                if kind == "promote":
                    ticket._finish(self._promote_now(keys))
                else:
                    self._stage_now(keys, ticket)
            except BaseException as exc:  # noqa: BLE001 - handed to ticket.wait()
                ticket._finish(error=exc)
                from tierstore.store.fire import quarantine

                if quarantine(self, exc):
                    pass  # named once; the next step plans without that row
                elif lazy and not isinstance(exc, ClosedError):
                    log.warning("lazy promotion failed: %s", exc)
            finally:
                if lazy:
                    self._lazy_busy = False
        elif kind == "sources":
            try:
                self._mover.finish_sources(job[1])
            except BaseException as exc:  # noqa: BLE001
                log.warning("copy completion failed: %s", exc)
        elif kind == "snapshot" and not self._closed:
            try:
                self.save_poolmon(job[1])
            except Exception as exc:  # noqa: BLE001 - a snapshot is a hint
                self._snapshot_log.failed(job[1], exc)  # warned once a run, then counted
            else:
                self._snapshot_log.succeeded(job[1])

    @property
    def _snapshot_log(self):
        failures = getattr(self, "_snapshot_failure_log", None)
        if failures is None:  # made on first use (the worker's first snapshot)
            from tierstore.warm.snapshot import FailureLog

            failures = self._snapshot_failure_log = FailureLog(log, "poolmon snapshot")
        return failures

    @property
    def snapshot_failures(self) -> int:
        """Periodic poolmon snapshots (``snapshot=``) that failed so far; the first of
        each run of failures was logged as a warning, the rest only counted."""
        return self._snapshot_log.failures

    def _promote_now(self, keys: np.ndarray) -> int:
        with self.lock:
            keys = keys[self._pool.slot_of[keys] < 0]
            batch = self._mover.plan(keys, to_pool=True, stream=self._stream) if len(keys) else None
        if batch is None:
            return 0
        self._mover.run(batch)  # the worker may block on the copies itself
        return len(batch.keys)

    def _stage_now(self, keys: np.ndarray, ticket) -> None:
        """publish="step", on the worker: read ``keys`` not yet in the pool into arena rows
        (host reads only: no CUDA call, nothing published) and hand them to the next
        step(), which copies them up. ``ticket`` is finished with the rows staged."""
        with self.lock:
            keys = keys[self._pool.slot_of[keys] < 0]
            need = keys[self._arena.slot_of[keys] < 0]
            batch = self._mover.plan(need, to_pool=False, stream=None) if len(need) else None
        if batch is not None:
            self._mover.run(batch)
        with self.lock:  # pinned in the arena until step() publishes them (a fire's
            keys = keys[self._arena.resident_slot[keys] >= 0]  # reads must not evict them)
            self._arena.pin(keys)
            self._staged.append(keys)
        if ticket is not None:
            ticket._finish(len(keys))

    def _defer_sources(self, batch) -> None:
        if self.config.publish == "step":  # the worker makes no CUDA call: step() frees them
            with self.lock:
                self._pending_sources.append(batch)
            return
        self._submit_job(("sources", batch))

    def _submit_job(self, job) -> bool:
        """Queue a job; False when the worker has stopped (the store is closing). A promote
        job refused so finishes its ticket with ClosedError: no ticket is ever left waiting."""
        if self._worker.submit(job):
            return True
        if job[0] == "promote":
            job[2]._finish(
                error=ClosedError(
                    f"{self.pack.path}: store closed before this promotion of {len(job[1])} keys ran"
                )
            )
        return False

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until the background worker has nothing queued or running (lazy
        promotions, promote() tickets, snapshots); False on timeout. The runner calls
        this at a step boundary when it needs a settled pool (tests, snapshots)."""
        return self._worker.wait_idle(settings.timeout("wait_idle: timeout", timeout))
