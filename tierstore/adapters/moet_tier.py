"""``TierstoreDeltaTier``: vLLM-Moet's FP4 tier object (``moe_w2_delta.DeltaTier``) as a face
over one ExpertStore.

Every attribute and method vLLM-Moet's glue, gate, runners and worker use
(MOET-SURFACE.md section 1), in its terms, and nothing of its own: the pool, the slot
table, publishing, victims and the background reads are the store's. docs/VLLM_MOET.md
has the call-by-call table ("What changes"); in short, the store is opened with
``vram_slots="deferred"`` and ``publish="step"`` over the tier's slot table, a fire is
``force_promote``, a step ``step_end``, and ``wait_manager_idle`` publishes what the
store's worker read. ``dev`` may be a CPU device (the pool is then host memory): how the
surface is tested without a GPU.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from tierstore import settings
from tierstore.adapters.moet_config import MoetEnv, from_env
from tierstore.adapters.moet_store import MoetPack
from tierstore.errors import CapacityError, ConfigError
from tierstore.format.sidecar import MAX_KEYS
from tierstore.store.pool import new_slot_table, unsized_pool

log = logging.getLogger("tierstore.adapters.moet")

W13_BYTES = 4096 * 4096 // 2  # DS4 TP1 fp4 w13 plane per expert (8 MiB)
W2_BYTES = 4096 * 2048 // 2  # DS4 TP1 fp4 w2 plane per expert (4 MiB)
SLOT_BYTES = W13_BYTES + W2_BYTES
_POLICIES = {"need": "need", "freq": "freq"}  # anything else: vLLM-Moet's lru-like rule


class TierstoreDeltaTier:
    """One process's FP4 recovery tier. The runner thread calls every method."""

    def __init__(
        self,
        n_layers: int,
        n_experts: int,
        dev,
        w13_bytes: int = W13_BYTES,
        w2_bytes: int = W2_BYTES,
        pool_gb: float | None = None,
        policy: str | None = None,
        tag: str = "delta",
        host_pinned: bool = True,
        env: MoetEnv | None = None,
    ):
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
        if self.n_layers * self.E > MAX_KEYS:  # before the slot table is allocated
            raise ConfigError(
                f"moet tier [{tag}]: {self.n_layers} layer rows x {self.E} experts "
                f"= {self.n_layers * self.E} keys, over a pack's limit of "
                f"{MAX_KEYS} (check VLLM_MOE_W2_NUM_LAYERS)"
            )
        self._auto_pending = env.delta_auto and pool_gb is None
        if pool_gb is None:
            self._want_slots = env.initial_slots(self.slot_bytes)
        else:
            gib = settings.argument("pool_gb", pool_gb, settings.number(None, settings.GIB_MAX))
            self._want_slots = max(int(gib * (1 << 30)) // self.slot_bytes, 8)
        # more slots than keys would never be used (the store caps a pool at its keys too)
        self._want_slots = min(self._want_slots, self.n_layers * self.E)
        self.slot_table = new_slot_table(self.n_layers, self.E, dev)
        self._unsized_pool = unsized_pool(self.slot_bytes, dev)
        seen_dtype = torch.int32 if env.count_seen else torch.uint8
        self.seen = torch.zeros(self.n_layers, self.E, dtype=seen_dtype, device=dev)
        self.seen_w = torch.zeros(self.n_layers, self.E, dtype=torch.float32, device=dev)
        self.mutate_hooks: list = []
        # step_end's host copies of ``seen`` (two: one folded a step late, one in flight)
        self._seen_host = [
            torch.zeros(self.n_layers, self.E, dtype=seen_dtype, pin_memory=self._cuda) for _ in range(2)
        ]
        self._flip, self._pending = 0, None
        self._store = MoetPack(env, tag, self.n_layers, self.E, self.slot_bytes)
        self.expert_store = None  # the ExpertStore, opened by the first serving call
        self._step_fires: list = []  # FireResults pinned until step_end
        self._closed = False
        self._refused: str | None = None  # a floor refusal finalize_auto's caller swallowed
        self._deferred_floor = None  # set by check_pool_floor while auto is pending
        self._win_active = 0.0
        self._kpi_unfixed = self._kpi_deferred = 0
        # Routing capture (DELTA_CAPTURE, vLLM-Moet's variable, or TIERSTORE_CAPTURE): the
        # seen table of every step, bounded, written atomically (tierstore/sim/capture.py)
        self._capture = _routing_capture(env, tag, self.n_layers, self.E)
        self._capture_fired = None  # a fired step's routing, read before force_promote
        self._metrics = None  # tierstore.metrics handle of the open store
        if self._auto_pending:
            log.info(
                "moet tier [%s]: auto pool deferred until after the KV cache (slot %.2f MiB)",
                tag,
                self.slot_bytes / 2**20,
            )

    # -- what the glue reads -----------------------------------------------------------------
    @property
    def n_slots(self) -> int:
        """Always an int: the store's pool once sized, else what it will be (0 for auto)."""
        es = self.expert_store
        if es is not None and es.sized:
            return int(es.n_slots)
        return 0 if self._auto_pending else self._want_slots

    @property
    def pool(self) -> torch.Tensor:
        es = self.expert_store
        return es.pool if es is not None else self._unsized_pool

    @property
    def _thread(self):
        es = self.expert_store
        return None if es is None else es._worker.thread

    @property
    def _freq(self) -> torch.Tensor:
        """The pool policy's scores per (layer, expert) (vLLM-Moet's ``_freq`` / ``_need``)."""
        es = self.expert_store
        if es is None:
            return torch.zeros(self.n_layers, self.E, dtype=torch.float64)
        return torch.from_numpy(es.pool_policy.scores().reshape(self.n_layers, self.E).copy())

    _need = _freq

    # -- load time ------------------------------------------------------------------------
    def add_layer_host_planes(self, layer_key: int, w13_plane_gpu, w2_plane_gpu) -> None:
        """Stage one layer's [E, bytes] uint8 w13 and w2 planes (D2H, synchronous)."""
        self.add_layer_host_sections(layer_key, (w13_plane_gpu,), (w2_plane_gpu,))

    def add_layer_host_sections(self, layer_key: int, parts13, parts2) -> None:
        """Write one layer given as column sections; a layer the pack holds is skipped."""
        if self._store.add_layer(layer_key, (*parts13, *parts2)) and self.expert_store is not None:
            log.warning(
                "moet tier [%s]: layer %s added after serving began: the store is reopened (pool emptied)",
                self._tag,
                layer_key,
            )
            self._close_store()

    def start(self) -> None:
        """vLLM-Moet starts its manager thread here; the store's worker starts with it."""

    def _open_store(self):
        """The ExpertStore over the pack (opened once loading is over; None with no layer)."""
        if self.expert_store is not None or self._closed or len(self._store) == 0:
            return self.expert_store
        from tierstore.store.expert_store import ExpertStore

        env = self.env
        half_life = env.half_life_s
        name = _POLICIES.get(self._policy, "lru")
        policy = {"name": name, "half_life_s": half_life} if name != "lru" and half_life else name
        checks = {"verify": "always"} if env.ts_checksums else {}  # else TIERSTORE_VERIFY's
        es = ExpertStore(
            self._store.finish(),
            vram_slots="deferred",
            ram_gb=env.ts_ram_gb,
            policy=policy,
            device=str(self.dev),
            max_promote=0,
            threads=env.store_threads,
            direct=env.ts_direct,
            **checks,
            lazy_per_step=0 if name == "need" else env.promote_per_pass,
            publish="step",
            lazy_admission="all",
            scan_keep=0.5,
            slot_table=self.slot_table,
            reserve_gb=env.reserve_gb,
            max_gb=env.max_gb,
        )
        self.expert_store = es
        self._metrics = _register_metrics(es, self._tag, self.dev)
        if not self._auto_pending:
            try:
                es.finalize(self._want_slots)
            except CapacityError as exc:
                raise CapacityError(f"VLLM_MOE_W2_DELTA_GB={env.delta_gb_raw}: {exc}") from None
            log.info(
                "moet tier [%s]: %d slots x %.2f MiB over %s",
                self._tag,
                es.n_slots,
                self.slot_bytes / 2**20,
                es.pack.path,
            )
        return es

    def finalize_auto(self, free_bytes: int | None = None) -> None:
        """Size an auto pool from memory free now (after the KV cache) minus
        DELTA_RESERVE_GB, capped by DELTA_MAX_GB; no room: 0 slots, the tier is inert.
        A no-op unless auto is pending. Runs the floor check check_pool_floor deferred;
        below the floor (without FORCE_POOL) the tier refuses every later step, since
        the worker that calls this only logs what it raises."""
        if not self._auto_pending:
            return
        es = self._open_store()  # while auto is pending: opened unsized
        self._auto_pending = False
        n = 0 if es is None else es.finalize("auto", free_bytes=free_bytes)
        log.info(
            "moet tier [%s] auto: %d slots (%.2f GiB)%s",
            self._tag,
            n,
            n * self.slot_bytes / 2**30,
            "" if n else ": inert",
        )
        deferred, self._deferred_floor = self._deferred_floor, None
        try:
            if deferred is not None:
                deferred()
        except Exception as exc:
            self._refused = str(exc)
            raise
        finally:
            if n == 0:  # vLLM-Moet's inert tier: no pool, the pack let go (kept on disk)
                self._want_slots = 0
                self._close_store()
                self._store.release()

    # -- serving ------------------------------------------------------------------------------
    def _serving(self, what: str):
        if self._refused is not None:
            raise RuntimeError(f"moet tier [{self._tag}]: {what} refused: {self._refused}")
        return self._open_store()

    def wait_manager_idle(self, timeout: float = 60.0) -> None:
        """Before a forward, as vLLM-Moet's: wait for the background reads the last step
        end queued (host reads only; RuntimeError after ``timeout`` s), then publish them
        so this forward uses them. Raises when the boot's floor check refused."""
        es = self._serving("step")
        if es is None or not es.sized or _capturing(self._cuda):
            return
        if not es.wait_idle(timeout):
            raise RuntimeError(
                f"moet tier [{self._tag}]: the store's worker did not reach "
                f"a safe point within {timeout:.0f} s"
            )
        es.publish(stream=self._stream())
        self._fire_hooks()

    def notify_capture(self) -> None:
        """Called by the glue while a CUDA graph is being captured: no CUDA call here,
        and the store's worker makes none."""

    def _routed(self, zero: bool) -> tuple[np.ndarray, np.ndarray]:
        """(dense keys routed since the last step end, their counts), from ``seen`` as the
        forward left it (one host sync); ``zero`` clears ``seen`` (and ``seen_w``)."""
        counts = self.seen.to("cpu").numpy().reshape(-1).astype(np.int64)
        if self._capture is not None and self._capture_fired is None:
            # force_promote clears seen: the step's forward routing is captured from here
            self._capture_fired = counts.reshape(self.n_layers, self.E)
        if zero:
            self.seen.zero_()
            self.seen_w.zero_()
        return np.flatnonzero(counts), counts

    def _pairs(self, keys: np.ndarray, layers=None) -> np.ndarray:
        """(layer, expert) pairs of ``keys`` in layers the pack holds (and in ``layers``)."""
        held = np.zeros(self.n_layers, bool)
        held[sorted(self._store.layers)] = True
        if layers is not None:
            chosen = np.zeros(self.n_layers, bool)
            chosen[[int(li) for li in layers]] = True
            held &= chosen
        keys = keys[held[keys // self.E]]
        return np.stack([keys // self.E, keys % self.E], axis=1)

    def _stream(self):
        return torch.cuda.current_stream(self.dev) if self._cuda else None

    def force_promote(self, layers=None, max_promote=None, pin: bool = True) -> int:
        """Pull this step's routed, unmapped experts into the pool, synchronously, at most
        ``max_promote`` (None = no cap), ranked by the policy, without admission control;
        with ``pin`` every routed expert stays pinned until step_end. Returns experts mapped."""
        es = self._serving("force_promote")
        if self._closed or es is None:
            return 0
        routed, _counts = self._routed(zero=True)
        pairs = self._pairs(routed, layers)
        if not len(pairs):
            return 0
        cap = len(pairs) if max_promote is None else min(max(int(max_promote), 0), len(pairs))
        result = es.fire(pairs, max_promote=cap, stream=self._stream())
        (self._step_fires.append if pin else es.release)(result)
        short = result.no_slot
        if short:
            if self._policy == "need" or not pin:
                self._kpi_deferred += short
            else:
                self._kpi_unfixed += short
                log.warning(
                    "moet tier [%s]: %d routed experts got no slot (pool %d); raise VLLM_MOE_W2_DELTA_GB",
                    self._tag,
                    short,
                    self.n_slots,
                )
        self._fire_hooks()
        return int(result.promoted)

    def ensure_resident(self, layer_key: int, ids: torch.Tensor) -> int:
        """Prefill (eager): make one layer's routed experts resident, pinned until the next
        call or step_end, never evicting the hottest half of the pool. Returns fetched."""
        es = self._serving("ensure_resident")
        if self._closed or es is None or layer_key not in self._store:
            return 0
        ids = ids.reshape(-1).unique().long()
        mark_seen_row(self.seen[layer_key], ids.to(self.dev))
        ids = ids[(ids >= 0) & (ids < self.E)]
        result = es.ensure_resident(int(layer_key), ids.cpu().numpy(), stream=self._stream())
        self._fire_hooks()
        return int(result.promoted)

    def mark_need_only(self, layers=None) -> int:
        """Count ``need`` for this step's routed experts; promotes nothing (GATE_CAPTURE):
        a fire with a cap of 0, released at once."""
        es = self._serving("mark_need_only")
        if es is None:
            return 0
        pairs = self._pairs(self._routed(zero=False)[0], layers)
        if len(pairs):
            es.release(es.fire(pairs, max_promote=0, stream=self._stream()))
        return int(len(pairs))

    def step_begin(self) -> None:
        self._release_fires()

    def step_end(self) -> None:
        """Close the step: the routing marked in ``seen`` goes to the store's heat, the
        step's fires are released, and the store's step publishes what its worker read.

        No host sync in the common case: ``seen`` is copied to the host on the forward
        stream and folded one step later. Only when the store has rows to publish is this
        step's copy waited for (one sync), so that no victim is an expert it routed."""
        if self._closed:
            return
        es = self._open_store()
        if es is None:
            self.seen.zero_()
            return
        host = self._seen_host[self._flip]
        self._flip ^= 1
        host.copy_(self.seen, non_blocking=self._cuda)
        event = None
        if self._cuda:
            event = torch.cuda.Event()
            event.record()
        self.seen.zero_()
        self._fold_pending()  # the previous step's copy: long done
        fired, self._capture_fired = self._capture_fired, None
        self._pending = (host, event, fired)
        publish = es.publish_pending
        if publish or not self._cuda:
            self._fold_pending()  # this step's: waited for when publishing
        self._release_fires()
        es.step(stream=self._stream(), publish=publish or not self._cuda)
        self._fire_hooks()

    def _fold_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        host, event, fired = pending
        if event is not None and not event.query():
            event.synchronize()
        counts = host.numpy()
        self._win_active += float(counts.sum())
        self.expert_store.record_counts(counts)
        if self._capture is not None:  # a fired step: its forward's routing, not the replay's
            self._capture.record_counts(counts if fired is None else fired)
            self._capture.step()

    def _release_fires(self) -> None:
        fires, self._step_fires = self._step_fires, []
        for result in fires:
            self.expert_store.release(result)

    def _fire_hooks(self) -> None:
        for hook in self.mutate_hooks:
            hook()

    # -- observability --------------------------------------------------------------------------
    def stats(self) -> dict:
        es = self.expert_store
        if es is None:
            return dict(slots=self.n_slots, cached=0, tick=0, promoted=0, evicted=0)
        pool = es.stats().pool
        return dict(
            slots=self.n_slots,
            cached=int(pool.resident),
            tick=es.step_count,
            promoted=int(pool.promotions),
            evicted=int(pool.evictions),
        )

    def precision_of(self, layer: int, expert: int) -> str:
        return "fp4" if int(self.slot_table[layer, expert]) >= 0 else "base"

    def precision_map(self) -> list[list[int]]:
        return (self.slot_table >= 0).to(torch.int8).cpu().tolist()

    def _close_store(self) -> None:
        es, self.expert_store = self.expert_store, None
        self._step_fires = []
        handle, self._metrics = self._metrics, None
        if handle is not None:
            handle.close()  # its last values written first (multiprocess mode)
        if es is not None:
            es.close()

    def close(self) -> None:
        """Close the store (its worker, engine and pack lock), then the pack writer; a
        process-private pack is removed; a routing capture is written."""
        self._closed = True
        try:
            self._close_store()
        finally:
            self._store.release()
            capture, self._capture = self._capture, None
            if capture is not None:
                try:
                    path = capture.close()
                    if path is not None:
                        log.info("moet tier [%s]: routing capture written to %s", self._tag, path)
                except Exception as exc:  # noqa: BLE001 - a diagnostic must not fail shutdown
                    log.warning("moet tier [%s]: routing capture not written: %s", self._tag, exc)


def _register_metrics(store, tag: str, dev):
    """The store on the engine's /metrics (docs/METRICS.md); a refusal (labels taken by
    another open store of this process) is logged: metrics must not stop serving."""
    from tierstore import metrics
    from tierstore.errors import ConfigError

    try:
        return metrics.register_store(store, {"tag": tag, "device": str(dev)})
    except ConfigError as exc:
        log.warning("moet tier [%s]: no metrics for this store: %s", tag, exc)
        return None


def _routing_capture(env: MoetEnv, tag: str, n_layers: int, n_experts: int):
    """The tier's RoutingCapture, or None: DELTA_CAPTURE (bounded by DELTA_CAPTURE_TICKS
    steps) or else the TIERSTORE_CAPTURE setting."""
    from tierstore.sim.capture import RoutingCapture

    meta = {
        "num_experts": int(n_experts),
        "engine": "vLLM-Moet (tierstore face)",
        "tier": tag,
        "slot_table_rows": int(n_layers),
        "weights": "token counts" if env.count_seen else "one row per routed expert a step",
    }
    if env.capture:
        return RoutingCapture(env.capture, max_steps=env.capture_ticks, meta=meta)
    return RoutingCapture.from_settings(meta)


def _capturing(cuda: bool) -> bool:
    return cuda and torch.cuda.is_current_stream_capturing()


def mark_seen_row(seen_row: torch.Tensor, ids: torch.Tensor) -> None:
    """vLLM-Moet's ``mark_seen``: a 1 flag (uint8 ``seen``) or a +1 token count (int32)."""
    if seen_row.dtype == torch.int32:
        seen_row.index_add_(0, ids, torch.ones_like(ids, dtype=seen_row.dtype))
    else:
        seen_row.index_fill_(0, ids, 1)


__all__ = ["TierstoreDeltaTier", "mark_seen_row", "W13_BYTES", "W2_BYTES", "SLOT_BYTES"]
