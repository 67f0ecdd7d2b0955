"""The store's prefetch hook: after ``record(layer, ids)``, the prefetcher
(``tierstore.policies.prefetch``, the one the simulator replays) proposes rows of
later layers and the background worker reads them (``ExpertStore(...,
prefetch=True or {prefetcher parameters})``).

At each record, under the store lock (array work only, one pass per layer, no
Python loop per row): fold the queued routing into the policies (so the victims
are chosen knowing this layer's accesses), unpin the previous layer's keys and
what was held for this layer, tell the prefetcher what this layer routed and
which of it was resident, pin the layer's keys and the proposal's ``hold``, then
hand ``fetch`` to the worker as one promotion (the existing promote path: slots
taken under the lock, the reads and copies with it released, published on the
store's stream). A fire of a layer whose prefetch is still loading waits on that
batch (run_fire's "loading" keys), so the forward never reads a half-written row.

The order is the simulator's (``tierstore.sim.prefetching``), so a CPU-pool store
driven a layer at a time (record, wait for the worker, fire, release) and the
replay agree exactly (tests/sim/test_prefetch_store.py).

The prefetcher counts a layer's tokens as its valid ids / ``top_k``: pass the
model's ``prefetch={"top_k": k}`` (else the fewest ids a record had so far), so
a prefill's or a batch's next layer is predicted for all of its tokens.

Ids on a CUDA device are copied to the host here (one host sync per recorded
layer, only with prefetch on): the prediction needs the routing on the host.
"""

from __future__ import annotations

import numpy as np
import torch

from tierstore.policies.prefetch import Prefetcher
from tierstore.store.slots import FREE
from tierstore.store.worker import Ticket

_EMPTY = np.empty(0, dtype=np.int64)


def _would_evict(pool, n: int, blocked: np.ndarray) -> np.ndarray:
    """The keys ``n`` promotions would evict from ``pool`` now, in take order (-1: a
    free slot): SlotStates.take's choice, pins and ``blocked`` protected."""
    nf = min(int(np.count_nonzero(pool.state == FREE)), int(n))
    v = np.asarray(pool.policy.victims(int(n) - nf, blocked | (pool.key_pins > 0)), dtype=np.int64)
    return np.concatenate((np.full(nf, -1, dtype=np.int64), v)) if nf else v


class StorePrefetch:
    """A Prefetcher over ``store``'s pool, fed by record() and step()."""

    def __init__(self, store, params: dict):
        self.store = store
        self.n_experts = int(store.pack.n_experts)
        self.prefetcher = Prefetcher(int(store.pack.n_layers), self.n_experts, int(store.n_slots), **params)
        self._current = _EMPTY  # the last recorded layer's keys, pinned until the next record
        self._step = int(store.step_count)  # ticks end at step(): seen at the next record

    def record(self, layer: int, topk_ids) -> None:
        """ExpertStore.record with prefetch on: queue the ids (the recorder, which
        validates them), then the hook."""
        self.store._recorder.record(layer, topk_ids)
        self.after_record(layer, topk_ids)

    def after_record(self, layer: int, topk_ids) -> None:
        """Forward thread, after the ids were queued (see module doc)."""
        if isinstance(topk_ids, torch.Tensor):
            ids = topk_ids.detach().reshape(-1).cpu().numpy()
        else:
            ids = np.asarray(topk_ids).reshape(-1)
        valid = ids[(ids >= 0) & (ids < self.n_experts)]
        experts = np.unique(valid).astype(np.int64)
        store, pf = self.store, self.prefetcher
        with store.lock:
            store._check_open("record")
            store._fold_records()
            while self._step < store.step_count:  # a step() ended a tick since the last record
                self._step += 1
                pf.end_tick()
            pool = store._pool
            keys = int(layer) * self.n_experts + experts
            hit = pool.resident_slot[keys] >= 0
            release = pf.on_read(int(layer), experts, hit, int(valid.size))
            if self._current.size:
                pool.unpin(self._current)
            if release.size:
                pool.unpin(release)
            # Unwritten layers count as resident: never fetched (their rows do not exist).
            fetch, hold = pf.propose(
                int(layer),
                (pool.slot_of >= 0) | ~store._written,
                lambda n, blocked: _would_evict(pool, n, blocked),
            )
            pool.pin(keys)
            self._current = keys
            if hold.size:
                pool.pin(hold)
        if fetch.size:
            store._submit_job(("promote", fetch, Ticket(len(fetch)), False))

    def counts(self) -> dict:
        """The prefetcher's reads accounting (what the simulator reports too)."""
        pf = self.prefetcher
        return {
            "issued": pf.issued,
            "useful": pf.useful,
            "held_resident": pf.held_resident,
            "misses": pf.misses,
            "lru_reads": pf.lru_reads,
            "precision": pf.precision,
            "threshold": pf.threshold,
        }
