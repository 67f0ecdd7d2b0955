"""Routing records: what ``ExpertStore.record`` does with the ids, and the fold.

``record(layer, topk_ids)`` runs on the forward thread for every MoE layer, so it
does the least it can: CPU ids are counted at once into the native fold
(``tierstore._C.RoutingFold``, csrc/store/src/fold.cpp: one pass over the caller's
buffer, no copy kept, so the caller may reuse it; the GIL serialises it with
``take``, so no lock); a CUDA tensor is added into a device counter with one
``scatter_add_`` on the caller's stream (no host sync; capturable in a CUDA graph:
a CUDA store allocates the counter at construction, so a capture never allocates
it). ``take`` hands out everything recorded since the last call as (unique keys,
token counts, hit tally) in one native call: the keys come out sorted and the
residency split is done in the same pass, so a step costs a handful of calls
whatever the batch. Why native: with numpy the fold was ~30 array calls a step
(~160 us at batch 1 on a 2-core VM) and one bincount over the 66k ids of a
batch-256 step alone is ~120 us there. The fold is native only: the device
counter's snapshot is added into it (``add_counts``) so the hit split and the
seen marks are done by the same pass (tests/store/test_store_fold.py keeps a numpy
reference as the oracle).

Ids < 0 are padding. Ids >= n_experts are dropped at ``take``, counted in
``counters.record_dropped`` and logged once: checking them in ``record`` would
cost a reduction per call on the CPU and a host sync on CUDA.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from tierstore._C import RoutingFold as NativeFold
from tierstore.errors import ConfigError

log = logging.getLogger("tierstore.store")


class RoutingRecorder:
    """Recorded routing of one store (layers x experts of ``pack``), folded per step."""

    def __init__(self, pack, counters, lock, device=None):
        self.path = pack.path
        self.n_layers, self.n_experts = int(pack.n_layers), int(pack.n_experts)
        self.n_keys = self.n_layers * self.n_experts
        self.counters = counters
        self._lock = lock  # only to create the device counter once
        self._fold = NativeFold(self.n_layers, self.n_experts)
        self._bound = None  # the arrays the native take writes / reads
        self._dev_counts = None  # int32 [n_keys + 1]; last bucket: bad ids
        self._dev_one = None
        # Set by the first device record (also one made while a CUDA graph is captured,
        # whose replays then add without calling us): until then a fold skips the device
        # counts and their host sync, so a store fed host ids never syncs in fire/step.
        self._dev_used = False
        if device is not None and torch.device(device).type == "cuda":
            self._alloc_device(torch.device(device))  # before any graph capture

    def _alloc_device(self, device) -> None:
        self._dev_one = torch.ones(1, dtype=torch.int32, device=device)
        self._dev_counts = torch.zeros(self.n_keys + 1, dtype=torch.int32, device=device)

    def record(self, layer: int, topk_ids) -> None:
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)):
            raise ConfigError(f"record: layer must be an int, found {layer!r}")
        if not isinstance(topk_ids, (np.ndarray, torch.Tensor, list, tuple)):
            raise ConfigError(
                f"record: topk_ids must be an int array or tensor, found {type(topk_ids).__name__}"
            )
        if not 0 <= layer < self.n_layers:
            raise ConfigError(f"record: layer {layer} out of range [0, {self.n_layers})")
        fold = self._fold
        if type(topk_ids) is np.ndarray:
            try:
                fold.add(layer, topk_ids)
            except TypeError:  # strided, float, bool, uint64...: convert as numpy casts
                fold.add(layer, np.ascontiguousarray(topk_ids, dtype=np.int64))
        elif isinstance(topk_ids, torch.Tensor):
            if topk_ids.is_cuda:
                self._record_device(layer, topk_ids)
            else:
                ids = topk_ids.numpy()
                try:
                    fold.add(layer, ids)
                except TypeError:
                    fold.add(layer, np.ascontiguousarray(ids, dtype=np.int64))
        else:
            fold.add(layer, np.array(topk_ids, dtype=np.int64).reshape(-1))

    def _record_device(self, layer: int, ids: torch.Tensor) -> None:
        self._dev_used = True
        if self._dev_counts is None:
            with self._lock:
                if self._dev_counts is None:
                    self._alloc_device(ids.device)
        flat = ids.reshape(-1).to(torch.int64)
        ok = (flat >= 0) & (flat < self.n_experts)
        keys = torch.where(ok, flat + layer * self.n_experts, self.n_keys)
        keys = torch.where(flat < 0, self.n_keys, keys)
        # scatter_add_ (atomics, no sort, no host sync): safe inside a CUDA-graph capture.
        self._dev_counts.scatter_add_(0, keys, self._dev_one.expand(keys.shape[0]))

    def take(self, stream, pool_slot: np.ndarray, arena_slot: np.ndarray, seen: np.ndarray):
        """(unique dense keys, token counts as float64, tally) recorded since the last
        call, or None; the arrays may be views the next take overwrites (use them
        before, as the store does under its lock). ``tally`` is 8 ints: tokens, then distinct keys, per
        residency category (0 in neither tier, 1 arena only, 2 pool, 3 pool and arena;
        ``*_slot`` are the tiers' resident_slot maps); ``seen[keys]`` is set. The caller
        holds the store lock; ``stream`` orders the device fold (CUDA)."""
        b = self._bound
        if b is None or b[0] is not seen or b[1] is not pool_slot or b[2] is not arena_slot:
            self._fold.bind(seen, pool_slot, arena_slot)  # once per store in practice
            self._bound = (seen, pool_slot, arena_slot)
        if self._dev_counts is not None and self._dev_used:
            self._fold.add_counts(self._take_device(stream))
        keys, counts, t = self._fold.take()
        if t[8]:
            self._dropped(t[8], t[9], t[10])
        return (keys, counts, t[:8]) if len(keys) else None

    def _take_device(self, stream):
        # record() ran on the caller's current stream; order the fold after it.
        current = torch.cuda.current_stream(self._dev_counts.device)
        stream = current if stream is None else stream
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            snap = self._dev_counts.clone()
            self._dev_counts.zero_()
            dev = snap.cpu().numpy().astype(np.int64)  # one host sync per fold, not per record
        if dev[self.n_keys]:
            self._dropped(int(dev[self.n_keys]), -1, -1)
        return dev[: self.n_keys]

    def _dropped(self, n: int, layer: int, expert: int) -> None:
        if not self.counters.record_dropped:
            where = f"layer {layer} expert id {expert}" if layer >= 0 else "a CUDA record"
            log.warning(
                "%s: record(): dropped %d expert id(s) out of range [0, %d), first: %s",
                self.path,
                n,
                self.n_experts,
                where,
            )
        self.counters.record_dropped += n
