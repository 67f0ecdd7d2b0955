"""Routing records: what ``ExpertStore.record`` does with the ids, and the fold.

``record(layer, topk_ids)`` runs on the forward thread for every MoE layer, so it
does the least it can: a CPU array is copied (the caller may reuse its buffer)
and appended to a deque (thread-safe append/popleft, no lock); a CUDA tensor is
added into a device counter with one ``scatter_add_`` on the caller's stream (no
host sync; capturable in a CUDA graph: a CUDA store allocates the counter at
construction, so a capture never allocates it). ``take`` turns everything recorded since
the last call into (unique keys, token counts), vectorised over the whole step.

Ids < 0 are padding. Ids >= n_experts are dropped at ``take``, counted in
``counters.record_dropped`` and logged once: checking them in ``record`` would
cost a reduction per call on the CPU and a host sync on CUDA.
"""
from __future__ import annotations

import logging
from collections import deque

import numpy as np
import torch

from .errors import ConfigError

log = logging.getLogger("tierstore.store")


class RoutingRecorder:
    """Queue of recorded routing for one store (layers x experts of ``pack``)."""

    def __init__(self, pack, counters, lock, device=None):
        self.path = pack.path
        self.n_layers, self.n_experts = int(pack.n_layers), int(pack.n_experts)
        self.n_keys = self.n_layers * self.n_experts
        self.counters = counters
        self._lock = lock                 # only to create the device counter once
        self._pending: deque = deque()
        self._dev_counts = None           # int32 [n_keys + 1]; last bucket: bad ids
        self._dev_one = None
        if device is not None and torch.device(device).type == "cuda":
            self._alloc_device(torch.device(device))  # before any graph capture

    def _alloc_device(self, device) -> None:
        self._dev_one = torch.ones(1, dtype=torch.int32, device=device)
        self._dev_counts = torch.zeros(self.n_keys + 1, dtype=torch.int32, device=device)

    def record(self, layer: int, topk_ids) -> None:
        if not 0 <= layer < self.n_layers:
            raise ConfigError(f"record: layer {layer} out of range [0, {self.n_layers})")
        if type(topk_ids) is np.ndarray:
            self._pending.append((layer, topk_ids.ravel().copy()))
        elif isinstance(topk_ids, torch.Tensor):
            if topk_ids.is_cuda:
                self._record_device(layer, topk_ids)
            else:
                self._pending.append((layer, topk_ids.numpy().ravel().copy()))
        else:
            self._pending.append((layer, np.array(topk_ids, dtype=np.int64).reshape(-1)))

    def _record_device(self, layer: int, ids: torch.Tensor) -> None:
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

    def take(self, stream=None) -> tuple[np.ndarray, np.ndarray] | None:
        """(unique dense keys, token counts) recorded since the last call, or None.
        The caller holds the store lock; ``stream`` orders the device fold (CUDA)."""
        keys, counts = [], []
        n = len(self._pending)
        if n:
            k, c = self._fold_host([self._pending.popleft() for _ in range(n)])
            keys.append(k)
            counts.append(c)
        if self._dev_counts is not None:
            k, c = self._take_device(stream)
            keys.append(k)
            counts.append(c)
        if not keys:
            return None
        if len(keys) == 1:
            return keys[0], counts[0]
        dense = np.bincount(np.concatenate(keys), weights=np.concatenate(counts),
                            minlength=self.n_keys).astype(np.int64)
        k = (dense != 0).nonzero()[0]
        return k, dense[k]

    def _fold_host(self, items) -> tuple[np.ndarray, np.ndarray]:
        """Unique keys and token counts of host records, in few numpy calls: the
        common decode case (every record the same size, no padding, no bad id)
        needs no per-record offsets array and no masking."""
        arrays = [a for _, a in items]
        layers = np.array([l for l, _ in items], dtype=np.int64)
        ids = np.concatenate(arrays).astype(np.int64, copy=False)
        if not len(ids):
            return ids, ids
        m = len(arrays[0])
        if m and len(ids) == m * len(arrays):             # equal sizes: broadcast the offsets
            flat = (ids.reshape(len(arrays), m) + (layers * self.n_experts)[:, None]).reshape(-1)
        else:
            sizes = np.fromiter(map(len, arrays), np.int64, len(arrays))
            flat = np.repeat(layers * self.n_experts, sizes) + ids
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.n_experts:                # padding or bad ids: mask them
            bad = ids >= self.n_experts
            if hi >= self.n_experts:
                first = int(np.argmax(bad))
                sizes = np.fromiter(map(len, arrays), np.int64, len(arrays))
                self._dropped(int(np.count_nonzero(bad)),
                              int(np.repeat(layers, sizes)[first]), int(ids[first]))
            flat = flat[(ids >= 0) & ~bad]
        dense = np.bincount(flat, minlength=self.n_keys)
        k = (dense != 0).nonzero()[0]   # 3x faster than flatnonzero on an int array
        return k, dense[k]

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
        k = (dev[:self.n_keys] != 0).nonzero()[0]
        return k, dev[k]

    def _dropped(self, n: int, layer: int, expert: int) -> None:
        if not self.counters.record_dropped:
            where = f"layer {layer} expert id {expert}" if layer >= 0 else "a CUDA record"
            log.warning("%s: record(): dropped %d expert id(s) out of range [0, %d), first: %s",
                        self.path, n, self.n_experts, where)
        self.counters.record_dropped += n
