"""The FP4 tier's pack: vLLM-Moet's ``_store`` surface, written once, read by the ExpertStore.

What vLLM-Moet's glue and floor check ask of ``tier._store`` (MOET-SURFACE.md 1c):
``layer_key in store``, ``len(store)`` (layers held), ``add_layer(layer_key, parts)``
(one layer's column sections, ``[E, n]`` uint8 each, at weight load), ``release()``,
``stats()``. That is all this object does: it writes the layers into a pack and tells
which it holds; every read, the pool and its slot table are the ExpertStore's.

* ``VLLM_MOE_W2_STORE_DIR`` set: the pack lives there under vLLM-Moet's own name
  (``<tag>.v2.<key20>.rank<r>of<w>.pack`` + sidecar), so both engines write, resume and
  read the same file; a later boot that finds a layer skips it. A pack another engine
  left unfinished is resumed (its layers kept as they are). A pack that cannot be used is
  never renamed or rewritten: boot stops with one line naming the files to delete.
* unset: a process-private pack in ``/dev/shm`` (else the temp dir), removed by
  ``release``: the rows live in RAM once, and reads are the store's own preads.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

import numpy as np
import torch

from tierstore.adapters.moet_config import QUANTIZER_ABI, MoetEnv
from tierstore.errors import ConfigError, FormatError, TierIOError

log = logging.getLogger("tierstore.adapters.moet")


def _joined(parts, E: int, slot_bytes: int, what: str) -> np.ndarray:
    """uint8 [E, slot_bytes] rows from column sections (a D2H copy each, synchronous)."""
    widths = [int(t.shape[1]) if t.dim() == 2 else -1 for t in parts]
    for t in parts:
        if t.dim() != 2 or t.shape[0] != E or t.dtype != torch.uint8:
            raise ConfigError(f"{what}: sections must be uint8 [{E}, n], found {t.dtype} {list(t.shape)}")
    if sum(widths) != slot_bytes:
        raise ConfigError(
            f"{what}: sections total {sum(widths)} bytes per expert, expected slot_bytes={slot_bytes}"
        )
    return torch.cat([t.detach().to("cpu") for t in parts], dim=1).numpy()


def checkpoint_id(env: MoetEnv) -> str | None:
    """VLLM_MOE_W2_CKPT_ID, else (under vLLM-Moet) the id its planes cache derives from
    the checkpoint, so both engines name the same pack; None when neither is known."""
    if env.ckpt_id:
        return env.ckpt_id
    try:
        from vllm.model_executor.layers.quantization.utils import moe_w2_planes_cache

        return str(moe_w2_planes_cache._ckpt_id()) or None
    except Exception:  # noqa: BLE001 - no vLLM-Moet or no current config: unverified
        return None


def rank_info() -> tuple[int, int, tuple[int, int] | None]:
    """(tp rank, tp world, pp) as vLLM-Moet names its packs; (0, 1, None) without vLLM."""
    try:
        from vllm.distributed import (
            get_pp_group,
            get_tensor_model_parallel_rank,
            get_tensor_model_parallel_world_size,
        )

        rank, world = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
        pp = get_pp_group()
        return rank, world, ((pp.rank_in_group, pp.world_size) if pp.world_size > 1 else None)
    except Exception:  # noqa: BLE001 - no vLLM or no distributed state: one rank
        return 0, 1, None


def _private_dir(nbytes: int) -> str:
    """A fresh directory for a process-private pack: /dev/shm when it has room."""
    shm = "/dev/shm"
    try:
        st = os.statvfs(shm)
        if os.access(shm, os.W_OK) and st.f_bavail * st.f_frsize > 2 * nbytes:
            return tempfile.mkdtemp(prefix="tierstore-moet-", dir=shm)
    except OSError:
        pass
    return tempfile.mkdtemp(prefix="tierstore-moet-")


class MoetPack:
    """The FP4 layers of one tier in a pack (see the module doc). Not thread safe: the
    runner thread adds layers during weight load; the store reads after ``finish``."""

    def __init__(self, env: MoetEnv, tag: str, n_layers: int, n_experts: int, slot_bytes: int):
        from tierstore.format.sidecar import PackName, key20_of, round_up

        self.env, self.tag = env, tag
        self.n_layers, self.E, self.slot_bytes = int(n_layers), int(n_experts), int(slot_bytes)
        self.stride = round_up(self.slot_bytes)
        self._private = None if env.store_dir else _private_dir(self.n_layers * self.E * self.stride)
        # vLLM-Moet never trusts a pack across boots without a checkpoint id: such a pack
        # gets a process-local name, exactly as there.
        self.ckpt_id = checkpoint_id(env) or f"unverified-process-{os.getpid()}"
        self.identity = {
            "ckpt_id": self.ckpt_id,
            "zero_mode": env.zero_mode,
            "quantizer_abi": QUANTIZER_ABI,
            "tag": tag,
            "n_layers": self.n_layers,
            "E": self.E,
            "slot_bytes": self.slot_bytes,
            "stride": self.stride,
        }
        self._rank = rank_info()
        rank, world, pp = self._rank
        name = PackName(tag, key20_of(self.identity), rank, world, pp).filename()
        directory = self._private or env.store_dir
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"VLLM_MOE_W2_STORE_DIR={directory}: cannot create the pack directory ({exc.strerror})"
            ) from None
        if not os.path.isdir(directory):
            raise ConfigError(f"VLLM_MOE_W2_STORE_DIR={directory}: not a directory")
        self.path = os.path.join(directory, name)
        self._writer = None
        self._present = self._find_written()
        if self._present:
            log.info(
                "%s: %d/%d layers already packed; staging them is skipped",
                self.path,
                len(self._present),
                self.n_layers,
            )

    def _find_written(self) -> set[int]:
        """Layers the pack on disk holds. A pack that cannot be read is never renamed or
        rebuilt here (that would drop ~130 GB on every boot): one line says what to do."""
        from tierstore.format.pack import Pack
        from tierstore.format.sidecar import sidecar_path_of

        if not os.path.exists(self.path) and not os.path.exists(sidecar_path_of(self.path)):
            return set()
        try:
            if not os.path.exists(self.path):  # sidecar only: the writer decides (it names it)
                return set()
            with Pack.open(self.path) as pack:
                return {int(li) for li in np.flatnonzero(pack.written)}
        except (FormatError, TierIOError, ConfigError) as exc:
            try:  # vLLM-Moet extended it (its layers have no sums): the writer resumes
                self._open_writer()  # it and hashes those layers once
                return set(self._writer.written_layers)
            except (FormatError, TierIOError, ConfigError):
                return self._unusable(exc)

    def _unusable(self, exc: Exception):
        from tierstore.format.sidecar import sidecar_path_of

        raise ConfigError(
            f"{self.path}: cannot resume this pack ({exc}); delete it and "
            f"{sidecar_path_of(self.path)} to rebuild it"
        ) from None

    def __contains__(self, layer_key) -> bool:
        return int(layer_key) in self._present

    def __len__(self) -> int:
        return len(self._present)

    @property
    def layers(self) -> frozenset:
        return frozenset(self._present)

    def add_layer(self, layer_key: int, parts) -> bool:
        """Write one layer ([fp13 | sc13 | fp2 | sc2] column sections); a layer the pack
        already holds is skipped (False)."""
        layer = int(layer_key)
        if not 0 <= layer < self.n_layers:
            raise ConfigError(f"{self.path}: layer {layer_key} outside [0, {self.n_layers})")
        if layer in self._present:
            return False
        rows = _joined(parts, self.E, self.slot_bytes, f"{self.path}: layer {layer}")
        self._open_writer()
        self._writer.write_layer(layer, rows)
        self._present.add(layer)
        return True

    def _open_writer(self) -> None:
        """PackWriter on the pack (resumes it: layers another engine wrote are hashed)."""
        if self._writer is None:
            from tierstore.format.writer import PackWriter

            rank, world, pp = self._rank
            self._writer = PackWriter(
                self.path,
                tag=self.tag,
                n_layers=self.n_layers,
                n_experts=self.E,
                slot_bytes=self.slot_bytes,
                ckpt_id=self.ckpt_id,
                zero_mode=self.env.zero_mode,
                quantizer_abi=QUANTIZER_ABI,
                rank=rank,
                world=world,
                pp=pp,
            )

    def finish(self) -> str:
        """Loading is over: close the writer (its exclusive lock would refuse readers);
        the pack's path."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        return self.path

    def release(self) -> None:
        """Close the writer; a process-private pack is removed with its directory."""
        self.finish()
        self._present = set()
        if self._private is not None:
            shutil.rmtree(self._private, ignore_errors=True)
            self._private = None

    def stats(self) -> dict:
        return {"path": self.path, "layers": len(self._present), "private": bool(self._private)}


__all__ = ["MoetPack", "checkpoint_id", "rank_info"]
