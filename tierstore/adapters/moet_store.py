"""The FP4 tier's host stores: vLLM-Moet's store interface, served by tierstore.

Both stores answer what the tier asks (vLLM-Moet's ``moe_w2_store`` interface):
``layer_key in store``, ``len(store)``, ``add_layer(layer_key, parts)``,
``rows_for(pairs, scan=False) -> list[Tensor]``, ``release()``, ``stats()``.

* ``HostRowStore`` (VLLM_MOE_W2_STORE_DIR unset): per-layer ``[E, slot_bytes]``
  host tensors, pinned when asked and CUDA is present (without CUDA: pageable, and the
  pool is host memory too); rows are views valid until ``release``.
* ``PackRowStore`` (STORE_DIR set): the layer is written into a tierstore pack
  in that directory by ``PackWriter`` (crash-safe, resumable; vLLM-Moet's name
  ``<tag>.v2.<key20>.rank<r>of<w>.pack`` and sidecar, so both engines read it),
  and a later boot that finds the layer skips it. Reads go through an
  ``ExpertStore`` (its RAM arena, VLLM_MOE_W2_TIERSTORE_RAM_GB, and its native
  engine), opened on the tier's CUDA device when the tier is on CUDA (so the engine
  may write device memory; on the host otherwise), with ``ExpertStore.read_rows``
  into a page-aligned, pinned stage; rows are views of the stage, valid until the
  next ``rows_for`` (vLLM-Moet's rule), or into ``out`` when the caller passes its own
  stage. ``rows_into(pairs, pool, slots, scan)`` is the direct path: row ``i``
  straight into ``pool[slots[i]]`` by the engine (H2D from the arena or its pinned
  stages on a CUDA pool), ordered after the streams that may still read those
  slots, returning once the bytes are in. With
  VLLM_MOE_W2_TIERSTORE_VERIFY=1 the engine checks each row read from the file
  against the sidecar's XXH3-64 (natively, in its reader threads).

Besides vLLM-Moet's ``rows_for`` (a list of row views), both stores serve the tier's
batched copy (adapters/moet_copy.py): ``rows_block(pairs, scan=False, out=None)`` is the
rows as one host ``[n, slot_bytes]`` tensor (a view of ``out`` or of the store's own
stage, valid until the next call on that stage) and ``alloc_stage(n)`` a caller-owned
stage (the manager's), pinned when CUDA is present.

Thread safety: the tier calls both under its own lock.
"""
from __future__ import annotations

import logging
import os

import numpy as np
import torch

from tierstore.adapters.moet_config import QUANTIZER_ABI, MoetEnv
from tierstore.errors import ConfigError, FormatError, TierIOError

log = logging.getLogger("tierstore.adapters.moet")


def _joined(parts, E: int, slot_bytes: int, what: str) -> torch.Tensor:
    """Host uint8 [E, slot_bytes] from column sections (D2H, synchronous)."""
    host = torch.empty(E, slot_bytes, dtype=torch.uint8)
    off = 0
    for t in parts:
        if t.dim() != 2 or t.shape[0] != E or t.dtype != torch.uint8:
            raise ConfigError(f"{what}: sections must be uint8 [{E}, n], found "
                              f"{t.dtype} {list(t.shape)}")
        if off + t.shape[1] > slot_bytes:
            break
        host[:, off:off + t.shape[1]].copy_(t)
        off += t.shape[1]
    if off != slot_bytes or sum(int(t.shape[1]) for t in parts) != slot_bytes:
        raise ConfigError(f"{what}: sections total {sum(int(t.shape[1]) for t in parts)} bytes "
                          f"per expert, expected slot_bytes={slot_bytes}")
    return host


def checkpoint_id(env: MoetEnv) -> str | None:
    """VLLM_MOE_W2_CKPT_ID, else (under vLLM-Moet) the id its planes cache derives from
    the checkpoint, so both engines name the same pack; None when neither is known."""
    if env.ckpt_id:
        return env.ckpt_id
    try:
        from vllm.model_executor.layers.quantization.utils import moe_w2_planes_cache
        return str(getattr(moe_w2_planes_cache, "_ckpt_id")()) or None
    except Exception:  # noqa: BLE001 - no vLLM-Moet or no current config: unverified
        return None


def rank_info() -> tuple[int, int, tuple[int, int] | None]:
    """(tp rank, tp world, pp) as vLLM-Moet names its packs; (0, 1, None) without vLLM."""
    try:
        from vllm.distributed import (get_pp_group, get_tensor_model_parallel_rank,
                                      get_tensor_model_parallel_world_size)
        rank, world = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
        pp = get_pp_group()
        return rank, world, ((pp.rank_in_group, pp.world_size) if pp.world_size > 1 else None)
    except Exception:  # noqa: BLE001 - no vLLM or no distributed state: one rank
        return 0, 1, None


class HostRowStore:
    """Per-layer host rows (no pack)."""

    def __init__(self, n_layers: int, n_experts: int, slot_bytes: int, pinned: bool = True):
        self.n_layers, self.E, self.slot_bytes = int(n_layers), int(n_experts), int(slot_bytes)
        self._pinned = bool(pinned) and torch.cuda.is_available()
        self._layers: dict[int, torch.Tensor] = {}
        self._stage: torch.Tensor | None = None

    def __contains__(self, layer_key) -> bool:
        return int(layer_key) in self._layers

    def __len__(self) -> int:
        return len(self._layers)

    def add_layer(self, layer_key: int, parts) -> None:
        what = f"host store layer {layer_key}"
        if not 0 <= int(layer_key) < self.n_layers:
            raise ConfigError(f"{what}: outside [0, {self.n_layers})")
        host = _joined(parts, self.E, self.slot_bytes, what)
        self._layers[int(layer_key)] = host.pin_memory() if self._pinned else host

    def rows_for(self, pairs, scan: bool = False, out=None) -> list[torch.Tensor]:
        return [self._layers[int(li)][int(ei)] for li, ei in pairs]

    def alloc_stage(self, n: int) -> torch.Tensor:
        """A host [n, slot_bytes] stage, pinned like the layers (a CUDA call when pinned:
        the runner thread allocates, the manager only fills)."""
        stage = torch.empty(max(int(n), 1), self.slot_bytes, dtype=torch.uint8)
        return stage.pin_memory() if self._pinned else stage

    def rows_block(self, pairs, scan: bool = False, out=None) -> torch.Tensor:
        """The rows of ``pairs`` gathered into ``out`` (or the store's own stage, which grows
        on the calling thread) as one [n, slot_bytes] tensor: one index_select per layer,
        straight into place when that layer's pairs are consecutive (the tier sorts them)."""
        keys = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        n = len(keys)
        if out is None:
            if self._stage is None or self._stage.shape[0] < n:
                rows = max(n, 2 * (0 if self._stage is None else self._stage.shape[0]))
                self._stage = self.alloc_stage(rows)
            out = self._stage
        block = out[:n, :self.slot_bytes]
        layers = keys[:, 0]
        cut = np.flatnonzero(np.diff(layers)) + 1
        for a, b in zip([0, *cut.tolist()], [*cut.tolist(), n]):   # runs of one layer
            layer = int(layers[a])
            if layer not in self._layers:
                raise ConfigError(f"host store: layer {layer} was never added")
            experts = torch.from_numpy(np.ascontiguousarray(keys[a:b, 1]))
            if block.is_contiguous():
                torch.index_select(self._layers[layer], 0, experts, out=block[a:b])
            else:
                block[a:b] = self._layers[layer].index_select(0, experts)
        return block

    def release(self) -> None:
        self._layers = {}
        self._stage = None


class PackRowStore:
    """Rows in a tierstore pack in ``env.store_dir`` (see the module doc)."""

    def __init__(self, env: MoetEnv, tag: str, n_layers: int, n_experts: int, slot_bytes: int,
                 device=None):
        from tierstore.format.sidecar import PackName, key20_of, round_up
        self.env, self.tag = env, tag
        self.device = torch.device("cpu" if device is None else device)
        self._engine_dev: str | None = None
        self.n_layers, self.E, self.slot_bytes = int(n_layers), int(n_experts), int(slot_bytes)
        self.stride = round_up(self.slot_bytes)
        # vLLM-Moet never trusts a pack across boots without a checkpoint id: such a pack
        # gets a process-local name, exactly as there.
        self.ckpt_id = checkpoint_id(env) or f"unverified-process-{os.getpid()}"
        self.identity = {"ckpt_id": self.ckpt_id, "zero_mode": env.zero_mode,
                         "quantizer_abi": QUANTIZER_ABI, "tag": tag, "n_layers": self.n_layers,
                         "E": self.E, "slot_bytes": self.slot_bytes, "stride": self.stride}
        rank, world, pp = rank_info()
        self._rank = (rank, world, pp)
        name = PackName(tag, key20_of(self.identity), rank, world, pp).filename()
        os.makedirs(env.store_dir, exist_ok=True)
        self.path = os.path.join(env.store_dir, name)
        self._present = self._find_written()
        self._writer = None
        self._store = None
        self._store_layers: frozenset = frozenset()
        self._stage: torch.Tensor | None = None
        if self._present:
            log.info("%s: %d/%d layers already packed; staging them is skipped",
                     self.path, len(self._present), self.n_layers)

    def _find_written(self) -> set[int]:
        from tierstore.format.pack import Pack
        if not os.path.exists(self.path):
            return set()
        try:
            with Pack.open(self.path) as pack:
                return {int(li) for li in np.flatnonzero(pack.written)}
        except (FormatError, TierIOError, ConfigError) as exc:
            # A damaged generation is rebuilt (vLLM-Moet's rule), never served.
            log.warning("%s: unusable pack (%s); rebuilding it", self.path, exc)
            from tierstore.format.sidecar import sidecar_path_of
            for p in (self.path, sidecar_path_of(self.path)):
                try:
                    os.replace(p, p + ".damaged")
                except FileNotFoundError:
                    pass
            return set()

    def __contains__(self, layer_key) -> bool:
        return int(layer_key) in self._present

    def __len__(self) -> int:
        return len(self._present)

    # -- first boot: write ---------------------------------------------------------------
    def add_layer(self, layer_key: int, parts) -> None:
        """Write one layer ([fp13 | sc13 | fp2 | sc2] sections, [E, n] each); a layer the
        pack already holds is skipped."""
        layer = int(layer_key)
        if not 0 <= layer < self.n_layers:
            raise ConfigError(f"{self.path}: layer {layer_key} outside [0, {self.n_layers})")
        if layer in self._present:
            return
        rows = _joined(parts, self.E, self.slot_bytes, f"{self.path}: layer {layer}")
        if self._writer is None:
            from tierstore.format.writer import PackWriter
            rank, world, pp = self._rank
            self._writer = PackWriter(self.path, tag=self.tag, n_layers=self.n_layers,
                                      n_experts=self.E, slot_bytes=self.slot_bytes,
                                      ckpt_id=self.ckpt_id, zero_mode=self.env.zero_mode,
                                      quantizer_abi=QUANTIZER_ABI, rank=rank, world=world, pp=pp)
        self._writer.write_layer(layer, rows.numpy())
        self._present.add(layer)
        if len(self._present) == self.n_layers:
            self._close_writer()

    def _close_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()   # drops the flock so another engine may write
            self._writer = None

    # -- serving: read -------------------------------------------------------------------
    def expert_store(self):
        """The ExpertStore over the pack as written so far (re-opened once when layers
        were added since: loading is over by the first read)."""
        if self._store is not None and self._store_layers == frozenset(self._present):
            return self._store
        self._close_writer()
        if self._store is not None:
            self._store.close()
        from tierstore.format.pack import Pack
        from tierstore.store.expert_store import ExpertStore
        env = self.env
        self._store = ExpertStore(Pack.open(self.path), vram_slots=1, ram_gb=env.ts_ram_gb,
                                  device=self._engine_device(), threads=env.store_threads,
                                  direct=env.ts_direct, lazy_per_step=0)
        self._store_layers = frozenset(self._present)
        return self._store

    def _engine_device(self) -> str:
        """The tier's CUDA device when tierstore's engine can copy to it, else the host
        (decided once: the answer asks the driver)."""
        if self._engine_dev is None:
            self._engine_dev = "cpu"
            if self.device.type == "cuda" and cuda_engine():
                index = self.device.index
                self._engine_dev = f"cuda:{torch.cuda.current_device() if index is None else index}"
        return self._engine_dev

    def writes_into(self, pool: torch.Tensor) -> bool:
        """Can ``rows_into`` write ``pool`` (host memory, or the CUDA device the engine
        copies to)?"""
        return pool.device.type == "cpu" or (
            self._engine_device() == f"cuda:{pool.device.index}")

    def rows_into(self, pairs, pool: torch.Tensor, slots, scan: bool = False, after=None,
                  phases=None) -> int:
        """Rows of ``pairs`` (unique) straight into ``pool[slots[i], :slot_bytes]``, one engine
        batch, no host stage; returns once every byte is in (rows served from the arena).
        On a CUDA pool the engine's copy stream first waits for ``after`` (streams whose
        queued work may still read those slots; None = the pool device's current stream).
        Raises TierIOError naming the row; the slots of a failed batch may then hold part
        of the new bytes (treat them all as overwritten). ``phases`` (the tier's FirePhases)
        gets ``prep`` (checks, stream waits) and the store call's phases (ExpertStore.read_rows)."""
        keys = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        if len(slots) != len(keys):
            raise ConfigError(f"{self.path}: rows_into: {len(keys)} rows for {len(slots)} slots")
        if not len(keys):
            return 0
        if not self.writes_into(pool):
            raise ConfigError(f"{self.path}: rows_into: the pool is on {pool.device}, the store's "
                              f"engine copies to {self._engine_device()}")
        store = self.expert_store()
        if pool.is_cuda:
            copies = torch.cuda.ExternalStream(store.engine.copy_stream, device=pool.device)
            for stream in (torch.cuda.current_stream(pool.device),) if after is None else after:
                copies.wait_stream(stream)
        if phases is not None:
            phases.mark("prep")
        got = store.read_rows(keys, pool, scan=scan, verify=self.env.ts_checksums, rows=slots,
                              phases=phases)
        if phases is not None:
            phases.mark("read_rows")
        return got

    def _stage_for(self, n: int) -> torch.Tensor:
        if self._stage is None or self._stage.shape[0] < n:
            rows = max(n, 2 * (0 if self._stage is None else self._stage.shape[0]))
            eng = self.expert_store().engine
            self._stage = eng.alloc_host(rows * self.stride).view(rows, self.stride)
        return self._stage

    def alloc_stage(self, n: int) -> torch.Tensor:
        """A caller-owned page-aligned host stage of ``n`` rows (pinned with CUDA)."""
        return self.expert_store().engine.alloc_host(n * self.stride).view(n, self.stride)

    def rows_for(self, pairs, scan: bool = False, out: torch.Tensor | None = None):
        """uint8 [slot_bytes] host rows of ``pairs`` (unique), views of ``out`` or of the
        shared stage (valid until the next call). Raises TierIOError naming the row."""
        return list(self.rows_block(pairs, scan=scan, out=out).unbind(0))

    def rows_block(self, pairs, scan: bool = False, out: torch.Tensor | None = None):
        """The rows of ``pairs`` as one [n, slot_bytes] view of ``out`` or of the shared
        stage (rows at the pack's stride; valid until the next call): one engine batch."""
        keys = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        n = len(keys)
        if n == 0:
            return torch.empty(0, self.slot_bytes, dtype=torch.uint8)
        store = self.expert_store()
        stage = out if out is not None else self._stage_for(n)
        store.read_rows(keys, stage, scan=scan, verify=self.env.ts_checksums)
        return stage[:n, :self.slot_bytes]

    def release(self) -> None:
        self._close_writer()
        if self._store is not None:
            store, self._store = self._store, None
            store.close()
            store.pack.close()
        self._stage = None
        self._present = set()

    def stats(self) -> dict:
        if self._store is None:
            return {}
        s = self._store.engine.stats()
        return {src: {"rows": s[src].get("rows", 0), "bytes": s[src].get("bytes", 0)}
                for src in ("arena", "pagecache", "disk") if src in s}


def cuda_engine() -> bool:
    """Can tierstore's engine copy to a CUDA device (built with CUDA, a device present)?"""
    from tierstore import cuda_available
    try:
        return cuda_available()
    except Exception:  # noqa: BLE001 - no extension: no engine at all, the store says so
        return False


def make_store(env: MoetEnv, tag: str, n_layers: int, n_experts: int, slot_bytes: int,
               pinned: bool, device=None):
    """vLLM-Moet's factory rule: a pack store when STORE_DIR is set, else host rows.
    ``device``: the tier's (a pack store opens its engine there when it is CUDA)."""
    if env.store_dir:
        return PackRowStore(env, tag, n_layers, n_experts, slot_bytes, device=device)
    return HostRowStore(n_layers, n_experts, slot_bytes, pinned=pinned)
