"""tierstore's native MoE tier (upstream vLLM's quant method drives it; tierstore.adapters.vllm).

Not vLLM-Moet's FP4 tier surface: that is ``tierstore.adapters.vllm_moet``. This
tier opens tierstore's own ``fp4`` and ``base`` packs and computes the routed MoE
output itself (``moe_w2_forward``). It reads the same VLLM_MOE_W2_* variables with
vLLM-Moet's meanings (``tierstore.adapters.moet_config``). Call sequence::

    tier = MoetTier.from_env(device="cuda")     # VLLM_MOE_W2_* read once
    ...allocate the KV cache...
    tier.finalize_auto()                        # size an "auto" pool from free VRAM
    tier.check_pool_floor(top_k, n_spec, max_num_seqs)   # after sizing
    tier.preload_pool()                         # pool-heat warm start, before capture
    ...capture CUDA graphs (the pool and slot table never move)...
    per step:
        tier.wait_manager_idle(timeout); tier.step_begin()
        forward: each MoE layer calls tier.mark_seen(l, ids) (in-graph) and
                 tier.moe_w2_forward(x, w, ids, l); prefill layers first call
                 tier.ensure_resident(l, ids) (eager)
        if gate fires: tier.force_promote(); replay (up to 3 rounds)
        tier.step_end()
    tier.shutdown()

``layer_key`` may be an int (slot-table row) or a module name with
``.layers.<n>.`` in it. The ``seen`` tensor may have extra rows (an MTP drafter
layer the pack does not hold): those are marked but never promoted.
"""
from __future__ import annotations

import os
import warnings

import numpy as np
import torch

from tierstore.errors import CapacityError, ConfigError
from tierstore.adapters.moet_config import VARIABLES, MoetEnv, from_env
from tierstore.adapters.moet_backend import TierstoreBackend

GIB = 1 << 30
GATE_FP_MAX = 3

# vLLM-Moet policy names -> tierstore pool policies (others behave as lru there)
POLICY_MAP = {"freq": "heat", "need": "hybrid", "lru": "lru"}

__all__ = ["MoetEnv", "MoetTier", "TierstoreBackend", "from_env", "POLICY_MAP", "VARIABLES",
           "layer_index"]


def layer_index(layer_key) -> int:
    if isinstance(layer_key, (int, np.integer)):
        return int(layer_key)
    from tierstore.adapters.vllm import layer_index_from_name
    return layer_index_from_name(str(layer_key))


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class MoetTier:
    """One rank's FP4 recovery tier: pack + ExpertStore + 2-bit base + ``seen`` marks.

    Thread safety: the engine's model-runner thread calls everything; the store's
    own manager and snapshot threads synchronise with it inside the store.
    """

    def __init__(self, config: MoetEnv, *, device="cuda", tag: str = "fp4",
                 base_tag: str | None = "base", rank: int = 0, world: int = 1,
                 pp: tuple[int, int] | None = None, extra_seen_rows: int = 0,
                 **store_options):
        from tierstore.compute.moe import BaseWeights
        from tierstore.format.pack import Pack
        if not config.store_dir:
            raise ConfigError("VLLM_MOE_W2_STORE_DIR is not set: the tier needs the pack directory")
        self.config, self.device = config, torch.device(device)
        self.rank, self.world, self.pp, self.tag = rank, world, pp, tag
        self.pack = Pack.open(config.store_dir, tag=tag, rank=rank, world=world, pp=pp)
        self.pack_path = self.pack.path
        self.n_layers, self.n_experts = self.pack.n_layers, self.pack.n_experts
        self.hidden_size = self.intermediate_size = None
        self.base = None
        if base_tag is not None:
            base_pack = Pack.open(config.store_dir, tag=base_tag, rank=rank, world=world, pp=pp)
            self.base = BaseWeights.from_pack(base_pack, device=self.device)
            self.hidden_size, self.intermediate_size = self.base.H, self.base.I
            base_pack.close()
        # seen: uint8 0/1 per (layer, expert), fixed address (graphs capture it). One
        # spare column takes the marks of invalid ids (-1 padding) so mark_seen needs
        # no masking: 4 device ops per layer.
        self._seen_buf = torch.zeros(self.n_layers + int(extra_seen_rows), self.n_experts + 1,
                                     dtype=torch.uint8, device=self.device)
        self.seen = self._seen_buf[:, : self.n_experts]
        self._store_options = dict(store_options)
        self.store = None
        self._pending_floor: tuple[int, int, int] | None = None
        self._fire_pins: list = []
        self._snapshot = None
        self._closed = False
        if not config.enabled:
            raise ConfigError(f"VLLM_MOE_W2_DELTA_GB={config.delta_gb_raw}: <= 0 means no FP4 "
                              "tier (use auto or a GiB value > 0)")
        if not config.delta_auto:
            self._build_store(config.initial_slots(self.pack.slot_bytes))

    @classmethod
    def from_env(cls, environ=None, **kwargs) -> "MoetTier":
        return cls(from_env(environ), **kwargs)

    # -- the store --------------------------------------------------------------
    def _build_store(self, n_slots: int) -> None:
        from tierstore.store.expert_store import ExpertStore
        cfg = self.config
        ram_gb = cfg.ts_ram_gb
        policy = POLICY_MAP.get(cfg.policy, "lru")
        options = {"threads": cfg.store_threads, "direct": cfg.ts_direct,
                   # DECAY/DECAY_S is a half-life only for the heat-like policies; the
                   # store refuses one given to lru
                   "half_life_s": (cfg.half_life_s or None) if policy in ("heat", "hybrid") else None,
                   "lazy_per_step": 0 if cfg.policy == "need" else cfg.promote_per_pass,
                   # a prefill keeps the hottest half of the pool (vLLM-Moet's ensure_resident)
                   "scan_keep": 0.5}
        options.update(self._store_options)
        self.store = ExpertStore(self.pack, vram_slots=int(n_slots), ram_gb=ram_gb,
                                 policy=policy, device=str(self.device),
                                 max_promote=self._cap(cfg.gate_max_promote, n_slots), **options)
        if ram_gb > 0:
            from tierstore.warm import arena_heat_path
            heat = arena_heat_path(self.pack.path)
            if os.path.exists(heat):
                from tierstore.warm import preheat
                preheat(self.store, heat, pool_fill=0.0)
        if self._pending_floor is not None:
            self.check_pool_floor(*self._pending_floor)

    @staticmethod
    def _cap(max_promote: int, n_slots: int) -> int:
        """GATE_MAX_PROMOTE <= 0 means unlimited: at most the whole pool."""
        return int(max_promote) if max_promote > 0 else int(n_slots)

    def _need_store(self, what: str):
        if self._closed:
            from tierstore.errors import ClosedError
            raise ClosedError(f"MoetTier.{what} after shutdown()")
        if self.store is None:
            raise ConfigError(f"MoetTier.{what}: VLLM_MOE_W2_DELTA_GB=auto and the pool is not "
                              "sized yet; call finalize_auto() after the KV cache is allocated")
        return self.store

    @property
    def slot_table(self) -> torch.Tensor:
        return self._need_store("slot_table").slot_table

    @property
    def pool(self) -> torch.Tensor:
        return self._need_store("pool").pool

    @property
    def n_slots(self) -> int | None:
        return None if self.store is None else int(self.store.n_slots)

    def finalize_auto(self, free_bytes: int | None = None) -> int:
        """Size an "auto" pool: free device memory (after the KV cache) minus
        DELTA_RESERVE_GB, capped by DELTA_MAX_GB; then run a deferred floor check.
        A no-op for a pool already sized. Returns the slot count."""
        if self.store is None:
            from tierstore.store.sizing import resolve_pool_slots
            cfg = self.config
            n = resolve_pool_slots(slot_bytes=self.pack.slot_bytes,
                                   n_keys=self.n_layers * self.n_experts, device=self.device,
                                   vram_gb="auto", reserve_gb=cfg.reserve_gb,
                                   max_gb=cfg.max_gb, available=free_bytes)
            self._build_store(n)
        return self.n_slots

    def check_pool_floor(self, top_k: int, n_spec: int = 0, max_num_seqs: int = 1) -> int:
        """Refuse a pool under the fire floor (warn with VLLM_MOE_W2_FORCE_POOL=1).

        Before an "auto" pool is sized the check is remembered and run by
        finalize_auto (the reference checked too early and refused to start).
        Returns the floor in slots.
        """
        from tierstore.store.sizing import fire_floor
        floor = fire_floor(self.n_layers, top_k, n_spec, max_num_seqs, GATE_FP_MAX)
        if self.store is None:
            self._pending_floor = (top_k, n_spec, max_num_seqs)
            return floor
        self._pending_floor = None
        n = self.n_slots
        if n < floor:
            sb = self.pack.slot_bytes
            msg = (f"{self.pack_path}: pool of {n} slots ({n * sb / GIB:.2f} GiB) is under the fire "
                   f"floor of {floor} slots ({floor * sb / GIB:.2f} GiB) for {self.n_layers} layers, "
                   f"top_k={top_k}, n_spec={n_spec}, max_num_seqs={max_num_seqs}")
            if not self.config.force_pool:
                raise CapacityError(msg + "; raise VLLM_MOE_W2_DELTA_GB or set VLLM_MOE_W2_FORCE_POOL=1")
            warnings.warn(msg + "; continuing because VLLM_MOE_W2_FORCE_POOL=1", RuntimeWarning,
                          stacklevel=2)
        return floor

    def preload_pool(self) -> int:
        """Pool-heat warm start (VLLM_MOE_W2_TIERSTORE_POOL_HEAT=1; POOL_HEAT is vLLM-Moet's
        base tier's): preload up to 0.9 of the pool from the heat file, then start its periodic snapshot. Call
        before CUDA-graph capture. Returns the pool rows loaded."""
        store = self._need_store("preload_pool")
        cfg = self.config
        if not cfg.ts_pool_heat:
            return 0
        from tierstore.warm import PeriodicSnapshot, pool_heat_name, preheat
        path = os.path.join(cfg.store_dir, pool_heat_name(self.tag, self.rank, self.world, self.pp))
        loaded = 0
        if os.path.exists(path):
            loaded = preheat(store, path, pool_fill=0.9).pool_rows
        if self._snapshot is None:
            self._snapshot = PeriodicSnapshot(store, path, every_s=10.0,
                                              fmt="pool-heat").start()
        return int(loaded)

    # -- in-graph --------------------------------------------------------------
    def mark_seen(self, layer_key, topk_ids: torch.Tensor) -> None:
        """Mark this layer's routed experts in ``seen``: pure device ops, no host sync,
        fixed shapes, so it is captured into CUDA graphs. Ids < 0 (skipped) are ignored."""
        E = self.n_experts
        # any id < 0 -> -1 -> E, any id >= E -> E: the spare column
        column = topk_ids.reshape(-1).to(torch.long).clamp(-1, E).remainder_(E + 1)
        self._seen_buf[layer_index(layer_key)].index_fill_(0, column, 1)

    def moe_w2_forward(self, x, topk_weights, topk_ids, layer_key) -> torch.Tensor:
        """Routed-only MoE output [T, H] (FP4 rows from the pool, else the 2-bit base)."""
        from tierstore.compute.moe import fused_moe
        if self.base is None:
            raise ConfigError(f"{self.pack_path}: no base pack was opened (base_tag=None); "
                              "moe_w2_forward needs the 2-bit base for non-resident experts")
        return fused_moe(x, topk_weights, topk_ids, layer_index(layer_key),
                         self._need_store("moe_w2_forward"), self.base)

    # -- eager, at step boundaries ---------------------------------------------
    def seen_pairs(self) -> np.ndarray:
        """int64 [N, 2] (layer, expert) marked this step in layers the pack holds (one host read)."""
        marked = self.seen[: self.n_layers].nonzero().cpu().numpy()
        return marked.astype(np.int64).reshape(-1, 2)

    def ensure_resident(self, layer_key, topk_ids: torch.Tensor):
        """Prefill: make this layer's routed experts resident before its forward, as a
        scan (free slots first; with VLLM_MOE_W2_TIER_SCAN=1 the hottest half of the
        pool is never evicted), pinned until the next layer's call or step_end.
        Eager only: it reads disk, so it is refused during CUDA-graph capture."""
        if _capturing():
            raise ConfigError("MoetTier.ensure_resident during CUDA-graph capture: prefill "
                              "residency reads disk and must run eagerly")
        store = self._need_store("ensure_resident")
        ids = topk_ids.reshape(-1)
        ids = ids[(ids >= 0) & (ids < self.n_experts)]
        return store.ensure_resident(layer_index(layer_key), ids)

    def force_promote(self, max_promote: int | None = None, pin: bool = True):
        """A fire: promote the experts marked seen this step (ranked by the store,
        at most ``max_promote``, default VLLM_MOE_W2_GATE_MAX_PROMOTE), synchronously,
        pinned until step_end when ``pin``. Returns the store's FireResult."""
        store = self._need_store("force_promote")
        cap = (self._cap(self.config.gate_max_promote, store.n_slots) if max_promote is None
               else int(max_promote))
        result = store.fire(self.seen_pairs(), max_promote=cap)
        if pin:
            self._fire_pins.append(result)
        else:
            store.release(result)
        return result

    def step_begin(self) -> None:
        self._need_store("step_begin")
        self._seen_buf.zero_()

    def step_end(self) -> None:
        """Record this step's routing (heat), release the step's fire pins, advance
        the store (folds heat, releases the prefill pin, decays, queues lazy
        promotions), clear ``seen``. One host read of ``seen``."""
        store = self._need_store("step_end")
        pairs = self.seen_pairs()
        if len(pairs):
            layers, starts = np.unique(pairs[:, 0], return_index=True)
            for layer, ids in zip(layers, np.split(pairs[:, 1], starts[1:])):
                store.record(int(layer), torch.from_numpy(ids))
        self._seen_buf.zero_()
        self._release_pins()
        store.step()

    def _release_pins(self) -> None:
        store = self.store
        for result in reversed(self._fire_pins):
            store.release(result)
        self._fire_pins.clear()

    def wait_manager_idle(self, timeout: float | None = None) -> bool:
        """Wait until the store's background promotions are done; False on timeout."""
        return bool(self._need_store("wait_manager_idle").wait_idle(timeout))

    def backend(self) -> TierstoreBackend:
        return TierstoreBackend(self._need_store("backend"))

    def shutdown(self) -> None:
        """Release pins, write a last pool-heat snapshot, close the store. Idempotent."""
        if self._closed:
            return
        if self.store is not None:
            self._release_pins()
            if self._snapshot is not None:
                self._snapshot.stop(final=True)
            self.store.close()
        self.pack.close()
        self._closed = True

    def __enter__(self) -> "MoetTier":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
