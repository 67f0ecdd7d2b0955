"""The FP4 tier's step-boundary protocol and its background manager (a mixin of the tier).

vLLM-Moet's manager runs one pass per ``step_end`` wake (at most one per
DELTA_TICK_MS): it folds the step's routing into ``freq``, decays ``freq`` and
``need`` by DELTA_DECAY every DELTA_DECAY_S seconds, and (unless the policy is
``need``) promotes up to DELTA_PROMOTE routed, unmapped experts, hottest first.

Here the pass is split so that the manager thread never calls CUDA:

1. ``step_end`` (runner thread): the side stream waits on the forward, folds
   ``seen`` into an accumulator, zeroes ``seen`` and, when no snapshot is in
   flight, starts an async D2H of the accumulator into a pinned buffer with an
   event; the forward stream then waits on the side stream. No host sync.
2. at the next boundary (``step_end`` or ``wait_manager_idle``) the runner thread
   sees the event done (``query``, not a sync) and hands the snapshot over.
3. the manager thread (host only) ranks, reserves slots and reads the rows from
   the store into its own host stage.
4. the runner thread publishes the batch at the next boundary: copies and table
   writes on the side stream after the forward's queued work, the forward
   stream waits on them.

``wait_manager_idle(timeout=60.0)`` waits for a running pass (RuntimeError on
timeout), publishes what it staged and hands over a ready snapshot.
"""
from __future__ import annotations

import logging
import threading
import time

import numpy as np
import torch

from tierstore.adapters.moet_copy import by_layer

log = logging.getLogger("tierstore.adapters.moet")


class ManagerMixin:
    def _init_manager(self) -> None:
        self._thread: threading.Thread | None = None
        self._stop = False
        self._wake = threading.Event()
        self._manager_idle = threading.Event()
        self._manager_idle.set()
        self._job: np.ndarray | None = None           # snapshot handed to the manager
        self._staged = None                           # (keys, slots, victims, rows) to publish
        self._mgr_stage = None                        # the manager's own host stage
        self._mgr_stage_event = None                  # copies out of it still running
        self._snapshot_event = None
        self._snapshot_pending = False
        self._accum_reset = False
        self._last_decay_t = time.monotonic()
        self._last_pass_t = 0.0
        self.last_error: BaseException | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Start the manager thread (idempotent)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, daemon=True, name="moe-w2-delta")
        self._thread.start()

    def _stop_manager(self, timeout: float) -> None:
        self._stop = True
        self._wake.set()
        t = self._thread
        if t is not None and t is not threading.current_thread() and t.is_alive():
            t.join(timeout=timeout)
            if t.is_alive():
                raise RuntimeError(f"moet tier [{self._tag}] manager did not stop within "
                                   f"{timeout:.0f} s")
        self._thread = None

    def wake(self) -> None:
        """Hand over a finished snapshot and wake the manager (lock-free)."""
        self._handoff()

    def notify_capture(self) -> None:
        """Called by the glue while a CUDA graph is being captured. The manager thread
        makes no CUDA call, so there is nothing to quiesce: no CUDA call here either."""

    # -- step boundaries (runner thread) ----------------------------------------------------
    def wait_manager_idle(self, timeout: float = 60.0) -> None:
        """Before a forward: wait for a running manager pass (RuntimeError after
        ``timeout`` s), publish what it staged, hand over a ready snapshot."""
        if not self._manager_idle.wait(timeout=timeout):
            raise RuntimeError(f"moet tier [{self._tag}] manager did not reach a safe point "
                               f"within {timeout:.0f} s")
        self._commit_staged()
        self._handoff()

    def step_end(self) -> None:
        """Close the step: fold ``seen`` (async, no host sync), publish a finished manager
        batch, clear step and layer pins, hand over a snapshot / wake the manager."""
        if self._closed:
            return
        if self._cuda:
            main = torch.cuda.current_stream(self.dev)
            self._stream.wait_stream(main)
            with torch.cuda.stream(self._stream):
                self._fold_seen()
            main.wait_stream(self._stream)   # the next forward's marks land after the zero
        else:
            self._fold_seen()
        if self._manager_idle.is_set():
            self._commit_staged()
        with self._lock:
            self._owners.step_pins.clear()
            self._owners.layer_pins.clear()
        self._handoff()

    def _fold_seen(self) -> None:
        if self._accum_reset:
            self._seen_accum.zero_()
            self._accum_reset = False
        self._seen_accum.add_(self.seen)
        self.seen.zero_()
        if self._snapshot_pending:
            return
        self._seen_host.copy_(self._seen_accum, non_blocking=self._cuda)
        if self._cuda:
            self._snapshot_event = torch.cuda.Event()
            self._snapshot_event.record(self._stream)
        self._snapshot_pending = True

    def _settle(self, timeout: float = 60.0) -> None:
        """Before a synchronous load: no pass running, nothing staged (no new pass is
        started: the runner thread's own load must not race one)."""
        if not self._manager_idle.wait(timeout=timeout):
            raise RuntimeError(f"moet tier [{self._tag}] manager did not reach a safe point "
                               f"within {timeout:.0f} s")
        self._commit_staged()

    def _handoff(self) -> None:
        if (self._thread is None or not self._snapshot_pending or self._staged is not None
                or not self._manager_idle.is_set()):
            return
        if self._snapshot_event is not None and not self._snapshot_event.query():
            return
        if self._mgr_stage_event is not None:
            if not self._mgr_stage_event.query():
                return
            self._mgr_stage_event = None
        # Host memory the pass will use is allocated (pinned) here, on the runner thread:
        # the manager thread itself must make no CUDA call (graph capture, "global" mode).
        self._manager_stage(self.env.promote_per_pass)
        self._job = self._seen_host.reshape(-1).numpy().copy()
        self._snapshot_pending, self._snapshot_event = False, None
        self._accum_reset = True
        self._manager_idle.clear()
        self._wake.set()

    def _commit_staged(self) -> None:
        with self._lock:
            staged, self._staged = self._staged, None
        if staged is None:
            return
        keys, slots, victims, rows = staged
        try:
            if self._cuda:
                self._copy_rows(slots, rows)       # side stream, after the forward
                self._table_update(keys, slots, victims, self._stream)
                with torch.cuda.stream(self._stream):
                    self._mgr_stage_event = torch.cuda.Event()
                    self._mgr_stage_event.record(self._stream)
                torch.cuda.current_stream(self.dev).wait_stream(self._stream)
            else:
                self._copy_rows(slots, rows)
                self._table_update(keys, slots, victims)
        except BaseException as exc:  # noqa: BLE001 - a lazy promotion must not kill serving
            with self._lock:
                self._quarantine(slots, victims)
            log.warning("moet tier [%s]: publishing %d lazy promotions failed: %s",
                        self._tag, len(slots), exc)
            return
        with self._lock:
            self._owners.commit(keys, slots, victims)
        self._n_promoted += len(slots)
        self._n_evicted += int(np.count_nonzero(np.asarray(victims) >= 0))
        self._fire_hooks()

    # -- the manager thread (host only) -----------------------------------------------------
    def _loop(self) -> None:
        while not self._stop:
            self._wake.wait()
            self._wake.clear()
            if self._stop:
                break
            gap = self.env.tick_s - (time.monotonic() - self._last_pass_t)
            if gap > 0:
                time.sleep(gap)
            self._last_pass_t = time.monotonic()
            job, self._job = self._job, None
            try:
                if job is not None:
                    self._pass(job)
            except Exception as exc:  # noqa: BLE001 - never kill serving; the next pass retries
                self.last_error = exc
                log.warning("moet tier [%s] manager pass failed: %s", self._tag, exc)
            finally:
                self._manager_idle.set()
        self._manager_idle.set()

    def _pass(self, counts: np.ndarray) -> None:
        env, o = self.env, self._owners
        routed = np.flatnonzero(counts)
        with self._lock:
            o.tick += 1
            self._win_active += float(counts[routed].sum())
            o.freq[routed] += counts[routed]
            slots = o.slot_of(routed)
            o.touch(slots[slots >= 0])
            now = time.monotonic()
            if now - self._last_decay_t >= env.decay_s:
                o.decay(env.decay ** ((now - self._last_decay_t) / env.decay_s))
                self._last_decay_t = now
            if self._policy == "need" or env.promote_per_pass <= 0 or len(self._store) == 0:
                return
            cand = routed[(slots < 0) & self._layer_mask()[routed // self.E]]
            if self._policy == "freq":
                cand = cand[np.argsort(-o.freq[cand], kind="stable")]
            if env.promo_hyst > 1.0 and not o.free and len(cand):
                cand = cand[o.freq[cand] > self._hyst_bar(counts > 0)]
            cand = cand[: env.promote_per_pass]
            if not len(cand):
                return
            slots, victims = o.take(len(cand), counts > 0)
            cand = cand[: len(slots)]
            if not len(slots):
                return
        cand, slots, victims = by_layer(cand, slots, victims)
        pairs = np.stack([cand // self.E, cand % self.E], axis=1)
        try:   # host work only: the stage was allocated on the runner thread (_handoff)
            rows = self._store.rows_block(pairs, out=self._manager_stage(len(pairs)))
        except BaseException:
            with self._lock:
                o.cancel(slots, victims)
            raise
        with self._lock:
            self._staged = (cand, slots, victims, rows)

    def _hyst_bar(self, window: np.ndarray) -> float:
        o = self._owners
        ok = (o.owner >= 0) & ~window[np.clip(o.owner, 0, None)] & ((o.tick - o.owner_tick) >= 2)
        pins = list(o.step_pins | o.layer_pins)
        if pins:
            ok[pins] = False
        if not ok.any():
            return np.inf
        return float(o.freq[o.owner[ok]].min()) * self.env.promo_hyst + 4.0

    def _manager_stage(self, n: int):
        """The manager's host stage (and the store's reader), made on the runner thread
        by ``_handoff``; the pass only ever gets the existing one."""
        alloc = getattr(self._store, "alloc_stage", None)
        if alloc is None or n <= 0 or len(self._store) == 0:
            return None     # nothing to read: the pass never gets here
        if self._mgr_stage is None or self._mgr_stage.shape[0] < n:
            if threading.current_thread() is self._thread:
                raise RuntimeError("moet tier: manager stage must be allocated by the runner")
            self._mgr_stage = alloc(n)
        return self._mgr_stage
