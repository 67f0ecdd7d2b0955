"""Load batches: the three phases of moving rows up a tier.

1. ``Mover.plan`` (caller holds the store lock; no I/O): reserve pool slots
   (LOADING; victims unpublished on the consumer stream) and arena rows, pin
   arena rows that will be copy sources, build the engine's row arrays.
2. ``Mover.run`` (lock released): order the copies after the unpublish event (on
   CUDA the copy stream waits for it on the device: no host sync), submit to the
   engine, wait for the reads. Nothing here holds the lock while reading.
   ``Mover.start_layers`` instead submits layer by layer and returns at once
   (pipelined fire, tierstore/store/pipeline.py).
3. still in ``run``: re-take the lock to publish (stream waits on the copy, then
   the slot-table write on that stream) or, on any error, roll back every slot
   and row the batch took and publish nothing.

A batch's arena source rows stay pinned until its copies have finished; on the
CPU that is when the reads returned, on CUDA when ``completion.synchronize()``
returns, which ``finish_sources`` does off the forward thread.
"""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np

from tierstore.errors import TierIOError
from tierstore.store.interrupts import Journal

_ids = itertools.count(1)
_EMPTY_KEYS = np.empty(0, dtype=np.int64)


class LoadBatch:
    """One engine submission. ``keys[i]`` lands in ``pool_slots[i]`` (pool loads)."""

    def __init__(self, keys, to_pool, stream):
        self.id = next(_ids)
        self.keys = keys
        self.to_pool = to_pool
        self.stream = stream
        self.pool_slots = np.empty(0, np.int64)
        self.reused = np.empty(0, np.int64)  # pool slots taken from victims (EVICTING)
        self.unpublish_event = None
        self.arena_new = np.empty(0, np.int64)  # arena rows this batch reads into (LOADING)
        self.arena_pinned = np.empty(0, np.int64)  # arena keys pinned as copy sources
        self.offsets = self.src = self.dst = None
        self.n_arena_hits = 0
        self.completion = None
        self.publish_event = None
        self.ok = False
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.sources_released = False
        self.layer_load = None  # a pipelined batch's LayerLoad (store/pipeline.py)
        self.accounted = False  # once-only steps of its publish / rollback (interrupts.py)
        self.failed_counted = False
        self.sources_deferred = False
        self.completion_real = False  # run() reached the engine (abandon_planned)


class Mover:
    """Plans and runs load batches for one store (see the module docstring)."""

    def __init__(
        self,
        pack,
        engine,
        pool,
        arena,
        lock,
        counters,
        scan_keep: float,
        default_stream=None,
        verifier=None,
        journal=None,
    ):
        self.pack, self.engine, self.pool, self.arena = pack, engine, pool, arena
        self.journal = journal if journal is not None else Journal(lock)  # store/interrupts.py
        self.verifier = verifier  # RowVerifier: which rows the engine hashes (store/verify.py)
        self.lock, self.counters, self.scan_keep = lock, counters, float(scan_keep)
        self.default_stream = default_stream  # the store's consumer stream (CUDA)
        self.inflight: dict[int, LoadBatch] = {}
        self._planned = threading.local()  # this thread's last plan (abandon_planned)

    # -- 1. plan (under the lock) ------------------------------------------------------
    def plan(
        self,
        keys: np.ndarray,
        *,
        to_pool: bool,
        stream,
        scan: bool = False,
        allow_evict: bool = True,
        spare: np.ndarray | None = None,
    ) -> LoadBatch | None:
        """Reserve room for ``keys`` (unique dense ids, hottest first). Pool loads take
        keys not in the pool; arena-only loads (``to_pool=False``) keys not in the
        arena. Keys that do not fit are left out. None when nothing fits. ``spare``:
        bool [n_keys] of pool keys that must not be victims (the step's routed set)."""
        pool, arena = self.pool, self.arena
        batch = LoadBatch(keys, to_pool, stream)
        protect = arena.hot_mask(self.scan_keep) if scan else None
        # Decide first (nothing changes), then make it so as one journal section: a
        # Ctrl-C inside it is rolled forward and the batch given back (interrupts.py).
        if not to_pool:
            got = arena.choose(keys[arena.slot_of[keys] < 0], allow_evict=allow_evict, protect=protect)
            if not len(got):
                return None
            batch.keys, batch.arena_new, batch.arena_pinned = got.keys, got.slots, got.keys
            batch.offsets = self.pack.row_offsets(got.keys).astype(np.int64)
            batch.src = arena.row_ptrs(got.slots)
            batch.dst = np.zeros(len(got.keys), np.uint64)
            return self._reserve(batch, None, got, _EMPTY_KEYS)
        protect_pool = pool.hot_mask(self.scan_keep) if scan else None
        if spare is not None:
            protect_pool = spare if protect_pool is None else (protect_pool | spare)
        taken = pool.choose(keys, allow_evict=allow_evict, protect=protect_pool)
        if not len(taken):
            return None
        keys = batch.keys = taken.keys
        batch.pool_slots, batch.reused = taken.slots, taken.reused
        # Arena hits are zero-copy sources; misses read into a free (or evictable) row
        # when there is one, else into the engine's own staging buffers.
        a_slot = arena.resident_slot[keys]
        hit = a_slot >= 0
        hit_keys = keys[hit]
        sources = np.zeros(arena.n_keys, dtype=bool)  # a source row must not become a victim
        sources[hit_keys] = True
        got = arena.choose(
            keys[~hit & (arena.slot_of[keys] < 0)],
            allow_evict=True,
            protect=sources if protect is None else (protect | sources),
        )
        batch.arena_new = got.slots
        batch.arena_pinned = np.concatenate([hit_keys, got.keys])
        batch.n_arena_hits = len(hit_keys)
        offsets = self.pack.row_offsets(keys).astype(np.int64)
        src = np.zeros(len(keys), dtype=np.uint64)
        offsets[hit] = -1
        src[hit] = arena.row_ptrs(a_slot[hit])
        if len(got.keys):
            order = np.argsort(keys, kind="stable")
            src[order[np.searchsorted(keys[order], got.keys)]] = arena.row_ptrs(got.slots)
        batch.offsets, batch.src, batch.dst = offsets, src, pool.slot_ptrs(batch.pool_slots)
        return self._reserve(batch, taken, got, hit_keys)

    def _reserve(self, batch: LoadBatch, taken, got, hit_keys: np.ndarray) -> LoadBatch:
        """Make a planned batch's reservations (caller holds the lock): one journal
        section; a Ctrl-C inside it gives the whole batch back before it is raised."""
        pool, arena, stream = self.pool, self.arena, batch.stream
        self._planned.batch = batch  # from here on a Ctrl-C may part it from its caller
        steps = []
        if taken is not None:
            steps.append(lambda: pool.apply(taken))
            if len(taken.victims):
                if stream is not None and self.default_stream is not None and stream != self.default_stream:
                    # Readers of the victims may sit on the store's stream too: the
                    # unpublish event must come after their work as well as the caller's.
                    steps.append(lambda: stream.wait_stream(self.default_stream))

                def unpublish():
                    batch.unpublish_event = pool.unpublish(taken.victims, stream)

                steps.append(unpublish)
            steps.append(lambda: pool.batch_of_slot.__setitem__(taken.slots, batch.id))
        if len(hit_keys):
            steps.append(lambda: arena.pin(hit_keys))
        steps.append(lambda: arena.apply(got))
        if len(got.reused):  # arena rows have no readers but pinned copies
            steps.append(lambda: arena.begin_load(got.reused))
        steps.append(lambda: arena.pin(got.keys))
        steps.append(lambda: self.inflight.__setitem__(batch.id, batch))
        undo = self.rollback_steps(batch, batch.pool_slots, count=False)
        try:
            self.journal.run(*steps, undo=undo)
        except (KeyboardInterrupt, SystemExit):
            # Also after the section ended (Python 3.12 traces the `with` line again on
            # its exit): no caller will run this batch, so it gives everything back; the
            # section's own undo popped it from inflight already when it ran.
            with self.lock:
                if batch.id in self.inflight:
                    self.journal.run(*undo)
            raise
        return batch

    def abandon_planned(self, batch: LoadBatch | None = None) -> None:
        """A caller cut short (a Ctrl-C, an error) between planning a batch and running
        it: give back what the plan reserved. ``batch`` (or this thread's last plan, when
        the interrupt came before the caller even got it) is rolled back unless it was
        submitted (a run batch rolls itself back; a submitted pipelined one is settled by
        whoever needs its keys, or the result's orphan net)."""
        batch = batch if batch is not None else getattr(self._planned, "batch", None)
        self._planned.batch = None
        if batch is None or batch.ok:
            return
        with self.lock:
            if batch.id not in self.inflight:
                return
            load = batch.layer_load
            submitted = load.submitted.is_set() if load is not None else batch.completion_real
        if submitted:
            return
        if load is not None:
            load.submitted.set()
            load._fail(RuntimeError("the call that planned this batch was interrupted"))
        else:
            self._rollback(batch)

    # -- 2 + 3. run (lock released for the I/O) ------------------------------------------
    def run(self, batch: LoadBatch, defer_sources=None) -> None:
        """Read, copy and publish ``batch``; on error roll it back and raise (annotated)."""
        try:
            t0 = time.perf_counter()
            self.order_after_unpublish(batch)
            lengths = np.full(len(batch.keys), self.pack.slot_bytes, dtype=np.int64)
            sums = None if self.verifier is None else self.verifier.checksums(batch.keys, batch.offsets)
            batch.completion_real = True
            batch.completion = self.engine.submit(
                batch.offsets,
                lengths,
                batch.src,
                batch.dst,
                dst_device=bool(batch.to_pool and self.pool.is_cuda),
                checksums=sums,
            )
            batch.completion.wait()
            # a replaced or rewritten file: publish nothing (a touch: see check_unchanged)
            self.pack.check_unchanged(self.verifier is not None and self.verifier.hashes_every_read)
            steps = (
                self.pool_steps(batch, batch.pool_slots, batch.stream, batch.completion)
                if batch.to_pool
                else []
            )
            self.journal.run(*steps, *self.completion_steps(batch, time.perf_counter() - t0, defer_sources))
        except BaseException as exc:
            if batch.ok:  # published whole (a Ctrl-C inside it was rolled forward)
                raise
            err = batch.error = self._annotate(exc, batch)
            self._rollback(batch)  # ends with done set: a fire waiting on it goes on
            if err is exc:
                raise
            raise err from exc
        if defer_sources is None and not batch.sources_released:
            self.finish_sources(batch)  # the worker's own batches: it waits for the copies

    def pool_steps(self, batch: LoadBatch, slots: np.ndarray, stream, completion) -> list:
        """Publish ``slots`` of a landed pool batch as journal steps (store/interrupts.py):
        the stream waits on the copies, the slots commit, the table is written."""
        pool = self.pool

        def table():
            batch.publish_event = pool.write_owners(slots, stream)

        steps = [lambda: completion.stream_wait(stream)] if pool.is_cuda else []
        return steps + [lambda: pool.commit(slots), table]

    def completion_steps(self, batch: LoadBatch, seconds: float, defer_sources=None) -> list:
        """The end of a published batch as journal steps: arena rows commit, counters,
        ``ok``, the sources unpinned (CPU copies and arena-only reads are complete) or
        handed to ``defer_sources`` once, and ``done`` set (a waiter must never hang)."""
        arena = self.arena
        steps = [lambda: arena.commit(batch.arena_new)] if len(batch.arena_new) else []
        steps += [lambda: self._account(batch, seconds), lambda: self._finished(batch)]
        if not (batch.to_pool and self.pool.is_cuda):
            steps.append(lambda: self._unpin_sources(batch))
        steps.append(batch.done.set)
        if defer_sources is not None:
            steps.append(lambda: self._defer_once(batch, defer_sources))
        return steps

    def _defer_once(self, batch: LoadBatch, defer_sources) -> None:
        if not batch.sources_released and not batch.sources_deferred:
            batch.sources_deferred = _deferred_true(defer_sources, batch)

    def _finished(self, batch: LoadBatch) -> None:
        batch.ok = True
        self.inflight.pop(batch.id, None)

    def start_layers(self, batch: LoadBatch, defer_sources=None, group_bytes: int = 0):
        """Submit a planned pool batch layer by layer (or in groups of consecutive layers
        of at least ``group_bytes``) and return its LayerLoad at once
        (tierstore/store/pipeline.py); the caller publishes each layer with wait_layer.
        A fire builds the LayerLoad under the lock right after ``plan`` (``layer_load``),
        so no other fire ever sees the batch without it, then calls ``submit``."""
        load = batch.layer_load or self.layer_load(batch, defer_sources, group_bytes)
        load.submit()
        return load

    def layer_load(self, batch: LoadBatch, defer_sources=None, group_bytes: int = 0):
        """The LayerLoad of a planned pool batch, not yet submitted (no I/O)."""
        from tierstore.store.pipeline import LayerLoad

        return LayerLoad(self, batch, self.pack.n_experts, defer_sources, group_bytes)

    def order_after_unpublish(self, batch: LoadBatch) -> None:
        """Victims' slots may be overwritten only after their readers are done. On CUDA
        the engine's copy stream waits for the unpublish event on the device (every
        write into a pool slot is a copy on that stream), so the host never blocks;
        elsewhere there is no event. Then the reused slots go EVICTING -> LOADING."""
        event = batch.unpublish_event
        if event is not None:
            handle = getattr(self.engine, "copy_stream", 0)
            if handle and self.pool.is_cuda:
                self._copy_stream().wait_event(event)
            else:
                event.synchronize()
        if len(batch.reused):
            with self.lock:
                self.pool.begin_load(batch.reused)

    def _copy_stream(self):
        stream = getattr(self, "_copy_stream_obj", None)
        if stream is None:
            import torch

            stream = torch.cuda.ExternalStream(int(self.engine.copy_stream), device=self.pool.device)
            self._copy_stream_obj = stream
        return stream

    def finish_sources(self, batch: LoadBatch) -> None:
        """Wait for the batch's copies, then let its arena source rows be evicted."""
        if batch.sources_released:
            return
        try:
            batch.completion.synchronize()
        finally:
            with self.lock:
                self._unpin_sources(batch)

    # -- helpers -----------------------------------------------------------------------
    def _unpin_sources(self, batch: LoadBatch) -> None:
        if not batch.sources_released:  # the unpin and its flag: one statement (interrupts.py)
            batch.sources_released = _unpinned_true(self.arena, batch.arena_pinned)

    def _rollback(self, batch: LoadBatch) -> None:
        """Give back everything ``batch`` took and set its ``done`` (in the same section:
        another fire may be waiting on it; a failed run set ``error`` first)."""
        comp = batch.completion
        if comp is not None and self.pool.is_cuda:
            try:  # copies of rows that did succeed may still be landing in our slots
                comp.synchronize()
            except BaseException:
                pass
        self.journal.run(*self.rollback_steps(batch, batch.pool_slots), batch.done.set)

    def rollback_steps(self, batch: LoadBatch, pool_slots: np.ndarray, count=True) -> list:
        """Give back ``pool_slots`` and the batch's arena rows and source pins, as journal
        steps (every one safe to run again: interrupts.py)."""
        steps = []
        if len(pool_slots):
            steps.append(lambda: self.pool.rollback(pool_slots))
        if len(batch.arena_new):
            steps.append(lambda: self.arena.rollback(batch.arena_new))
        steps.append(lambda: self._unpin_sources(batch))
        if count:
            steps.append(lambda: self._count_failed(batch))
        steps.append(lambda: self.inflight.pop(batch.id, None))
        return steps

    def _count_failed(self, batch: LoadBatch) -> None:
        if not batch.failed_counted:  # the count and its flag: one statement
            batch.failed_counted = _counted(self.counters)

    def _annotate(self, exc: BaseException, batch: LoadBatch) -> BaseException:
        """A TierIOError naming the layer/expert whose read failed (offset -> row)."""
        if not isinstance(exc, TierIOError):
            return exc
        dense = exc.offset // self.pack.stride
        if not 0 <= dense < self.pack.n_layers * self.pack.n_experts:
            rows = getattr(batch.completion, "failed_rows", None)
            if rows is None or not len(rows):
                return exc
            dense = int(batch.keys[int(rows[0])])
        layer, expert = divmod(int(dense), self.pack.n_experts)
        out = TierIOError(exc.path, exc.offset, exc.errno or 5, what=f"layer {layer} expert {expert} read")
        detail = str(exc)
        if detail and detail not in str(out):  # keep the engine's own words (short read, ...)
            out.args = (out.errno, f"{out} [{detail}]")
        out.layer, out.expert = layer, expert
        return out

    def _account(self, batch: LoadBatch, seconds: float) -> None:
        """Counters of a published batch, once: every sum in one statement with its flag
        (a journal step run again after a Ctrl-C counts nothing twice)."""
        if batch.accounted:
            return
        c, nbytes = self.counters, self.pack.slot_bytes
        n_read = int(np.count_nonzero(batch.offsets >= 0)) * nbytes
        pool = (
            (batch.n_arena_hits * nbytes, len(batch.keys) * nbytes, seconds) if batch.to_pool else (0, 0, 0.0)
        )
        if c.layers is not None:  # metrics on: rows read per layer (one bincount a batch)
            c.layers.add_reads(batch.keys[batch.offsets >= 0])
        c.bytes_read, c.bytes_arena, c.bytes_to_pool, c.move_seconds, batch.accounted = (
            c.bytes_read + n_read,
            c.bytes_arena + pool[0],
            c.bytes_to_pool + pool[1],
            c.move_seconds + pool[2],
            True,
        )


def _unpinned_true(tier, keys): tier.unpin(keys); return True  # noqa: E702 - one statement: interrupts.py  # fmt: skip


def _counted(counters): counters.failed_reads += 1; return True  # noqa: E702 - one statement: interrupts.py  # fmt: skip


def _deferred_true(defer, batch): defer(batch); return True  # noqa: E702 - one statement: interrupts.py  # fmt: skip
