"""ExpertStore: the three tiers (VRAM pool, pinned RAM arena, pack on disk) as one store.

Calls and who makes them::

    record(layer, topk_ids)   forward thread, every MoE layer: heat only, no I/O
    fire(routed)              forward thread, on an uncertain step: synchronous promotion
    release(fire_result)      forward thread, when the re-run step is done
    step()                    forward thread, end of a decode step: lazy promotions, decay
    promote(keys) -> Ticket   any thread: asynchronous, the background worker does the I/O

Locking: ``store.lock`` (an RLock) guards the bookkeeping (slot state, the host mirror
of the slot table, pins, policies, counters). It is held for array work only: slots are
reserved under it, the reads happen with it released, and it is taken again to publish
or roll back (``tierstore.store.mover``). Nothing holding it reads the disk or waits.

Heat: ``record`` only queues the ids (store/recorder.py), folded at the next fire/step/stats.

Errors: bad keys raise ConfigError / FormatError (``tierstore.format.pack.Pack.check_keys``); a failed
read raises TierIOError naming the file, offset, layer and expert, after every slot the
batch took is back (nothing is published); use after close() raises ClosedError.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref

import numpy as np
import torch

import tierstore.store.sizing as sizing
from tierstore import process, settings
from tierstore.errors import ClosedError, ConfigError
from tierstore.format.pack import Pack
from tierstore.format.packlock import lock_for_reading
from tierstore.format.sidecar import lock_path_of
from tierstore.store.config import StoreConfig
from tierstore.store.inspection import Inspection
from tierstore.store.interrupts import Journal, OrphanPins
from tierstore.store.jobs import BackgroundJobs
from tierstore.store.keys import dense_keys
from tierstore.store.lifecycle import Lifecycle
from tierstore.store.mover import Mover
from tierstore.store.prefetch import StorePrefetch
from tierstore.store.recorder import RoutingRecorder
from tierstore.store.stats import Counters, FireResult, StoreStats
from tierstore.store.verify import RowVerifier
from tierstore.store.worker import Ticket, Worker

log = logging.getLogger("tierstore.store")


class ExpertStore(BackgroundJobs, Lifecycle, Inspection):
    """Expert rows of one pack in a VRAM pool + RAM arena (contract: README.md "Python API"
    and docs/INTERNALS.md).

    pack        a Pack (or a path for Pack.open); the store reads it through its engine
    vram_slots  pool slots; or vram_gb (GiB, or "auto" = free device memory minus
                reserve_gb); neither = "auto". Sized before the fire floor is checked.
    ram_gb      pinned arena in GiB of stride-sized rows (0 = none, "auto" = 1/4 pack)
    policy      pool policy name, or {"pool": spec, "arena": spec} (store/config.py)
    device      "cuda"/"cuda:N" (real VRAM pool) or "cpu" (pool in host memory)
    max_promote default cap on new promotions per fire (TIERSTORE_MAX_PROMOTE)
    top_k, n_spec, max_seqs (+ option gate_fp_max): when top_k is given the pool must
                hold fire_floor(...) slots: CapacityError, or a warning with force=True
    warm_start  a poolmon / pool-heat / arena-heat file preheated at construction
    **options   threads, direct, lazy_per_step, half_life, half_life_s, arena_policy,
                reserve_gb, max_gb, scan_keep, fire_rounds, latency_window, engine,
                stream, snapshot, snapshot_every_s, gate_fp_max (docs/SETTINGS.md), prefetch,
                quarantine (a row failing its checksum fails that load, is named once and
                is never loaded again: quarantined_keys(), stats().quarantined)

    Owns the pool and slot_table tensors (allocated once, never moved), the arena and,
    unless ``engine=`` was given, its engine. Thread safety: every method may be called
    from any thread; record/fire/release/step are meant for the forward thread.
    Errors: ConfigError (bad arguments, all reported together), CapacityError (sizing),
    FormatError (unwritten layer), TierIOError (reads), ClosedError (after close).
    """

    def __init__(
        self,
        pack,
        vram_slots=None,
        vram_gb=None,
        ram_gb=0.0,
        policy=None,
        device="cuda",
        max_promote=None,
        top_k=None,
        n_spec=0,
        max_seqs=1,
        force=False,
        warm_start=None,
        **options,
    ):
        if (
            warm_start is not None
            and not isinstance(warm_start, (str, os.PathLike))
            and type(warm_start).__name__ != "WarmFile"
        ):
            raise ConfigError(
                f"ExpertStore: warm_start must be a path (poolmon, pool-heat or "
                f"arena heat file), found {type(warm_start).__name__}"
            )
        self._owns_pack = isinstance(pack, (str, os.PathLike))
        if self._owns_pack:  # opened here, so closed by close() (its fd must not outlive us)
            pack = Pack.open(pack)
        self.pack, self._pack_lock = pack, -1
        try:  # LOCK_SH on the pack's .lock for our lifetime: no PackWriter rewrites under us
            self._pack_lock = lock_for_reading(pack.path, lock_path_of(pack.path))
            self._open_tiers(
                pack,
                vram_slots,
                vram_gb,
                ram_gb,
                policy,
                device,
                max_promote,
                top_k,
                n_spec,
                max_seqs,
                force,
                options,
            )
        except BaseException:
            self._drop_pack()
            raise
        cfg = self.config
        self.pool_policy, self.arena_policy = self._pool.policy, self._arena.policy
        self._stream = cfg.consumer_stream()
        self.verifier = RowVerifier(pack, cfg.verify)
        self._journal = Journal(self.lock)  # multi-table writes a Ctrl-C cut (interrupts.py)
        self._token = object()  # FireResult.owner: release() refuses another's
        self._mover = Mover(
            pack,
            self.engine,
            self._pool,
            self._arena,
            self.lock,
            self.counters,
            cfg.scan_keep,
            default_stream=self._stream,
            verifier=self.verifier,
            journal=self._journal,
        )
        self._recorder = RoutingRecorder(pack, self.counters, self.lock, self.device)
        self._fold = self._recorder._fold  # record()'s fast path (the native fold)
        self._seen = np.zeros(self._n_keys, dtype=bool)  # keys recorded since the last step
        self._prefill: FireResult | None = None
        self._orphans = OrphanPins()  # pins of fire results a Ctrl-C kept from their caller
        self._lazy_busy = False
        self._snapshot_path, self._last_snapshot = cfg.snapshot, time.monotonic()
        self._worker = Worker(self, "tierstore-store")  # promotions, unpins, snapshots
        self.prefetch = None if cfg.prefetch is None else StorePrefetch(self, cfg.prefetch)
        self._staged: list = []  # publish="step": key arrays read into arena rows
        self._pending_sources: list = []  # publish="step": batches whose sources step() frees
        self._warm_pending = warm_start if cfg.deferred else None
        process.track_store(self)  # closed at interpreter exit, refused in a fork()ed child
        if warm_start is not None and not cfg.deferred:
            self.preheat(warm_start)

    def _open_tiers(
        self,
        pack,
        vram_slots,
        vram_gb,
        ram_gb,
        policy,
        device,
        max_promote,
        top_k,
        n_spec,
        max_seqs,
        force,
        options,
    ) -> None:
        """Config, engine and the two tiers; on failure the engine is closed again."""
        cfg = StoreConfig.build(
            pack,
            vram_slots=vram_slots,
            vram_gb=vram_gb,
            ram_gb=ram_gb,
            policy=policy,
            device=device,
            max_promote=max_promote,
            top_k=top_k,
            n_spec=n_spec,
            max_seqs=max_seqs,
            force=force,
            options=options,
        )
        self.config = cfg
        self.device = cfg.device
        self.n_slots, self.slot_bytes = cfg.n_slots, int(pack.slot_bytes)
        self.max_promote = cfg.max_promote
        self._E, self._L = int(pack.n_experts), int(pack.n_layers)
        self._n_keys = self._E * self._L
        self._layer_written = np.ascontiguousarray(pack.written, dtype=bool)
        self._written = np.repeat(self._layer_written, self._E)
        self._quarantined = np.zeros(self._n_keys, dtype=bool)  # rows that failed their sum
        self.lock = threading.RLock()
        self._idle = threading.Condition(self.lock)
        self._active = weakref.WeakSet()  # tokens of the calls close() waits for (lifecycle.py)
        self._closed = self._close_done = False
        self.step_count = 0
        from tierstore import settings

        # metrics on: per-layer counts (stats.LayerCounters) from the first fold on
        self.counters = Counters(cfg.latency_window, *((self._L, self._E) if settings.get("metrics") else ()))
        self.engine, self._owns_engine = cfg.open_engine(pack)
        try:
            pack.check_unchanged()  # the engine opened the path: still the validated file?
            self._pool, self._arena = cfg.allocate_tiers(pack, self.engine)
        except BaseException:
            if self._owns_engine:
                self.engine.close()
            raise

    # -- views -------------------------------------------------------------------------
    @property
    def pool(self) -> torch.Tensor:
        return self._pool.pool

    @property
    def slot_table(self) -> torch.Tensor:
        return self._pool.slot_table

    @property
    def n_arena_rows(self) -> int:
        return self._arena.n_slots

    @property
    def arena(self):
        return self._arena

    @property
    def closed(self) -> bool:
        return self._closed

    def resident_keys(self, tier: str = "pool") -> np.ndarray:
        """int64 [N, 2] (layer, expert) of the tier's resident rows, hottest first (per
        slot, pins and loads: ``tier(name)``, store/inspection.py)."""
        states = {"pool": self._pool, "arena": self._arena}.get(tier)
        if states is None:
            raise ConfigError(f"resident_keys: tier must be 'pool' or 'arena', found {tier!r}")
        with self.lock:
            dense = states.resident_keys()
        return np.stack([dense // self._E, dense % self._E], axis=1)

    # -- deferred sizing -----------------------------------------------------------------
    @property
    def sized(self) -> bool:
        """False only for a ``vram_slots="deferred"`` store before ``finalize``."""
        return not self.config.deferred or self._pool.allocated

    def finalize(self, n_slots="auto", *, free_bytes: int | None = None) -> int:
        """Size a ``vram_slots="deferred"`` pool, once: an int, or ``"auto"`` = free
        device memory (``free_bytes``, default what the driver says now) minus the
        ``reserve_gb`` option, capped by ``max_gb`` and by the pack's rows. The slot
        table is the one that existed since construction (graphs captured before keep
        it); the pool tensor is allocated here and never again. With ``top_k`` given the
        fire floor is checked first: CapacityError (nothing allocated), or a warning with
        ``force=True``. 0 slots (auto with no room) leaves the store inert: every fire
        promotes nothing. A ``warm_start`` file is preheated now. Returns the slots."""
        from tierstore.errors import CapacityError

        cfg = self.config
        with self.lock:
            self._check_open("finalize")
            if not cfg.deferred or self._pool.allocated:
                raise ConfigError(
                    f"{self.pack.path}: finalize(): the pool is already sized "
                    f"({self.n_slots} slots); only a vram_slots='deferred' store "
                    f"is finalized, once"
                )
            n_keys, slot_bytes = self._n_keys, self.slot_bytes
            where = f"{self.pack.path}: finalize(): "
            n_slots = settings.argument(where + "n_slots", n_slots, _SLOTS_OR_AUTO, (settings.AUTO,))
            avail = (
                sizing.device_available_bytes(self.device)
                if free_bytes is None
                else settings.argument(where + "free_bytes", free_bytes, _BYTES)
            )
            if n_slots == settings.AUTO:
                n = sizing.auto_slots(
                    slot_bytes=slot_bytes,
                    n_keys=n_keys,
                    available=avail,
                    reserve_gb=cfg.reserve_gb,
                    max_gb=cfg.max_gb,
                )
            else:
                n = min(n_slots, n_keys)
                if n * slot_bytes > avail:
                    raise CapacityError(
                        f"{self.pack.path}: finalize({n_slots}): {n} slots x "
                        f"{slot_bytes} bytes need {n * slot_bytes / 2**30:.2f} "
                        f"GiB but {self.device} has {avail / 2**30:.2f} GiB free"
                    )
            if cfg.floor is not None:
                sizing.check_floor(n, cfg.floor, slot_bytes=slot_bytes, force=cfg.force, what=cfg.floor_what)
            policy = cfg.pool_policy_for(self.pack, n)
            self._pool.allocate(n, policy)
            if n:
                self.engine.register_buffer(self._pool.pool)
            self.n_slots, self.pool_policy = n, policy
        warm, self._warm_pending = self._warm_pending, None
        if warm is not None and n:
            self.preheat(warm)
        return n

    # -- record ------------------------------------------------------------------------
    def record(self, layer: int, topk_ids) -> None:
        """Routing of one MoE layer was observed. Heat only: no I/O, no lock, no host
        sync. See ``tierstore.store.recorder`` for what happens to the ids."""
        if self._closed:
            raise ClosedError(f"{self.pack.path}: record() on a closed store")
        if self.prefetch is not None:  # prefetch=: record, then the hook (store/prefetch.py)
            return self.prefetch.record(layer, topk_ids)
        if self._fold is not None and type(topk_ids) is np.ndarray:
            try:  # the common case in one native call; the fold checks the layer too
                return self._fold.add(layer, topk_ids)
            except (TypeError, IndexError):
                pass  # the recorder converts the ids or raises the ConfigError
        self._recorder.record(layer, topk_ids)

    def record_counts(self, counts) -> None:
        """Routing observed as a table: ``counts`` int [n_layers, n_experts] (or flat) of
        tokens routed to each expert since the last call (an engine's "seen" table copied
        to the host). Heat only, like ``record``; one call for every layer."""
        table = np.asarray(counts)
        if table.size != self._n_keys or table.dtype.kind not in "iub":
            raise ConfigError(
                f"{self.pack.path}: record_counts: counts must be an int table "
                f"of {self._L} x {self._E}, found {table.dtype} {list(table.shape)}"
            )
        flat = np.ascontiguousarray(table.reshape(-1), dtype=np.int64)
        if np.any(flat < 0):
            raise ConfigError(
                f"{self.pack.path}: record_counts: negative count at key {int(np.flatnonzero(flat < 0)[0])}"
            )
        with self.lock:
            self._check_open("record_counts")
            self._fold.add_counts(flat)

    def _fold_records(self) -> None:
        """Fold queued routing into hit counters and both policies (caller holds the lock).
        One native call gives the keys, counts and hit split (store/recorder.py); then
        each policy gets one on_access with the counts as weights."""
        taken = self._recorder.take(
            self._stream, self._pool.resident_slot, self._arena.resident_slot, self._seen
        )
        if taken is None:
            return
        keys, weights, tally = taken
        self.counters.add_tally(tally)
        if self.counters.layers is not None:
            self.counters.layers.add_fold(keys, weights, self._pool.resident_slot, self._arena.resident_slot)
        if not getattr(self._pool.policy, "counts_fires", False):  # need: fires only (fire.py)
            self._pool.policy.on_access(keys, weights=weights)
        self._arena.policy.on_access(keys, weights=weights)

    # -- fire / release ------------------------------------------------------------------
    def fire(self, routed, max_promote=None, stream=None, pipelined=False) -> FireResult:
        """Make every routed (layer, expert) resident (at most ``max_promote`` new ones,
        hottest first, no admission control) and pin them until ``release``. Returns
        once the reads are done and the copies and table writes are ordered on
        ``stream`` (default: the store's consumer stream). ``pipelined``: returns once
        the reads are queued; call ``result.wait_layer(l)`` before enqueueing layer l
        (an int: least bytes per engine submission, consecutive layers grouped)."""
        cap = (
            self.max_promote
            if max_promote is None
            else settings.argument(f"{self.pack.path}: fire: max_promote", max_promote, settings.count)
        )
        return self._fire(self._dense(routed), cap, stream, scan=False, pipelined=pipelined)

    def ensure_resident(self, layer: int, topk_ids, stream=None) -> FireResult:
        """Prefill: make one layer's routed experts resident as a scan (fills free
        slots, never evicts the hot share ``scan_keep``), pinned until the next
        ensure_resident or step()."""
        layer = settings.argument(
            f"{self.pack.path}: ensure_resident: layer", layer, settings.integer(0, self._L - 1)
        )
        ids = np.asarray(topk_ids.cpu() if isinstance(topk_ids, torch.Tensor) else topk_ids)
        if ids.size and ids.dtype.kind not in "iu":
            raise ConfigError(
                f"{self.pack.path}: ensure_resident: topk_ids must be an int "
                f"array or tensor, found {type(topk_ids).__name__} of {ids.dtype}"
            )
        ids = np.unique(ids.reshape(-1))
        ids = ids[ids >= 0]
        keys = self._dense(np.stack([np.full(len(ids), layer), ids], axis=1))
        self._release_prefill()  # a result cut off from both (a Ctrl-C): the orphan net
        result = self._fire(keys, self.n_slots, stream, scan=True)
        with self.lock:  # swap atomically: a concurrent prefill's pins are released, not lost
            old, self._prefill = self._prefill, result
            if old is not None and not old.released:
                self.release(old)
        return result

    def release(self, fire_result: FireResult) -> None:
        """Unpin what ``fire_result`` pinned (a pipelined fire's unpublished layers are
        published first). Releasing twice is a ConfigError."""
        from tierstore.store.fire import release_fire

        release_fire(self, fire_result)

    def _release_prefill(self) -> None:
        with self.lock:
            old, self._prefill = self._prefill, None
            if old is not None and not old.released:
                self.release(old)

    def _fire(self, keys: np.ndarray, cap: int, stream, scan: bool, pipelined=False) -> FireResult:
        from tierstore.store.fire import counted_fire  # the fire's rounds, kept in their own module

        self._pool.check_host_owned(f"{self.pack.path}: fire")
        return counted_fire(self, keys, cap, self._resolve_stream(stream), scan, pipelined)

    # -- device-side residency ------------------------------------------------------------
    def device_residency(
        self,
        *,
        max_ids: int,
        slots: int | None = None,
        gather_blocks: int = 0,
        chunk_bytes: int | None = None,
        heat: bool = True,
    ):
        """Hand the pool to the device: a ``DeviceResidency`` (store/residency.py) whose
        ``page_in(layer, topk_ids)`` makes a layer's routed experts resident on the current
        stream with no host sync (capturable in a CUDA graph; on a CPU pool it runs at
        once). Until its ``close()`` the store refuses fires, pool promotions and evictions.
        ``max_ids``: most routed ids per page_in (T x top_k)."""
        from tierstore.store.residency import DeviceResidency

        return DeviceResidency(
            self,
            max_ids=max_ids,
            slots=slots,
            gather_blocks=gather_blocks,
            chunk_bytes=chunk_bytes,
            heat=heat,
        )

    # -- promote / load_arena / evict -----------------------------------------------------
    def load_arena(self, keys) -> int:
        """Read ``keys`` into arena rows (no pool copy), synchronously; rows loaded."""
        dense = self._dense(keys)
        with self._activity("load_arena"):
            try:
                with self.lock:
                    batch = self._mover.plan(dense, to_pool=False, stream=self._stream)
                if batch is None:
                    return 0
                self._mover.run(batch)
            except BaseException:
                self._mover.abandon_planned()  # planned, never run (a Ctrl-C): given back
                raise
            return len(batch.keys)

    def evict(self, keys) -> int:
        """Evict resident, unpinned ``keys`` from the pool; returns how many left."""
        dense = self._dense(keys)
        with self._activity("evict"):
            with self.lock:
                gone, slots = self._pool.evict(dense)
                event = self._pool.unpublish(gone, self._stream)
            if event is not None:
                event.synchronize()
            with self.lock:
                self._pool.finish_evict(slots)
            return len(gone)

    # -- step / stats ----------------------------------------------------------------------
    @property
    def publish_pending(self) -> bool:
        """publish="step": rows the worker read wait for the next step() to publish them
        (an engine that folds its routing a step late folds it now, so that step() spares
        the experts this step routed)."""
        return bool(self._staged)

    def step(self, stream=None, publish: bool = True) -> None:
        """End of a decode step: fold heat, decay, queue lazy promotions (at most
        ``lazy_per_step``, hottest first, through the admission filter), snapshots.

        ``publish="step"``: the promotions the worker read into arena rows since the last
        step are copied up and published here, on ``stream`` (default the store's), from
        this thread, with no victim among the keys recorded this step; the worker only
        reserves arena rows and reads (no CUDA call, nothing published), so nothing
        changes in the pool between a step's forward and its replay. ``publish=False``
        leaves the staged rows for a later step (the caller has not recorded this step's
        routing yet: victims could not spare it)."""
        self._journal.drain()
        self._orphans.drain(self.lock, self._pool)
        step_mode = self.config.publish == "step"
        with self.lock:
            self._check_open("step")
            self._fold_records()
            if self._prefill is not None:
                self._release_prefill()
            self._pool.policy.decay(steps=1)
            self._arena.policy.decay(steps=1)
            self.step_count += 1
            if step_mode:
                routed = self._seen.copy()
            else:
                self._queue_lazy("promote")
                self._seen.fill(False)
            self._queue_snapshot()
        if not step_mode:
            return
        pending = self._pending_sources
        while pending:  # copies of a step ago: long done, a cheap event wait;
            self._mover.finish_sources(pending[-1])  # idempotent, so dropped only once
            pending.pop()  # done (a Ctrl-C between: done again)
        if publish:
            self._publish_staged(routed, self._resolve_stream(stream))
        with self.lock:
            self._queue_lazy("stage")
            self._seen.fill(False)

    def publish(self, stream=None) -> int:
        """publish="step": publish now what the worker has read since the last step, on
        ``stream``, from this thread, sparing the keys recorded since the last step. For an
        engine whose step boundary comes before its forward (vLLM-Moet's
        ``wait_manager_idle``); never call it between a forward and its replay. Returns
        the keys published (0 in the "async" mode, where the worker publishes)."""
        if self.config.publish != "step":
            return 0
        self._journal.drain()
        with self.lock:
            self._check_open("publish")
            routed = self._seen.copy()
        before = self._pool.admissions
        self._publish_staged(routed, self._resolve_stream(stream))
        return int(self._pool.admissions - before)

    def _queue_lazy(self, kind: str) -> None:
        """Queue this step's lazy promotions as a worker job of ``kind`` (lock held)."""
        if (
            not self.config.lazy_per_step
            or self._lazy_busy
            or not self.sized
            or self._pool.device_owner is not None
        ):  # the device keeps the pool
            return
        from tierstore.store.fire import lazy_candidates

        keys, rejected = lazy_candidates(self, np.flatnonzero(self._seen))
        self.counters.lazy_rejected += rejected
        if len(keys):
            self._lazy_busy = True
            self.counters.lazy_queued += len(keys)
            self._submit_job((kind, keys, Ticket(len(keys)), True))

    def _queue_snapshot(self) -> None:
        cfg = self.config
        if (
            self._snapshot_path
            and cfg.snapshot_every_s
            and (time.monotonic() - self._last_snapshot >= cfg.snapshot_every_s)
        ):
            self._last_snapshot = time.monotonic()
            self._submit_job(("snapshot", self._snapshot_path))

    def _publish_staged(self, routed: np.ndarray, stream) -> None:
        """publish="step": copy the staged keys (still in their pinned arena rows) into
        the pool and publish them on ``stream`` (arena -> pool copies only: no disk I/O
        here), hottest first, sparing ``routed`` (bool [n_keys]) as victims. A failure is
        logged: serving goes on. The staged rows are taken and their stage pins dropped
        whatever happens (a Ctrl-C included: the take is one statement, the unpin a
        journal step)."""
        pinned = _EMPTY_KEYS
        try:
            with self.lock:
                pinned, self._staged = _joined(self._staged), []
            if not len(pinned):
                return
            keys = np.unique(pinned)
            batch = None
            with self.lock:
                pool = self._pool
                keys = keys[pool.slot_of[keys] < 0]
                if len(keys):
                    batch = self._mover.plan(
                        pool.policy.rank(keys), to_pool=True, stream=stream, spare=routed
                    )
            if batch is not None:
                self._mover.run(batch, defer_sources=self._defer_sources)
        except (KeyboardInterrupt, SystemExit):
            self._mover.abandon_planned()  # planned, never run: given back
            raise
        except Exception as exc:  # noqa: BLE001 - a background promotion must not stop serving
            log.warning("%s: publishing %d staged promotions failed: %s", self.pack.path, len(pinned), exc)
        finally:
            if len(pinned):
                self._journal.run(lambda: self._arena.unpin(pinned))

    def quarantined_keys(self) -> np.ndarray:
        """(layer, expert) pairs whose rows failed their checksum when read: never loaded
        again (a fire leaves them out, so an engine serves its fallback); int64 [n, 2]."""
        with self.lock:
            keys = np.flatnonzero(self._quarantined)
        return np.stack(np.divmod(keys, self._E), axis=1).astype(np.int64)

    def stats(self, fold: bool = True) -> StoreStats:
        """Counters now. ``fold=False`` reads them as they stand, without folding the
        routing recorded since the last fire/step (no CUDA call, nothing changes: safe from
        a metrics thread while an engine captures graphs); hit counts then lag one step."""
        if not fold:
            with self.lock:
                self._check_open("stats")
                engine_stats = self.engine.stats() if hasattr(self.engine, "stats") else None
                return self.counters.snapshot(self._pool, self._arena, self.step_count, engine_stats)
        self._journal.drain()
        with self.lock:
            self._check_open("stats")
            self._orphans.drain(self.lock, self._pool, settle=False)
            self._fold_records()
            snap_args = (self._pool, self._arena, self.step_count)
            engine_stats = self.engine.stats() if hasattr(self.engine, "stats") else None
            return self.counters.snapshot(*snap_args, engine_stats)

    def check_invariants(self, idle: bool = False) -> None:
        """AssertionError when tier bookkeeping, policies and the device slot table
        disagree (a host sync on CUDA; tests and debugging). ``idle``: also that nothing
        is held or in flight (no pin, no counted call, no batch, no half-written section,
        no dropped result waiting): what every call leaves once it and its releases ended."""
        with self.lock:
            self._pool.check_invariants(device=True)
            self._arena.check_invariants()
            self._pool.policy.check_invariants()
            self._arena.policy.check_invariants()
            if idle:
                staged = np.zeros(self._n_keys, np.int32)  # publish="step": rows read, held
                for keys in self._staged:  # in the arena for the next step
                    np.add.at(staged, keys, 1)
                for tier, own in ((self._pool, 0), (self._arena, staged)):
                    held = np.flatnonzero(tier.key_pins - own)
                    assert not len(held), f"{tier.tier}: key {int(held[0])} still pinned"
                assert not self._active, f"{len(self._active)} call(s) still counted active"
                assert not self._mover.inflight, f"{len(self._mover.inflight)} batch(es) in flight"
                assert not self._lazy_busy, "a lazy promotion never finished its ticket"
                assert not self._journal.open, "a section was left half written"

    # -- warm start ---------------------------------------------------------------------------
    def save_poolmon(self, path):
        from tierstore import warm as warmstart

        return warmstart.save_poolmon(self, path)

    def preheat(self, src, pool_fill: float = 0.9, progress=None):
        from tierstore import warm as warmstart

        return warmstart.preheat(self, src, pool_fill=pool_fill, progress=progress)

    def __repr__(self) -> str:
        return (
            f"ExpertStore({self.pack.path!r}, device={self.device}, {self.n_slots} slots, "
            f"{self.n_arena_rows} arena rows{', closed' if self._closed else ''})"
        )

    # -- internals --------------------------------------------------------------------------------
    def _dense(self, keys) -> np.ndarray:
        """Unique dense ids of (layer, expert) pairs, first-seen order; validated by the pack."""
        return dense_keys(keys, self.pack, self._L, self._E, self._layer_written)

    def _resolve_stream(self, stream):
        return self._stream if stream is None else stream


_EMPTY_KEYS = np.empty(0, dtype=np.int64)
_SLOTS_OR_AUTO = sizing.or_auto(settings.count)  # finalize(n_slots)
_BYTES = settings.integer(0, 1 << 62)  # finalize(free_bytes)


def _joined(staged: list) -> np.ndarray:
    """The staged key arrays as one (each key once per stage pin)."""
    return np.concatenate(staged) if staged else _EMPTY_KEYS
