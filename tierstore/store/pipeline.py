"""A pipelined fire: one load batch submitted layer by layer, published layer by layer.

``ExpertStore.fire(..., pipelined=True)`` plans its misses as one batch (one lock
hold, one slot take), then ``LayerLoad.submit`` hands the engine one submission per
layer, in layer order (the readers take them FIFO, so layer 0 lands first), and
fire returns. The forward thread calls ``FireResult.wait_layer(l)`` before it
launches layer ``l``: that waits on the host for layer ``l``'s reads only (never for
a copy and never for the device), makes the consumer stream wait on that layer's
copy event, and enqueues that layer's slot-table write on the stream. So the GPU
computes resident layers while the readers are still on later layers.

Failure: a failed layer raises from its ``wait_layer``; every layer not yet
published is cancelled, waited out and rolled back (nothing of it is published);
layers already published stay resident. ``wait_all`` publishes whatever is left
(``release`` calls it, so a batch always ends).
"""

from __future__ import annotations

import threading
import time

import numpy as np

from tierstore.errors import TierIOError


class Completions:
    """The engine completions of one pipelined batch, seen as one (``finish_sources``,
    ``_rollback`` and ``_annotate`` only call ``synchronize`` / ``failed_rows``)."""

    def __init__(self):
        self.parts: list = []
        self.failed = None  # the completion that raised, for the error's row

    def synchronize(self) -> None:
        first = None
        for comp in self.parts:
            try:
                comp.synchronize()
            except BaseException as exc:  # noqa: BLE001 - drain all, raise the first
                first = first or exc
        if first is not None:
            raise first

    @property
    def failed_rows(self):
        return None if self.failed is None else self.failed.failed_rows


class LayerLoad:
    """The per-layer publication of one planned pool batch (see the module doc)."""

    def __init__(self, mover, batch, n_experts: int, defer_sources=None, group_bytes: int = 0):
        self.mover, self.batch = mover, batch
        self.defer_sources = defer_sources or mover.finish_sources
        order = np.argsort(batch.keys // n_experts, kind="stable")
        for name in ("keys", "pool_slots", "offsets", "src", "dst"):
            setattr(batch, name, getattr(batch, name)[order])
        layers = batch.keys // n_experts
        cut = np.flatnonzero(np.diff(layers)) + 1
        starts = np.concatenate([[0], cut]).tolist()
        ends = np.concatenate([cut, [len(layers)]]).tolist()
        # Consecutive layers share one engine submission until it holds group_bytes
        # (0: one per layer); a group is keyed by its first layer and published whole.
        self.spans, self.group_of = {}, {}
        rows_per = max(1, -(-int(group_bytes) // max(1, mover.pack.slot_bytes)))
        g0 = None
        for s_, e_ in zip(starts, ends):
            layer = int(layers[s_])
            if g0 is None or self.spans[g0][1] - self.spans[g0][0] >= rows_per:
                g0 = layer
                self.spans[g0] = (s_, e_)
            else:
                self.spans[g0] = (self.spans[g0][0], e_)
            self.group_of[layer] = g0
        self.comps: dict[int, object] = {}
        self.events: dict[int, object] = {}  # group -> its table-write event (CUDA)
        self.pending = set(self.spans)
        self.failed: set[int] = set()  # layers rolled back after an error: never published
        self.error: BaseException | None = None
        self.reported = False  # the error was raised to the caller once
        self.t0 = time.perf_counter()
        self.submitted = threading.Event()  # submit() has queued (or failed) every layer
        self.claimed: list | None = None  # the layers a failure rolls back (_fail_whole)
        # Published last, in one statement: a Ctrl-C anywhere above leaves the batch without
        # a half-built load (abandon_planned then rolls it back as a plain batch).
        batch.completion, batch.layer_load = Completions(), self  # a fire that needs these keys settles it

    def submit(self) -> None:
        """Queue every layer's rows (layer order); no waiting. On a refused submit the
        whole batch is rolled back and the error raised."""
        mover, batch = self.mover, self.batch
        lengths = np.full(len(batch.keys), mover.pack.slot_bytes, dtype=np.int64)
        device = bool(mover.pool.is_cuda)
        try:
            mover.order_after_unpublish(batch)
            verifier = mover.verifier
            for layer, (s, e) in self.spans.items():
                sums = None if verifier is None else verifier.checksums(batch.keys[s:e], batch.offsets[s:e])
                comp = mover.engine.submit(
                    batch.offsets[s:e],
                    lengths[s:e],
                    batch.src[s:e],
                    batch.dst[s:e],
                    dst_device=device,
                    checksums=sums,
                )
                self.comps[layer] = comp
                batch.completion.parts.append(comp)
        except BaseException as exc:
            self.submitted.set()
            self._fail(exc)
            raise self.error from exc if self.error is not exc else exc
        self.submitted.set()

    @property
    def done(self) -> bool:
        return not self.pending

    def wait_layer(self, layer: int, stream) -> None:
        """Publish ``layer``'s slots on ``stream`` once its reads landed (host waits for
        those reads only). A layer with nothing in flight returns at once. A Ctrl-C while
        waiting settles the whole batch before it is raised (store/interrupts.py)."""
        group = self.group_of.get(layer, -1)
        if group not in self.pending and group not in self.failed:
            return self._wait_published(group, stream)  # the common call: nothing to wait for
        try:
            self._publish(group, stream, report=True)
        except (KeyboardInterrupt, SystemExit):
            self.settle(stream)
            raise

    def settle(self, stream) -> None:
        """Another fire needs keys this batch is loading: publish every layer whose reads
        land (on that fire's ``stream``), from its own thread. Waiting for the owner's
        wait_layer instead would hang: the owner may be that very thread, a fire waiting
        on this thread's batch, or a caller whose release() close() refused. Never raises:
        a failed layer is rolled back here and reported to the owner; the waiting fire
        sees ``batch.ok`` False and retries."""
        for layer in sorted(self.pending):
            try:
                self._publish(layer, stream, report=False)
            except BaseException:  # noqa: BLE001 - the owner reports it (wait_layer / release)
                break
        self.batch.done.wait()

    def _publish(self, layer: int, stream, report: bool) -> None:
        """wait_layer / settle of one group (``layer`` = the group's first layer)."""
        if layer not in self.pending and layer not in self.failed:
            return self._wait_published(layer, stream)
        if not self.submitted.is_set():  # a flag read, no lock: the common case
            self.submitted.wait()  # settle() from another fire may come before submit() ends
        comp = self.comps.get(layer)
        try:
            if comp is None or layer in self.failed:
                raise self._failure()
            comp.wait()
        except (KeyboardInterrupt, SystemExit):
            raise  # not the batch's failure: the caller settles it (wait_layer)
        except BaseException as exc:
            self._raise_failed(exc, comp, report)
        mover = self.mover
        s, e = self.spans[layer]
        with mover.lock:  # the tables are written whole or not at all (a journal section)
            if layer in self.failed:  # another thread's layer failed meanwhile
                raise self._failure()
            if layer not in self.pending:  # another thread published it meanwhile
                return self._wait_published(layer, stream)
            try:  # under the lock: whoever publishes the last layer (close()'s
                mover.pack.check_unchanged(  # settle too) does so before the pack closes
                    mover.verifier is not None and mover.verifier.hashes_every_read
                )
            except Exception as exc:  # noqa: BLE001 - a replaced file: publish nothing
                changed = exc
            else:
                mover.journal.run(*self._publish_steps(layer, s, e, comp, stream))
                return
        self._raise_failed(changed, comp, report)

    def _raise_failed(self, exc: BaseException, comp, report: bool):
        """Roll back what is unpublished and raise the batch's error."""
        self._fail(exc, comp)
        if report:
            self.reported = True
        err = self._failure()
        raise err from exc if err is not exc else exc

    def _publish_steps(self, layer: int, s: int, e: int, comp, stream) -> list:
        """One group's publish as journal steps (caller holds the lock); the last group's
        also completes the batch and sets ``done`` (a waiter on it must never hang)."""
        mover, batch = self.mover, self.batch
        slots = batch.pool_slots[s:e]

        def events():
            self.events[layer] = batch.publish_event

        steps = mover.pool_steps(batch, slots, stream, comp) + [events]
        steps.append(lambda: self.pending.discard(layer))
        if self.pending == {layer}:  # the last group: the batch ends with it
            steps += mover.completion_steps(batch, time.perf_counter() - self.t0, self.defer_sources)
        return steps

    def _wait_published(self, layer: int, stream) -> None:
        """The group is published (maybe by another thread's settle, on its stream):
        ``stream`` waits on that table write before work on it is enqueued."""
        event = self.events.get(layer)
        if event is not None and stream is not None:
            stream.wait_event(event)

    def _failure(self) -> BaseException:
        return self.error if self.error is not None else RuntimeError("layer load failed")

    def wait_all(self, stream) -> None:
        """Publish every layer still pending (in layer order); a Ctrl-C settles the rest
        of the batch before it is raised."""
        try:
            for layer in sorted(self.pending):
                self.wait_layer(layer, stream)
        except (KeyboardInterrupt, SystemExit):
            self.settle(stream)
            raise
        if self.failed and not self.reported:
            self.reported = True
            raise self.error

    # -- internals ----------------------------------------------------------------------
    def _fail(self, exc: BaseException, comp=None) -> None:
        """Cancel and drain every unpublished layer, roll back its slots; keep published
        ones. Any thread may get here (owner or settle); the first one claims the layers
        and does the work (even when a Ctrl-C comes right after its claim), the others
        wait for ``done``."""
        mover, batch = self.mover, self.batch
        first = False
        try:
            with mover.lock:  # claim the unpublished layers: no one publishes them from now on
                if self.error is None:
                    first = True
                    mover.journal.run(lambda: self._claim(exc, comp))
        finally:
            if first and self.claimed is not None:
                self._roll_back_claimed()
        if not first:
            batch.done.wait()  # the first failing thread is rolling back

    def _roll_back_claimed(self) -> None:
        mover, batch, claimed = self.mover, self.batch, self.claimed
        try:
            for layer in claimed:
                if layer in self.comps:
                    self.comps[layer].cancel()
        finally:  # even after a Ctrl-C: the slots go back once nothing can land in them
            self._drain_quietly()
            slots = [batch.pool_slots[slice(*self.spans[l])] for l in claimed]
            slots = np.concatenate(slots) if slots else np.empty(0, np.int64)
            mover.journal.run(
                *mover.rollback_steps(batch, slots),
                lambda: setattr(batch, "error", self.error),
                batch.done.set,
            )

    def _claim(self, exc: BaseException, comp) -> None:
        """The failing layers, claimed (a journal step: safe to run again)."""
        mover, batch = self.mover, self.batch
        if self.claimed is None:
            self.claimed = sorted(self.pending)
        self.failed.update(self.claimed)
        self.pending.clear()
        batch.completion.failed = comp
        self.error = mover._annotate(exc, batch) if isinstance(exc, TierIOError) else exc

    def _drain_quietly(self) -> None:
        """Nothing may still land in a slot we give back or read an arena row we free."""
        try:
            self.batch.completion.synchronize()
        except BaseException:  # noqa: BLE001 - its own error, a cancellation or a Ctrl-C
            try:
                self.batch.completion.synchronize()  # a Ctrl-C cut the first wait short
            except BaseException:  # noqa: BLE001
                pass
