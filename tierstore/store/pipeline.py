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

import time

import numpy as np

from tierstore.store.interrupts import no_interrupts
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
        self.pending = set(self.spans)
        self.failed: set[int] = set()  # layers rolled back after an error: never published
        self.error: BaseException | None = None
        self.reported = False  # the error was raised to the caller once
        self.t0 = time.perf_counter()
        batch.completion = Completions()

    def submit(self) -> None:
        """Queue every layer's rows (layer order); no waiting. On a refused submit the
        whole batch is rolled back and the error raised."""
        mover, batch = self.mover, self.batch
        lengths = np.full(len(batch.keys), mover.pack.slot_bytes, dtype=np.int64)
        device = bool(mover.pool.is_cuda)
        try:
            mover.order_after_unpublish(batch)
            for layer, (s, e) in self.spans.items():
                comp = mover.engine.submit(batch.offsets[s:e], lengths[s:e], batch.src[s:e],
                                           batch.dst[s:e], dst_device=device)
                self.comps[layer] = comp
                batch.completion.parts.append(comp)
        except BaseException as exc:
            self._fail(exc)
            raise self.error from exc if self.error is not exc else exc

    @property
    def done(self) -> bool:
        return not self.pending

    def wait_layer(self, layer: int, stream) -> None:
        """Publish ``layer``'s slots on ``stream`` once its reads landed (host waits for
        those reads only). A layer with nothing in flight returns at once."""
        layer = self.group_of.get(layer, -1)  # from here on: the layer's group
        if layer in self.failed:
            self.reported = True
            raise self.error
        if layer not in self.pending:
            return
        comp = self.comps[layer]
        try:
            comp.wait()
        except BaseException as exc:
            self.batch.completion.failed = comp
            self._fail(exc)
            self.reported = True
            raise self.error from exc if self.error is not exc else exc
        mover, batch = self.mover, self.batch
        s, e = self.spans[layer]
        with no_interrupts(), mover.lock:   # the tables are written whole or not at all
            if layer not in self.pending:  # another thread published it meanwhile
                return
            if mover.pool.is_cuda:
                comp.stream_wait(stream)
            batch.publish_event = mover.pool.publish(batch.pool_slots[s:e], stream)
            self.pending.discard(layer)
            if not self.pending:
                self._complete()
        if not self.pending:
            batch.done.set()
            if not batch.sources_released:
                self.defer_sources(batch)  # the worker waits for the copies, then unpins

    def wait_all(self, stream) -> None:
        """Publish every layer still pending (in layer order)."""
        for layer in sorted(self.pending):
            self.wait_layer(layer, stream)
        if self.failed and not self.reported:
            self.reported = True
            raise self.error

    # -- internals ----------------------------------------------------------------------
    def _complete(self) -> None:
        """Every layer published (caller holds the lock): commit arena rows, account."""
        mover, batch = self.mover, self.batch
        if len(batch.arena_new):
            mover.arena.commit(batch.arena_new)
        mover._account(batch, time.perf_counter() - self.t0)
        batch.ok = True
        mover.inflight.pop(batch.id, None)
        if not mover.pool.is_cuda:
            mover._unpin_sources(batch)  # CPU copies are complete

    def _fail(self, exc: BaseException) -> None:
        """Cancel and drain every unpublished layer, roll back its slots; keep published ones."""
        mover, batch = self.mover, self.batch
        self.error = mover._annotate(exc, batch) if isinstance(exc, TierIOError) else exc
        left = sorted(self.pending)
        for layer in left:
            if layer in self.comps:
                self.comps[layer].cancel()
        try:  # nothing may still land in a slot we give back or read an arena row we free
            batch.completion.synchronize()
        except BaseException:  # noqa: BLE001 - its own error or a cancellation
            pass
        slots = [batch.pool_slots[slice(*self.spans[l])] for l in left]
        with mover.lock:
            if slots:
                mover.pool.rollback(np.concatenate(slots))
            if len(batch.arena_new):
                mover.arena.rollback(batch.arena_new)
            mover._unpin_sources(batch)
            mover.counters.failed_reads += 1
            mover.inflight.pop(batch.id, None)
            self.failed.update(left)
            self.pending.clear()
        batch.error = self.error
        batch.done.set()
