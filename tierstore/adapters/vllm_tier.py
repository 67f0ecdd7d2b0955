"""The tier upstream vLLM's MoE layers read: an ExpertStore over the fp4 pack, the 2-bit
base rows of every expert on the device, and a device-side "seen" table.

Lifetime inside one vLLM worker (MOET-facts of vLLM 0.34, docs/VLLM.md):

1. ``load_model``: the quant config builds this tier with the model's geometry. The
   slot table exists from here on, all -1 (every expert answers from its base row), so
   the eager profile run and the throwaway capture before KV allocation work without
   a pool. Graphs captured then are discarded by vLLM.
2. ``initialize_from_config`` (our worker, after KV allocation, before the real
   captures): :meth:`finalize` opens the ExpertStore, sizing the pool from the memory
   KV left ("auto": free memory minus TIERSTORE_RESERVE_GB). Pool and slot table are
   allocated once, here, and never move: their addresses are what graphs bake in.
3. Captures run under :meth:`quiet`: the store's worker thread is drained and no step
   queues work, so no other thread issues CUDA calls ("global" capture mode).
4. Serving: ``apply`` marks routed experts in ``seen`` (device op, replays in graphs),
   makes eager prefill experts resident, and calls ``tierstore.compute.moe.fused_moe``;
   the worker calls :meth:`step_end` after each step, which folds the previous step's
   ``seen`` (copied without a host sync) into the store's heat and runs ``store.step``.
"""
from __future__ import annotations

import contextlib
import threading

import torch

from tierstore.compute.moe import BaseWeights, fused_moe
from tierstore.errors import ConfigError


class UnsizedPool:
    """Before :meth:`ServingTier.finalize`: a slot table of -1 and a one-row pool, so
    the compute path reads base rows only."""

    def __init__(self, n_layers: int, n_experts: int, slot_bytes: int, device):
        self.slot_bytes = int(slot_bytes)
        self.n_slots = 0
        self.pool = torch.zeros(1, self.slot_bytes, dtype=torch.uint8, device=device)
        self.slot_table = torch.full((n_layers, n_experts), -1, dtype=torch.int32, device=device)


class ServingTier:
    """``packs``: {"fp4": path, "base": path} (complete, as ExpertCapture wrote them).
    ``store_options`` go to ExpertStore (vram_gb / vram_slots / ram_gb / policy ...)."""

    def __init__(self, packs: dict[str, str], *, device, **store_options):
        from tierstore.format.pack import Pack
        from tierstore.format.layouts import expert_shape_of
        self.packs = dict(packs)
        self.device = torch.device(device)
        fp4_pack = Pack.open(self.packs["fp4"])
        self.pack_path = self.packs["fp4"]
        self.n_layers, self.n_experts = int(fp4_pack.n_layers), int(fp4_pack.n_experts)
        self.hidden_size, self.intermediate_size = expert_shape_of(fp4_pack)
        self._fp4_pack = fp4_pack
        self.base = BaseWeights.from_pack(self.packs["base"], device=self.device,
                                          H=self.hidden_size, I=self.intermediate_size)
        self.store = UnsizedPool(self.n_layers, self.n_experts, fp4_pack.slot_bytes, self.device)
        self.store_options = store_options
        self.seen = torch.zeros(self.n_layers, self.n_experts, dtype=torch.uint8,
                                device=self.device)
        pin = self.device.type == "cuda"
        self._seen_host = torch.zeros(self.n_layers, self.n_experts, dtype=torch.uint8,
                                      pin_memory=pin)
        self._seen_event = None
        self._quiet = 0
        self._lock = threading.Lock()

    # -- boot -------------------------------------------------------------------------
    @property
    def finalized(self) -> bool:
        return not isinstance(self.store, UnsizedPool)

    def finalize(self) -> None:
        """Open the ExpertStore (allocates pool + slot table). Call once, after KV
        allocation and before the first real capture; a second call is a no-op."""
        from tierstore.store.expert_store import ExpertStore
        with self._lock:
            if self.finalized:
                return
            options = dict(self.store_options)
            if "vram_slots" not in options:
                options.setdefault("vram_gb", "auto")
            self.store = ExpertStore(self._fp4_pack, device=str(self.device), **options)

    @contextlib.contextmanager
    def quiet(self):
        """No background CUDA work while the body runs (graph capture): drain the
        store's worker and keep step_end from queueing more."""
        with self._lock:
            self._quiet += 1
        try:
            if self.finalized:
                self.store.wait_idle()
            yield
        finally:
            with self._lock:
                self._quiet -= 1

    # -- the forward path (called from apply) ---------------------------------------
    def mark_seen(self, layer: int, topk_ids: torch.Tensor) -> None:
        """Device op, no host sync: replays inside CUDA graphs."""
        ids = topk_ids.reshape(-1).long().clamp(0, self.n_experts - 1)
        self.seen[layer].index_fill_(0, ids, 1)

    def ensure_resident(self, layer: int, topk_ids: torch.Tensor) -> None:
        if self.finalized and not self._quiet:
            self.store.ensure_resident(layer, topk_ids)

    def moe_w2_forward(self, x, topk_weights, topk_ids, layer: int) -> torch.Tensor:
        return fused_moe(x, topk_weights, topk_ids, layer, self.store, self.base)

    # -- per step (the worker) --------------------------------------------------------
    def step_end(self) -> None:
        """Fold the previous step's ``seen`` into the store's heat and run its step.

        The copy of this step's table is queued on the current stream with an event;
        it is read one step later, so the forward thread never waits for the GPU."""
        if not self.finalized or self._quiet:
            return
        if self._seen_event is not None:
            self._seen_event.synchronize()   # long done: one step has passed
            self._fold(self._seen_host)
        self._seen_host.copy_(self.seen, non_blocking=self.device.type == "cuda")
        self.seen.zero_()
        if self.device.type == "cuda":
            self._seen_event = torch.cuda.Event()
            self._seen_event.record()
        else:
            self._fold(self._seen_host)
            self._seen_event = None
        self.store.step()

    def _fold(self, table: torch.Tensor) -> None:
        for layer in torch.nonzero(table.any(dim=1)).reshape(-1).tolist():
            experts = torch.nonzero(table[layer]).reshape(1, -1).to(torch.int32)
            self.store.record(layer, experts)

    def shutdown(self) -> None:
        if self.finalized:
            self.store.close()


def check_layer(tier: ServingTier, layer: int) -> None:
    if not 0 <= layer < tier.n_layers:
        raise ConfigError(f"MoE layer {layer} is outside the pack {tier.pack_path} "
                          f"(0..{tier.n_layers - 1})")
