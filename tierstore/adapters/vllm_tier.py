"""The tier upstream vLLM's MoE layers read: an ExpertStore over the fp4 pack, the 2-bit
base rows of every expert on the device, and a device-side "seen" table.

Lifetime inside one vLLM worker (MOET-facts of vLLM 0.34, docs/VLLM.md):

1. ``load_model``: the quant config builds this tier with the model's geometry and opens
   the ExpertStore with a deferred pool (``vram_slots="deferred"``): the slot table exists
   from here on, all -1 (every expert answers from its base row), so the eager profile
   run and the throwaway capture before KV allocation work without a pool.
2. ``initialize_from_config`` (our worker, after KV allocation, before the real
   captures): :meth:`finalize` sizes the pool (``store.finalize``: "auto" = free memory
   minus TIERSTORE_RESERVE_GB, or the vram_gb / vram_slots given). The pool is allocated
   once, here; pool and slot table never move: their addresses are what graphs bake in.
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

import numpy as np
import torch

from tierstore.compute.moe import BaseWeights, fused_moe
from tierstore.errors import ConfigError


class ServingTier:
    """``packs``: {"fp4": path, "base": path} (complete, as ExpertCapture wrote them).
    ``store_options`` go to ExpertStore (vram_gb / vram_slots / ram_gb / policy ...)."""

    def __init__(self, packs: dict[str, str], *, device, **store_options):
        from tierstore.format.layouts import expert_shape_of
        from tierstore.format.pack import Pack

        self.packs = dict(packs)
        self.device = torch.device(device)
        fp4_pack = Pack.open(self.packs["fp4"])
        self.pack_path = self.packs["fp4"]
        self.n_layers, self.n_experts = int(fp4_pack.n_layers), int(fp4_pack.n_experts)
        self.hidden_size, self.intermediate_size = expert_shape_of(fp4_pack)
        self._fp4_pack = fp4_pack
        self.base = BaseWeights.from_pack(
            self.packs["base"], device=self.device, H=self.hidden_size, I=self.intermediate_size
        )
        options = dict(store_options)
        self._size = options.pop("vram_slots", None)
        gb = options.pop("vram_gb", None)
        if self._size is None:
            self._size = (
                "auto" if gb in (None, "auto") else int(float(gb) * (1 << 30)) // int(fp4_pack.slot_bytes)
            )
        # publish="step": the store's worker only reads into the arena (no CUDA call from
        # another thread while vLLM captures), and promotions land at step_end
        options.setdefault("publish", "step")
        options.setdefault("quarantine", True)  # a rotten row: served from its base row
        from tierstore.store.expert_store import ExpertStore

        self.store = ExpertStore(fp4_pack, vram_slots="deferred", device=str(self.device), **options)
        from tierstore import metrics
        from tierstore.adapters.vllm_exact import metric_labels, parallel_rank, routing_capture

        rank, world = parallel_rank()
        metrics.register_store(self.store, metric_labels("tiered", rank))
        self.capture = routing_capture("tiered", self.n_experts, rank, world)
        self.seen = torch.zeros(self.n_layers, self.n_experts, dtype=torch.uint8, device=self.device)
        pin = self.device.type == "cuda"
        self._seen_host = torch.zeros(self.n_layers, self.n_experts, dtype=torch.uint8, pin_memory=pin)
        self._seen_event = None
        self._quiet = 0
        self._lock = threading.Lock()

    # -- boot -------------------------------------------------------------------------
    @property
    def finalized(self) -> bool:
        return self.store.sized

    def finalize(self) -> None:
        """Size the store's pool (once, after KV allocation and before the first real
        capture); a second call is a no-op."""
        with self._lock:
            if not self.finalized:
                self.store.finalize(self._size)

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
            retry_quarantined(self.store, lambda: self.store.ensure_resident(layer, topk_ids))

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
            self._seen_event.synchronize()  # long done: one step has passed
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
        self.store.record_counts(table.numpy())
        if self.capture is not None:  # TIERSTORE_CAPTURE: one step of routing
            self.capture.record_counts(table.numpy())
            self.capture.step()

    def seen_pairs(self) -> np.ndarray:
        """(layer, expert) pairs marked in ``seen`` since the last step end (a host sync):
        what a fire of this step must make resident (tierstore.compute.gate.run_with_gate)."""
        table = self.seen.to("cpu")
        return torch.nonzero(table).numpy().astype(np.int64)

    def shutdown(self) -> None:
        from tierstore import metrics

        if self.capture is not None:
            self.capture.close()
        metrics.unregister_store(self.store)
        self.store.close()


def retry_quarantined(store, load):
    """Run ``load`` (a fire); when it failed on a row the store has just quarantined (its
    checksum failed: the store logged and counted it), run it once more: the row is left
    out and the layer serves that expert from its 2-bit base, never a stop for the rest."""
    from tierstore.errors import TierIOError

    try:
        return load()
    except TierIOError as exc:
        key = [getattr(exc, "layer", None), getattr(exc, "expert", None)]
        if key not in store.quarantined_keys().tolist():
            raise
    return load()


def check_layer(tier: ServingTier, layer: int) -> None:
    if not 0 <= layer < tier.n_layers:
        raise ConfigError(f"MoE layer {layer} is outside the pack {tier.pack_path} (0..{tier.n_layers - 1})")
