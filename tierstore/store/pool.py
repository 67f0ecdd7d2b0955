"""The VRAM slot pool: one fixed allocation plus the slot table kernels read.

``pool``       torch.uint8 [n_slots, slot_bytes] on the pool's device
``slot_table`` torch.int32 [n_layers, n_experts] on the same device, -1 = not resident

Both are allocated once and never reallocated or rebound: CUDA graphs captured
their addresses, so every change is a copy into them. A deferred pool (an engine
that sizes it after its KV cache) starts with 0 slots and the slot table already
allocated (all -1, or a table made earlier by ``new_slot_table`` and adopted);
``allocate`` then makes the pool, once. The host keeps numpy
mirrors (``SlotStates``: state per slot, owner, pins, the published map) that the
store consults without touching the device.

Publish protocol (docs/INTERNALS.md, "Protocols"): a key becomes visible in ``slot_table`` only after
its bytes are in the pool, ordered on the consumer's stream: the caller makes the
stream wait on the copy's completion, then ``publish`` enqueues the table write
on that same stream (a non-blocking copy from a pinned host tensor, then an
``index_copy_``). ``unpublish`` enqueues the -1 writes and returns an event the
store waits on before the slot's bytes may be overwritten. On the CPU pool the
same calls run; the writes are immediate and there is no event.

Thread safety: none; the store serialises every call under its lock. No call
here does I/O or waits on the device.
"""

from __future__ import annotations

import numpy as np
import torch

from tierstore.errors import ConfigError
from tierstore.store.slots import FREE, RESIDENT, SlotStates


def new_slot_table(n_layers: int, n_experts: int, device) -> torch.Tensor:
    """An int32 [n_layers, n_experts] slot table of -1 on ``device``, for an engine that
    must hand kernels the table before its store exists (the store adopts it with
    ``ExpertStore(..., slot_table=)``; only the store writes it from then on)."""
    return torch.full((int(n_layers), int(n_experts)), -1, dtype=torch.int32, device=torch.device(device))


def unsized_pool(slot_bytes: int, device) -> torch.Tensor:
    """The 0-row pool an engine's face shows before its store is sized (vLLM-Moet's
    ``tier.pool`` before ``finalize_auto``): nothing is ever mapped into it."""
    return torch.empty((0, int(slot_bytes)), dtype=torch.uint8, device=torch.device(device))


class SlotPool(SlotStates):
    """Fixed-slot pool of ``n_slots`` rows of ``slot_bytes`` on ``device``."""

    def __init__(
        self,
        n_slots: int,
        slot_bytes: int,
        n_layers: int,
        n_experts: int,
        device,
        policy,
        table: torch.Tensor | None = None,
    ):
        super().__init__(n_slots, n_layers * n_experts, policy, tier="pool")
        self.device = torch.device(device)
        self.slot_bytes = int(slot_bytes)
        self.n_layers, self.n_experts = int(n_layers), int(n_experts)
        self.pool = torch.empty((self.n_slots, self.slot_bytes), dtype=torch.uint8, device=self.device)
        if table is None:
            table = new_slot_table(self.n_layers, self.n_experts, self.device)
        else:
            table.fill_(-1)  # adopted: every key starts not resident
        self.slot_table = table
        self._table_flat = self.slot_table.view(-1)  # same storage; never a copy
        self._base_ptr = int(self.pool.data_ptr())
        # Load batch id per slot, so a fire can find the batch loading a key.
        self.batch_of_slot = np.zeros(self.n_slots, dtype=np.int64)
        self.allocated = self.n_slots > 0
        # A DeviceResidency (store/residency.py) keeps the slots while attached: the GPU
        # decides and publishes, so every host-side reservation or eviction is refused.
        self.device_owner = None

    def check_host_owned(self, what: str) -> None:
        """ConfigError while a device-side residency keeps the pool."""
        if self.device_owner is not None:
            raise ConfigError(
                f"{what}: the pool is kept by a device-side residency "
                f"(ExpertStore.device_residency); close it first"
            )

    def choose(self, keys, *, allow_evict, protect=None):
        self.check_host_owned("pool reservation")
        return super().choose(keys, allow_evict=allow_evict, protect=protect)

    def evict(self, keys):
        self.check_host_owned("evict")
        return super().evict(keys)

    def adopt_owners(self, owners: np.ndarray) -> None:
        """Take the slot owners a device-side residency leaves (int [n_slots] dense keys,
        -1 = free) as the RESIDENT / FREE states; the slot table on the device already says
        the same. The pool was idle (RESIDENT or FREE slots only) when it was attached."""
        owners = np.asarray(owners, dtype=np.int64)
        old = self.owner[self.state == RESIDENT]
        slots = np.flatnonzero(owners >= 0)
        new = owners[slots]
        gone, came = np.setdiff1d(old, new), np.setdiff1d(new, old)
        if len(gone):
            self.policy.on_evict(gone)
        self.state[:] = FREE
        self.owner[:] = -1
        self.slot_of[:] = -1
        self.resident_slot[:] = -1
        self.state[slots] = RESIDENT
        self.owner[slots] = new
        self.slot_of[new] = slots
        self.resident_slot[new] = slots.astype(np.int32)
        if len(came):
            self.policy.on_admit(came)
        self.evictions += len(gone)
        self.admissions += len(came)

    def allocate(self, n_slots: int, policy) -> None:
        """Size a deferred (0-slot) pool: the pool tensor is made here, once; the slot
        table is the one made at construction. ``n_slots`` 0 leaves the pool inert."""
        assert not self.allocated and self.n_slots == 0, "pool: allocate() of a sized pool"
        SlotStates.__init__(self, n_slots, self.n_keys, policy, tier="pool")
        self.pool = torch.empty((self.n_slots, self.slot_bytes), dtype=torch.uint8, device=self.device)
        self._base_ptr = int(self.pool.data_ptr())
        self.batch_of_slot = np.zeros(self.n_slots, dtype=np.int64)
        self.allocated = True

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def slot_ptrs(self, slots: np.ndarray) -> np.ndarray:
        """Device addresses of ``slots`` (uint64), the engine's copy destinations."""
        return np.uint64(self._base_ptr) + np.asarray(slots, dtype=np.uint64) * np.uint64(self.slot_bytes)

    # -- slot table writes --------------------------------------------------------------
    def _write_table(self, keys: np.ndarray, values: np.ndarray, stream):
        """Enqueue ``slot_table.flat[keys] = values`` on ``stream``; returns an event
        recorded after the write (CUDA) or None (CPU, where the write is done)."""
        if len(keys) == 0:
            return None
        host = np.stack([np.asarray(keys, dtype=np.int64), np.asarray(values, dtype=np.int64)])
        if not self.is_cuda:
            self._table_flat[torch.from_numpy(host[0])] = torch.from_numpy(host[1]).to(torch.int32)
            return None
        # pin_memory() comes from torch's caching host allocator, which records the copy
        # on the stream and does not recycle the buffer before the copy has run.
        staged = torch.from_numpy(host).pin_memory()
        with torch.cuda.stream(stream):
            dev = staged.to(self.device, non_blocking=True)
            self._table_flat.index_copy_(0, dev[0], dev[1].to(torch.int32))
            event = torch.cuda.Event()
            event.record(stream)
        return event

    def publish(self, slots: np.ndarray, stream):
        """LOADING -> RESIDENT and the table write on ``stream``. The caller has made
        ``stream`` wait on the copies into ``slots``. Returns the table-write event."""
        self.commit(slots)
        return self.write_owners(slots, stream)

    def write_owners(self, slots: np.ndarray, stream):
        """Enqueue ``slot_table[owner of s] = s`` for committed ``slots`` (idempotent: a
        publish step run again writes the same values). Returns the event."""
        return self._write_table(self.owner[slots], np.asarray(slots, dtype=np.int64), stream)

    def unpublish(self, keys: np.ndarray, stream):
        """Enqueue -1 for ``keys`` (which already left RESIDENT in the host mirror);
        returns the event after which their old slots' bytes may be overwritten."""
        return self._write_table(keys, np.full(len(keys), -1, dtype=np.int64), stream)

    # -- checking ------------------------------------------------------------------------
    def device_table(self) -> np.ndarray:
        """The slot table as the device sees it, flat (a host sync on CUDA: tests only)."""
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
        return self.slot_table.view(-1).cpu().numpy().astype(np.int64)

    def check_invariants(self, device: bool = True) -> None:
        super().check_invariants()
        if device:
            table = self.device_table()
            mirror = self.resident_slot.astype(np.int64)
            bad = np.flatnonzero(table != mirror)
            assert len(bad) == 0, (
                f"pool: slot_table[{bad[0] // self.n_experts}, {bad[0] % self.n_experts}] = "
                f"{table[bad[0]]}, host mirror says {mirror[bad[0]]}"
            )
            held = table[table >= 0]
            assert np.all(self.state[held] == RESIDENT), "pool: slot_table points at a non-RESIDENT slot"
