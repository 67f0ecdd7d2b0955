"""``TierstoreDeltaTier``: vLLM-Moet's FP4 tier object (``moe_w2_delta.DeltaTier``), on tierstore.

Every attribute and method its glue, gate, runners and worker use, with the same
types, shapes, streams and boot order (docs/VLLM_MOET.md has the list):

* allocated at construction, before the profile forward: ``slot_table`` int32
  [n_layers, E] (-1), ``seen`` (uint8, int32 when counting), ``seen_w``, the
  pool (0 rows while an auto pool is pending; ``n_slots`` is always an int), the
  host store and the side stream; ``finalize_auto`` sizes an auto pool once, after
  the KV cache (no room: an inert 0-slot tier, host store released).
* the background manager thread makes NO device call at all: it ranks, picks
  victims (reservations only) and reads rows from the store into its own host
  stage. The runner thread publishes the staged batch at the next step boundary
  (``step_end`` / ``wait_manager_idle``): copies and table writes on the side
  stream, ordered after the forward and before the next one by stream waits, no
  host sync. So a CUDA graph captured with ``capture_error_mode="global"`` is
  never invalidated by our threads, and ``notify_capture`` has nothing to do.
* ``force_promote(layers=None, max_promote=None, pin=True) -> int`` (None = no
  cap) and ``ensure_resident`` load on the runner thread: on a CUDA pool over a
  pack store the store's engine writes the rows straight into their slots
  (``rows_into``), else through a host stage and one batched copy
  (adapters/moet_copy.py has both). Nothing is published unless every row landed:
  a failed staged read gives every reserved slot back (victims keep their rows); a
  failure once bytes may have landed (a failed copy, any failed direct read)
  quarantines the slots: victims unmapped, slots free, no wrong byte served.

``dev`` may be a CPU device: the pool is then host memory and every call runs
(no streams, no events), which is how the whole surface is tested without a GPU.
"""
from __future__ import annotations

import logging
import threading
import time

import numpy as np
import torch

from tierstore.adapters.moet_config import MoetEnv, from_env
from tierstore.adapters.moet_copy import by_layer, copy_block, promote_path
from tierstore.adapters.moet_manager import ManagerMixin
from tierstore.adapters.moet_slots import SlotOwners
from tierstore.adapters.moet_store import cuda_engine, make_store

log = logging.getLogger("tierstore.adapters.moet")

W13_BYTES = 4096 * 4096 // 2          # DS4 TP1 fp4 w13 plane per expert (8 MiB)
W2_BYTES = 4096 * 2048 // 2           # DS4 TP1 fp4 w2 plane per expert (4 MiB)
SLOT_BYTES = W13_BYTES + W2_BYTES


class FirePhases:
    """Wall time of one synchronous load's phases (ms), so a bench or a log can tell the
    store call (``read_rows``) apart from the tier's own work around it. ``mark(name)``
    adds the time since the previous mark to ``name``; a few perf_counter calls a fire."""

    __slots__ = ("ms", "_t0", "_last")

    def __init__(self):
        self.ms: dict[str, float] = {}
        self._t0 = self._last = time.perf_counter()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.ms[name] = self.ms.get(name, 0.0) + (now - self._last) * 1e3
        self._last = now

    def done(self, **extra) -> dict:
        out = dict(self.ms)
        out["total"] = (time.perf_counter() - self._t0) * 1e3
        out.update(extra)
        return out


def _pinned_like(t: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(t.shape, dtype=t.dtype)
    return out.pin_memory() if torch.cuda.is_available() else out


class TierstoreDeltaTier(ManagerMixin):
    """One process's FP4 recovery tier. Thread safety: the runner thread calls every
    method; the manager thread (see ManagerMixin) shares host state under ``_lock``."""

    def __init__(self, n_layers: int, n_experts: int, dev, w13_bytes: int = W13_BYTES,
                 w2_bytes: int = W2_BYTES, pool_gb: float | None = None,
                 policy: str | None = None, tag: str = "delta", host_pinned: bool = True,
                 env: MoetEnv | None = None):
        self.env = env = from_env() if env is None else env
        self.n_layers, self.E = int(n_layers), int(n_experts)
        self._policy = policy if policy is not None else env.policy
        self._tag = tag
        dev = torch.device(dev)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        self.dev, self._cuda = dev, dev.type == "cuda"
        self.w13_bytes, self.w2_bytes = int(w13_bytes), int(w2_bytes)
        self.slot_bytes = self.w13_bytes + self.w2_bytes
        self._auto_pending = env.delta_auto and pool_gb is None
        if pool_gb is None:
            self.n_slots = env.initial_slots(self.slot_bytes)
        else:
            self.n_slots = max(int(float(pool_gb) * (1 << 30)) // self.slot_bytes, 8)
        self.pool = torch.empty(self.n_slots, self.slot_bytes, dtype=torch.uint8, device=dev)
        self.slot_table = torch.full((self.n_layers, self.E), -1, dtype=torch.int32, device=dev)
        self._owners = SlotOwners(self.n_slots, self.n_layers, self.E, self._policy)
        self._mirror = self._owners.mirror
        self.mutate_hooks: list = []
        seen_dtype = torch.int32 if env.count_seen else torch.uint8
        self.seen = torch.zeros(self.n_layers, self.E, dtype=seen_dtype, device=dev)
        self.seen_w = torch.zeros(self.n_layers, self.E, dtype=torch.float32, device=dev)
        self._seen_accum = torch.zeros(self.n_layers, self.E, dtype=torch.int32, device=dev)
        self._seen_host = _pinned_like(self._seen_accum)       # the manager's snapshot
        self._fire_host = _pinned_like(self.seen)               # force_promote's snapshot
        self._fire_w_host = _pinned_like(self.seen_w)
        self._store = make_store(env, tag, self.n_layers, self.E, self.slot_bytes, host_pinned,
                                 device=dev)
        self._promote_path = promote_path(env.ts_promote, dev, self._store,
                                          self._cuda and cuda_engine())
        self._stream = torch.cuda.Stream(dev) if self._cuda else None
        self._lock = threading.Lock()
        self._closed = False
        self._sub_floor = False
        self._deferred_floor = None     # set by check_pool_floor while auto is pending
        self._n_promoted = self._n_evicted = 0
        self._win_active = 0.0
        self._kpi_unfixed = self._kpi_deferred = 0
        # phases (ms) of the last force_promote / ensure_resident (FirePhases; bench/logs)
        self.last_fire_timing: dict = {}
        self._phases: FirePhases | None = None
        self._init_manager()
        if self._auto_pending:
            log.info("moet tier [%s]: auto pool deferred until after the KV cache (slot %.2f MiB)",
                     tag, self.slot_bytes / 2**20)
        else:
            log.info("moet tier [%s]: %d slots x %.2f MiB, %s loads", tag, self.n_slots,
                     self.slot_bytes / 2**20, self._promote_path)

    # -- what tests and tools read ----------------------------------------------------------
    @property
    def _freq(self) -> torch.Tensor:
        return torch.from_numpy(self._owners.freq.reshape(self.n_layers, self.E))

    @property
    def _need(self) -> torch.Tensor:
        return torch.from_numpy(self._owners.need.reshape(self.n_layers, self.E))

    @property
    def _free(self) -> list[int]:
        return self._owners.free

    @property
    def _step_pins(self) -> set[int]:
        return self._owners.step_pins

    # -- load time ------------------------------------------------------------------------
    def add_layer_host_planes(self, layer_key: int, w13_plane_gpu, w2_plane_gpu) -> None:
        """Stage one layer's [E, bytes] uint8 w13 and w2 planes (D2H, synchronous)."""
        self.add_layer_host_sections(layer_key, (w13_plane_gpu,), (w2_plane_gpu,))

    def add_layer_host_sections(self, layer_key: int, parts13, parts2) -> None:
        """Stage one layer given as column sections; a layer the pack holds is skipped."""
        self._store.add_layer(layer_key, (*parts13, *parts2))

    def finalize_auto(self, free_bytes: int | None = None) -> None:
        """Size an auto pool from memory free now (after the KV cache) minus
        DELTA_RESERVE_GB, capped by DELTA_MAX_GB. No room: 0 slots, store released,
        the tier is inert. A no-op unless auto is pending. Runs a floor check that
        check_pool_floor deferred (vLLM-Moet checked before sizing and refused)."""
        if not self._auto_pending:
            return
        self._auto_pending = False
        if free_bytes is None:
            if self._cuda:
                free_bytes = torch.cuda.mem_get_info(self.dev)[0]
            else:
                from tierstore.store.sizing import host_available_bytes
                free_bytes = host_available_bytes()
        budget = int(free_bytes) - int(self.env.reserve_gb * (1 << 30))
        if self.env.max_gb > 0:
            budget = min(budget, int(self.env.max_gb * (1 << 30)))
        n = max(budget // self.slot_bytes, 0)
        if n == 0:
            with self._lock:
                self._store.release()
            log.info("moet tier [%s] auto: %.2f GiB free < reserve %.1f GiB: 0 slots, inert",
                     self._tag, free_bytes / 2**30, self.env.reserve_gb)
        else:
            self.n_slots = int(n)
            self.pool = torch.empty(self.n_slots, self.slot_bytes, dtype=torch.uint8,
                                    device=self.dev)
            with self._lock:
                self._owners.reset(self.n_slots)
            log.info("moet tier [%s] auto: %d slots (%.2f GiB)", self._tag, n,
                     n * self.slot_bytes / 2**30)
        deferred, self._deferred_floor = self._deferred_floor, None
        if deferred is not None:
            deferred()

    # -- device helpers (runner thread only) ---------------------------------------------------
    def _write_table(self, keys, values, stream=None) -> None:
        keys = np.asarray(keys, np.int64)
        if not len(keys):
            return
        flat = self.slot_table.view(-1)
        vals = torch.from_numpy(np.asarray(values, np.int64)).to(torch.int32)
        if not self._cuda:
            flat[torch.from_numpy(keys)] = vals
            return
        host = torch.stack([torch.from_numpy(keys).to(torch.int32), vals]).pin_memory()
        with torch.cuda.stream(stream or torch.cuda.current_stream(self.dev)):
            on_dev = host.to(self.dev, non_blocking=True)
            flat.index_copy_(0, on_dev[0].long(), on_dev[1])

    def _table_update(self, keys, slots, victims, stream=None) -> None:
        victims = np.asarray(victims, np.int64)
        gone = victims[victims >= 0]
        self._write_table(np.concatenate([gone, np.asarray(keys, np.int64)]),
                          np.concatenate([np.full(len(gone), -1), np.asarray(slots, np.int64)]),
                          stream)

    def _copy_rows(self, slots, block: torch.Tensor) -> None:
        """A row block (``block[i]`` -> slot ``slots[i]``) into the pool as one batched
        copy (adapters/moet_copy.py), on the side stream after the forward's queued work."""
        if not self._cuda:
            copy_block(self.pool, slots, block)
            return
        self._stream.wait_stream(torch.cuda.current_stream(self.dev))
        copy_block(self.pool, slots, block, self._stream)

    def _snapshot(self, src: torch.Tensor, host: torch.Tensor) -> np.ndarray:
        """A host copy of ``src`` as it is after the forward's queued work (a host sync)."""
        return self._snapshots((src, host))[0]

    def _snapshots(self, *pairs) -> list[np.ndarray]:
        """Host copies of each ``(src, pinned host)`` pair as they are after the forward's
        queued work: all D2H copies on the side stream, then ONE event sync (a fire's
        ``seen`` and ``seen_w`` cost one round trip, not two)."""
        if not self._cuda:
            return [src.reshape(-1).numpy().copy() for src, _ in pairs]
        self._stream.wait_stream(torch.cuda.current_stream(self.dev))
        with torch.cuda.stream(self._stream):
            for src, host in pairs:
                host.copy_(src, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(self._stream)
        ev.synchronize()
        return [host.reshape(-1).numpy().copy() for _, host in pairs]

    def _fire_hooks(self) -> None:
        for hook in self.mutate_hooks:
            hook()

    def _layer_mask(self) -> np.ndarray:
        mask = np.zeros(self.n_layers, bool)
        if len(self._store):
            for li in range(self.n_layers):
                mask[li] = li in self._store
        return mask

    def _quarantine(self, slots, victims) -> None:
        """Bytes may have landed in ``slots``: victims unmapped, slots back to the free list."""
        self._owners.quarantine(slots, victims)
        victims = np.asarray(victims, np.int64)
        gone = victims[victims >= 0]
        self._write_table(gone, np.full(len(gone), -1))

    def _read_staged(self, pairs: np.ndarray, slots, victims, scan: bool) -> None:
        """Rows into the store's host stage, one batched copy (side stream), an event sync."""
        try:
            rows = self._store.rows_block(pairs, scan=scan)
        except BaseException:
            self._owners.cancel(slots, victims)   # every slot back; victims keep their rows
            raise
        try:
            self._copy_rows(slots, rows)
            if self._cuda:
                with torch.cuda.stream(self._stream):
                    ev = torch.cuda.Event()
                    ev.record(self._stream)
                ev.synchronize()
        except BaseException:
            self._quarantine(slots, victims)
            raise

    def _read_direct(self, pairs: np.ndarray, slots, victims, scan: bool) -> None:
        """Rows straight into their slots by the pack store's engine, its copies after the
        forward and side streams' queued work (a kernel or a lazy copy may still use a
        victim slot: ``_copy_rows``' order); returns once they completed (a host sync)."""
        after = (torch.cuda.current_stream(self.dev), self._stream) if self._cuda else None
        try:
            self._store.rows_into(pairs, self.pool, slots, scan=scan, after=after,
                                  phases=self._phases)
        except BaseException:
            self._quarantine(slots, victims)      # sibling rows may have landed: not cancel
            raise

    def _load_now(self, keys: np.ndarray, window: np.ndarray, *, emergency: bool,
                  protect_hot: bool, scan: bool, pins: set) -> tuple[int, int]:
        """Reserve, read (direct or staged), publish on the forward stream (lock held).
        Returns (loaded, wanted). Any failure publishes nothing."""
        ph = self._phases
        slots, victims = self._owners.take(len(keys), window, emergency=emergency,
                                           protect_hot=protect_hot)
        keys = keys[: len(slots)]
        if not len(slots):
            return 0, 0
        keys, slots, victims = by_layer(keys, slots, victims)
        pairs = np.stack([keys // self.E, keys % self.E], axis=1)
        if ph is not None:
            ph.mark("take")
        if self._promote_path == "direct":
            self._read_direct(pairs, slots, victims, scan)
        else:
            self._read_staged(pairs, slots, victims, scan)
            if ph is not None:
                ph.mark("staged_read_copy")
        self._owners.commit(keys, slots, victims)
        self._owners.freq[keys] += 1.0
        pins.update(slots)
        self._n_promoted += len(slots)
        self._n_evicted += int(np.count_nonzero(np.asarray(victims) >= 0))
        if ph is not None:
            ph.mark("commit")
        self._table_update(keys, slots, victims)
        if ph is not None:
            ph.mark("table")
        return len(slots), len(keys)

    # -- serving: the gate's fire ------------------------------------------------------------
    def force_promote(self, layers=None, max_promote=None, pin: bool = True) -> int:
        """Pull this step's routed, unmapped experts into the pool, synchronously, at most
        ``max_promote`` (None = no cap), ranked, without admission control; with ``pin``
        every slot hit or fetched stays pinned until step_end. Returns experts mapped."""
        if self._closed or len(self._store) == 0:
            return 0
        ph = self._phases = FirePhases()
        try:
            return self._force_promote(layers, max_promote, pin, ph)
        finally:
            self._phases = None
            self.last_fire_timing = ph.done(path=self._promote_path)

    def _force_promote(self, layers, max_promote, pin, ph: FirePhases) -> int:
        self._settle()
        ph.mark("settle")
        step_w = self.env.rank == "step_w"
        if step_w:
            seen, weights = self._snapshots((self.seen, self._fire_host),
                                            (self.seen_w, self._fire_w_host))
        else:
            seen, weights = self._snapshot(self.seen, self._fire_host), None
        self.seen.zero_()
        if step_w:
            self.seen_w.zero_()
        ph.mark("snapshot")
        routed = np.flatnonzero(seen)
        if not len(routed):
            return 0
        with self._lock:
            ph.mark("lock")
            o = self._owners
            slots = o.slot_of(routed)
            hit = slots >= 0
            o.touch(slots[hit])
            if pin:
                o.step_pins.update(slots[hit].tolist())
            keep = np.ones(len(routed), bool)
            if layers is not None:
                chosen = np.zeros(self.n_layers, bool)
                chosen[[int(li) for li in layers]] = True
                keep = chosen[routed // self.E]
            o.need[routed[keep]] += 1.0
            cand = routed[keep & ~hit & self._layer_mask()[routed // self.E]]
            if not len(cand):
                return 0
            rank = o.need if self._policy == "need" else o.freq
            key = rank[cand] if weights is None else weights[cand] + 1e-9 * rank[cand]
            cand = cand[np.argsort(-key, kind="stable")]
            if max_promote is not None:
                cand = cand[: max(int(max_promote), 0)]
            if not len(cand):
                return 0
            pins = o.step_pins if pin else set()
            ph.mark("rank")
            n, _ = self._load_now(cand, seen > 0, emergency=True, protect_hot=False,
                                  scan=False, pins=pins)
        if n < len(cand):
            short = len(cand) - n
            if self._policy == "need" or not pin:
                self._kpi_deferred += short
            else:
                self._kpi_unfixed += short
                log.warning("moet tier [%s]: %d routed experts got no slot (pool %d, pinned %d, "
                            "free %d, wanted %d); raise VLLM_MOE_W2_DELTA_GB", self._tag, short,
                            self.n_slots, len(self._owners.step_pins), len(self._owners.free),
                            len(cand))
        self._fire_hooks()
        ph.mark("hooks")
        return n

    def ensure_resident(self, layer_key: int, ids: torch.Tensor) -> int:
        """Prefill (eager): make one layer's routed experts resident, pinned until the next
        call; a quality tier never evicts the hottest half of its pool. Returns fetched."""
        if self._closed or layer_key not in self._store:
            return 0
        self._settle()
        ids = ids.reshape(-1).unique().long()
        mark_seen_row(self.seen[layer_key], ids.to(self.dev))
        ids_cpu = ids.cpu().numpy()
        ids_cpu = ids_cpu[(ids_cpu >= 0) & (ids_cpu < self.E)]
        keys = int(layer_key) * self.E + ids_cpu
        window = self._snapshot(self.seen, self._fire_host) > 0
        with self._lock:
            o = self._owners
            o.layer_pins.clear()
            slots = o.slot_of(keys)
            hit = slots >= 0
            o.touch(slots[hit])
            o.layer_pins.update(slots[hit].tolist())
            cand = keys[~hit]
            if not len(cand):
                return 0
            base = self._tag == "base"
            n, _ = self._load_now(cand, window, emergency=base, protect_hot=not base,
                                  scan=True, pins=o.layer_pins)
        self._fire_hooks()
        return n

    def mark_need_only(self, layers=None) -> int:
        """Bump ``need`` for this step's routed experts; promotes nothing (GATE_CAPTURE)."""
        if len(self._store) == 0:
            return 0
        routed = np.flatnonzero(self._snapshot(self.seen, self._fire_host))
        if layers is not None:
            routed = routed[np.isin(routed // self.E, [int(li) for li in layers])]
        with self._lock:
            self._owners.need[routed] += 1.0
        return int(len(routed))

    def step_begin(self) -> None:
        with self._lock:
            self._owners.step_pins.clear()
            self._owners.layer_pins.clear()

    # -- observability --------------------------------------------------------------------------
    def stats(self) -> dict:
        return dict(slots=self.n_slots, cached=int((self._mirror >= 0).sum()),
                    tick=self._owners.tick, promoted=self._n_promoted, evicted=self._n_evicted)

    def precision_of(self, layer: int, expert: int) -> str:
        return "fp4" if int(self._mirror[layer, expert]) >= 0 else "base"

    def precision_map(self) -> list[list[int]]:
        return (self._mirror >= 0).to(torch.int8).tolist()

    def close(self) -> None:
        """Stop the manager (RuntimeError if it is still running after 30 s), drain the
        side stream, release the host store."""
        self._closed = True
        self._stop_manager(30.0)
        try:
            if self._stream is not None:
                self._stream.synchronize()
        finally:
            self._store.release()


def mark_seen_row(seen_row: torch.Tensor, ids: torch.Tensor) -> None:
    """vLLM-Moet's ``mark_seen``: a 1 flag (uint8 ``seen``) or a +1 token count (int32)."""
    if seen_row.dtype == torch.int32:
        seen_row.index_add_(0, ids, torch.ones_like(ids, dtype=seen_row.dtype))
    else:
        seen_row.index_fill_(0, ids, 1)


__all__ = ["FirePhases", "TierstoreDeltaTier", "mark_seen_row", "W13_BYTES", "W2_BYTES", "SLOT_BYTES"]
