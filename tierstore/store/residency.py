"""Device-side residency: the GPU keeps the slot pool by itself, with no host sync per layer.

``store.device_residency(max_ids=...)`` hands the pool to a ``DeviceResidency``. While it
is attached, for every MoE layer the forward calls ``page_in(layer, topk_ids)`` on its
stream, before the MoE kernel: a one-warp *decide* kernel looks the routed experts up in
the slot table, counts their heat, picks a victim slot for each miss by a CLOCK sweep
(never a key routed in the same decide) and unpublishes it; a *page-in* kernel then
copies each missing row from the pinned RAM arena into its slot with every SM reading
host memory over UVA, and its last block publishes the new slot-table entries. Both
launches have fixed arguments and read their data-dependent parts (which rows, how
many) on the device, so the whole decode step -- attention, decide, page-in, MoE -- is
captured in one CUDA graph. Why an SM gather and not the copy engine: a graph's memcpy
node has its source fixed at capture, and the rows are known only on the device.

The rule and the state (slot owners, CLOCK reference bits, decide stamps, the hand, the
arena-row map, a plan, counters) are ``csrc/store/include/tierstore/store/residency.hpp``;
the host spelling runs a CPU pool (``device="cpu"``: the same calls, done at once) and
the CUDA kernels (csrc/kernels/src/residency.cu) match it decision for decision.

The host keeps the rest: the arena's contents (``refill`` reads keys from the pack into
arena rows ahead of need and maps them for the device; a row the device may read is never
overwritten before the device stopped mapping it), the heat (``fold_heat`` hands the
device's counts to the store's policies: one sync, once per many steps), and every
policy richer than CLOCK. While attached the store refuses host-side pool changes
(fire, promote into the pool, evict, lazy promotions); ``close()`` reads the slot owners
back and the store's host bookkeeping takes them over again.

A miss whose key has no arena row is not placed (counted ``no_arena``): the MoE kernel
then serves it from the base tier, as for any expert not in the pool.

Thread safety: page_in, fold_heat and reset belong to the forward thread; refill may run
on another thread (it takes the store lock for its bookkeeping and waits only for the
device work queued before it).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from tierstore.errors import ConfigError

CTRL_NAMES = {
    "hand": 0,
    "epoch": 1,
    "plan_len": 2,
    "decides": 4,
    "routed": 5,
    "hits": 6,
    "misses": 7,
    "placed": 8,
    "no_arena": 9,
    "no_slot": 10,
    "evicted": 11,
    "bytes": 12,
}
COUNTERS = ("decides", "routed", "hits", "misses", "placed", "no_arena", "no_slot", "evicted", "bytes")
_EMPTY = np.empty(0, dtype=np.int64)
LOCKED = -1  # a slot's stamp as int32: 0xFFFFFFFF, never a victim (ResidencyLocked)


class ResidencyState:
    """The arrays of one residency (``residency.hpp``'s view), on one device, allocated
    once (CUDA graphs capture their addresses), and the native view over them. Used by
    DeviceResidency (the pool's device) and by the host-planned baseline of
    ``tierstore bench decode`` (a host mirror)."""

    def __init__(
        self,
        *,
        n_layers: int,
        n_experts: int,
        n_slots: int,
        slot_bytes: int,
        max_ids: int,
        device,
        table: torch.Tensor,
        pool_ptr: int,
        arena_ptr: int,
        arena_rows: int,
        arena_stride: int,
        heat: bool = True,
        pin: bool = False,
    ):
        from tierstore import _C

        dev = torch.device(device)
        n_keys = n_layers * n_experts

        def new(n, dtype, fill=0):
            t = torch.full((max(int(n), 1),), fill, dtype=dtype, device=dev)
            return t.pin_memory() if pin and dev.type == "cpu" else t

        self.device, self.n_slots, self.max_ids = dev, int(n_slots), int(max_ids)
        self.table = table
        self.owner = new(n_slots, torch.int32, -1)
        self.stamp = new(n_slots, torch.int32)  # uint32 to the kernels
        self.ref = new(n_slots, torch.uint8)
        self.arena_row = new(n_keys, torch.int32, -1)
        self.first = new(n_experts, torch.int32)
        self.heat = new(n_keys, torch.int32) if heat else None
        self.ctrl = new(_C.RESIDENCY_CTRL_WORDS, torch.int64)
        self.plan = new(2 * max(self.max_ids, 1), torch.int32, -1)
        self.view = _C.ResidencyView(
            table=table.data_ptr(),
            pool=int(pool_ptr),
            n_slots=int(n_slots),
            slot_bytes=int(slot_bytes),
            n_layers=int(n_layers),
            n_experts=int(n_experts),
            owner=self.owner.data_ptr(),
            stamp=self.stamp.data_ptr(),
            ref=self.ref.data_ptr(),
            arena_row=self.arena_row.data_ptr(),
            first=self.first.data_ptr(),
            heat=0 if self.heat is None else self.heat.data_ptr(),
            ctrl=self.ctrl.data_ptr(),
            plan=self.plan.data_ptr(),
            max_plan=self.max_ids,
            arena=int(arena_ptr),
            arena_rows=int(arena_rows),
            arena_stride=int(arena_stride),
        )

    def clear(self) -> None:
        """Every slot free, counters and CLOCK state zero (stream-ordered on a device).
        The caller unpublishes the slot table's entries."""
        self.owner.fill_(-1)
        self.stamp.fill_(0)
        self.ref.fill_(0)
        self.ctrl.zero_()
        if self.heat is not None:
            self.heat.zero_()

    def counters(self) -> dict:
        """The cumulative counters (a host sync on a device)."""
        c = self.ctrl.cpu().numpy()
        return {name: int(c[CTRL_NAMES[name]]) for name in COUNTERS}

    def decide_host(self, layer: int, ids: torch.Tensor) -> None:
        """The decide on host memory: ``ids`` int32, contiguous, on the CPU."""
        self.view.decide_host(int(layer), ids.data_ptr(), ids.numel())


class DeviceResidency:
    """The pool of ``store`` kept on its device (see the module docstring).

    max_ids       most routed ids one ``page_in`` takes (T x top_k of the largest batch;
                  at least n_experts is kept)
    slots         use only the first ``slots`` pool slots (default all; benchmarks size
                  several pools on one store)
    gather_blocks page-in blocks (0 = 2 per multiprocessor); chunk_bytes bytes per block
                  work item (a multiple of 4096)
    heat          count routed ids on the device for ``fold_heat``

    Requires a sized store whose pool is idle (nothing pinned or in flight); the rows
    resident in it stay resident. Errors: ConfigError (bad arguments, a busy pool).
    """

    def __init__(
        self,
        store,
        *,
        max_ids: int,
        slots: int | None = None,
        gather_blocks: int = 0,
        chunk_bytes: int | None = None,
        heat: bool = True,
    ):
        from tierstore import _C

        self.store = store
        pool = store._pool
        n_slots = store.n_slots if slots is None else slots
        problems = []
        if isinstance(max_ids, bool) or not isinstance(max_ids, (int, np.integer)) or max_ids < 1:
            problems.append(f"max_ids must be an int >= 1, found {max_ids!r}")
        if (
            isinstance(n_slots, bool)
            or not isinstance(n_slots, (int, np.integer))
            or not 0 <= n_slots <= store.n_slots
        ):
            problems.append(f"slots must be an int in [0, {store.n_slots}], found {slots!r}")
        if not store.sized:
            problems.append("the store's pool is not sized yet (finalize() first)")
        chunk = int(getattr(_C, "RESIDENCY_CHUNK_BYTES", 65536) if chunk_bytes is None else chunk_bytes)
        if chunk < 4096 or chunk % 4096:
            problems.append(f"chunk_bytes must be a positive multiple of 4096, found {chunk_bytes!r}")
        if problems:
            raise ConfigError(f"{store.pack.path}: device_residency: " + "; ".join(problems))
        self.cuda = pool.is_cuda
        # at least a layer's every expert, so a preload (or a prefill layer) fits one call
        self.n_slots, self.max_ids = int(n_slots), max(int(max_ids), int(store._E))
        self.gather_blocks, self.chunk_bytes = int(gather_blocks), chunk
        self._index = (
            pool.device.index
            if pool.device.index is not None
            else (torch.cuda.current_device() if self.cuda else -1)
        )
        arena = store._arena
        arena_ptr = 0
        if arena.n_slots:
            arena_ptr = arena.rows.data_ptr()
            if self.cuda:
                arena_ptr = _C.host_device_pointer(arena_ptr)
        with store.lock:
            store._check_open("device_residency")
            if pool.device_owner is not None:
                raise ConfigError(f"{store.pack.path}: device_residency: the pool already has one")
            busy = (pool.state != 0) & (pool.state != 2)  # LOADING / EVICTING
            if busy.any() or np.any(pool.key_pins) or store._mover.inflight:
                raise ConfigError(
                    f"{store.pack.path}: device_residency: the pool is busy (a "
                    f"fire or promotion in flight, or keys pinned); release first"
                )
            self.state = ResidencyState(
                n_layers=store._L,
                n_experts=store._E,
                n_slots=self.n_slots,
                slot_bytes=store.slot_bytes,
                max_ids=self.max_ids,
                device=pool.device,
                table=pool.slot_table,
                pool_ptr=pool.pool.data_ptr(),
                arena_ptr=arena_ptr,
                arena_rows=arena.n_slots,
                arena_stride=arena.stride,
                heat=heat,
            )
            owners = np.full(self.n_slots, -1, dtype=np.int32)
            held = np.flatnonzero(pool.state[: self.n_slots] == 2)
            owners[held] = pool.owner[held]
            outside = np.flatnonzero(pool.state[self.n_slots :] == 2) + self.n_slots
            gone = _EMPTY
            if len(outside):  # rows past the slots kept here leave the pool
                gone, gone_slots = pool.evict(pool.owner[outside].copy())
                pool.finish_evict(gone_slots)
            pool.device_owner = self
        event = pool.unpublish(gone, store._stream) if len(gone) else None
        if event is not None:
            event.synchronize()
        # Rows resident before stay; they start referenced and the hand at the first free
        # slot, so the free slots fill before any of them is a victim.
        self.state.owner.copy_(torch.from_numpy(owners))
        self.state.ref.copy_(torch.from_numpy((owners >= 0).astype(np.uint8)))
        free = np.flatnonzero(owners < 0)
        self.state.ctrl[0] = int(free[0]) if len(free) else 0
        # The forward's stream (current now): the arena map, reset and refill are ordered on
        # it; page_in goes on whatever stream is current when it is called.
        self._stream = torch.cuda.current_stream(pool.device) if self.cuda else None
        self.push_arena_map()
        if self.cuda:
            _C.residency_prepare(self._index)
        self.closed = False

    # -- the forward path ------------------------------------------------------------------
    def page_in(self, layer: int, topk_ids: torch.Tensor, *, gather: bool = True) -> None:
        """Make ``layer``'s routed experts (``topk_ids``: int32, contiguous, on the pool's
        device; any shape of at most ``max_ids`` ids) resident before the next kernel on
        the current stream reads the slot table. No host sync; capturable in a CUDA graph.
        ``gather=False`` decides only (``gather()`` pages the plan in later)."""
        ids = topk_ids
        if ids.dtype != torch.int32 or not ids.is_contiguous() or ids.device != self.state.device:
            ids = ids.to(self.state.device, torch.int32).contiguous()
        n = ids.numel()
        if n > self.max_ids:
            raise ConfigError(f"page_in: {n} ids, this residency takes at most max_ids={self.max_ids}")
        if self.cuda:
            from tierstore import _C

            _C.residency_page_in(
                self.state.view,
                int(layer),
                ids.data_ptr(),
                n,
                gather,
                self.gather_blocks,
                self.chunk_bytes,
                self._index,
                torch.cuda.current_stream(self.state.device).cuda_stream,
            )
        else:
            self.state.decide_host(layer, ids)
            if gather:
                self.state.view.gather_host()

    def gather(self) -> None:
        """The page-in of the last decide (launched with ``gather=False``)."""
        if self.cuda:
            from tierstore import _C

            _C.residency_gather(
                self.state.view,
                self.gather_blocks,
                self.chunk_bytes,
                self._index,
                torch.cuda.current_stream(self.state.device).cuda_stream,
            )
        else:
            self.state.view.gather_host()

    # -- the host's part --------------------------------------------------------------------
    def fold_heat(self) -> int:
        """Hand the routed counts the device gathered since the last fold to the store's
        policies (``record_counts``); one host sync. Returns the ids folded."""
        heat = self.state.heat
        if heat is None:
            return 0
        counts = heat.cpu().numpy().astype(np.int64)
        heat.zero_()
        total = int(counts.sum())
        if total:
            self.store.record_counts(counts)
        return total

    def push_arena_map(self, exclude: np.ndarray | None = None) -> None:
        """Copy the arena's resident rows (less ``exclude``, dense keys) to the device map,
        ordered on the store's stream."""
        arena = self.store._arena
        with self.store.lock:
            rows = arena.resident_slot.astype(np.int32, copy=True)
        if exclude is not None and len(exclude):
            rows[exclude] = -1
        host = torch.from_numpy(rows)
        if self.cuda:
            with torch.cuda.stream(self._stream):
                self.state.arena_row.copy_(host.pin_memory(), non_blocking=True)
        else:
            self.state.arena_row.copy_(host)

    def refill(self, keys) -> int:
        """Read ``keys`` ((layer, expert) pairs or an int tensor [N, 2]) from the pack into
        arena rows and map them for the device, ahead of need. Arena rows it evicts are
        unmapped on the device first and overwritten only once the device work queued
        before has finished. Returns the rows read."""
        store = self.store
        dense = store._dense(keys)
        mover = store._mover
        with store._activity("refill"):
            try:
                with store.lock:
                    batch = mover.plan(dense, to_pool=False, stream=self._stream)
                if batch is None:
                    return 0
                # the victims left RESIDENT in the host arena: unmap, then wait for the
                # device work queued before (it may still read their rows)
                self.push_arena_map()
                if self.cuda:
                    event = torch.cuda.Event()
                    event.record(self._stream)
                    event.synchronize()
                mover.run(batch)
            except BaseException:
                mover.abandon_planned()
                raise
        self.push_arena_map()
        return len(batch.keys)

    def lock_keys(self, keys) -> int:
        """Pin ``keys`` (resident in this residency's slots) for good: their slots are never
        chosen as victims (a static hot set). Returns the slots locked. Host sync."""
        dense = self.store._dense(keys)
        slots = self.state.table.view(-1)[torch.as_tensor(dense, device=self.state.device)]
        slots = slots[slots >= 0].long()
        self.state.stamp[slots] = LOCKED
        return int(slots.numel())

    def reset(self) -> None:
        """Empty the pool (every entry of the slot table unpublished), CLOCK state and
        counters zeroed; stream-ordered, no host sync."""
        ctx = torch.cuda.stream(self._stream) if self.cuda else contextlib.nullcontext()
        with ctx:  # every published entry is one of this residency's slots (attach evicted
            self.state.table.fill_(-1)  # the rest)
            self.state.clear()

    def counters(self) -> dict:
        """Cumulative decide counters (hits, misses, placed, bytes...; a host sync)."""
        return self.state.counters()

    def check(self) -> None:
        """AssertionError when the device state disagrees with itself or with the slot
        table (a host sync; tests): every owned slot is published under its key, every
        published entry of the table points at a slot of this residency owned by its key."""
        owner = self.state.owner.cpu().numpy()[: self.n_slots].astype(np.int64)
        table = self.state.table.view(-1).cpu().numpy().astype(np.int64)
        held = np.flatnonzero(owner >= 0)
        assert len(np.unique(owner[held])) == len(held), "residency: a key owns two slots"
        assert np.array_equal(table[owner[held]], held), "residency: an owned slot is not published"
        pub = np.flatnonzero(table >= 0)
        assert np.all(table[pub] < self.n_slots), "residency: the table points past its slots"
        assert np.array_equal(owner[table[pub]], pub), "residency: the table names a slot another key owns"

    def close(self) -> None:
        """Give the pool back to the store's host bookkeeping (a host sync): the slot owners
        become its RESIDENT keys, and the slot table stays as the device left it."""
        if self.closed:
            return
        owners = self.state.owner.cpu().numpy()[: self.n_slots]
        store, pool = self.store, self.store._pool
        full = np.full(pool.n_slots, -1, dtype=np.int64)
        full[: self.n_slots] = owners
        with store.lock:
            pool.adopt_owners(full)
            pool.device_owner = None
        if self.state.heat is not None and not store.closed:
            self.fold_heat()
        self.closed = True

    def __enter__(self) -> DeviceResidency:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
