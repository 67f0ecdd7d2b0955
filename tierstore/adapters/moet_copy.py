"""How rows reach the FP4 tier's pool slots: direct, or one batched copy out of a host stage.

``promote_path`` picks the path of the tier's synchronous loads (``force_promote``,
``ensure_resident``; VLLM_MOE_W2_TIERSTORE_PROMOTE):

* ``direct`` (auto's choice for a CUDA pool over a pack store): the pack store's
  engine writes each row straight into its pool slot (``PackRowStore.rows_into`` ->
  ``ExpertStore.read_rows(rows=slots)``): arena rows H2D from the pinned arena,
  page-cache and disk rows H2D chunk by chunk from the arena row or pinned stage
  they are read into, overlapped with the reads. No host stage, no second copy.
* ``staged``: the store fills a host stage, then ``copy_block`` below. The host store
  (no STORE_DIR), a CPU pool under ``auto``, and the manager's lazy promotions (its
  thread makes no CUDA call; the runner copies its stage at the step boundary).

The stores hand the tier a row block: a host uint8 ``[n, slot_bytes]`` tensor whose row
``i`` goes to pool slot ``slots[i]`` (``rows_block``: a view of the pack store's stage,
or the host store's per-layer gather into its stage). ``copy_block`` moves it:

* CPU pool: one ``index_copy_`` (the block may be a strided view of a stage).
* CUDA pool, slots one ascending run and the block contiguous: one H2D copy.
* CUDA pool otherwise: the block's full-stride rows go H2D into a device scratch of at
  most ``SCRATCH_BYTES`` per chunk (one copy per chunk, from the pinned stage), then one
  ``index_copy_`` scatters the chunk into its slots on the device (viewed as 8-byte
  words when the row allows: a byte-wise scatter would cost a quarter of the H2D time).
  The scratch comes from the caching allocator on the side stream; it is transient and
  well inside the pool's DELTA_RESERVE_GB.

Everything is enqueued on ``stream`` (the tier's side stream); the caller records and
syncs its event as before. A pageable block (the FP4 tier over the base cache keeps
vLLM-Moet's pageable store) still copies correctly; the H2D is then synchronous.
"""
from __future__ import annotations

import numpy as np
import torch

from tierstore.errors import ConfigError

SCRATCH_BYTES = 256 << 20   # largest device chunk of one H2D copy


def promote_path(mode: str, dev: torch.device, store, cuda_engine: bool) -> str:
    """``"direct"`` or ``"staged"`` for a pool on ``dev`` over ``store`` (see the module doc).
    ``cuda_engine``: tierstore's engine can copy to a CUDA device (built with CUDA, a
    device present). ``mode`` ``direct`` requires the direct path (ConfigError naming
    what is missing), ``staged`` never takes it, ``auto`` takes it for a CUDA pool."""
    has_direct = callable(getattr(store, "rows_into", None))
    reachable = dev.type != "cuda" or cuda_engine
    if mode == "staged":
        return "staged"
    if mode == "direct":
        if not has_direct:
            raise ConfigError("VLLM_MOE_W2_TIERSTORE_PROMOTE=direct: the host row store has no "
                              "direct path (set VLLM_MOE_W2_STORE_DIR for a pack store)")
        if not reachable:
            raise ConfigError(f"VLLM_MOE_W2_TIERSTORE_PROMOTE=direct: the pool is on {dev} but "
                              f"tierstore's engine cannot copy to CUDA (built without CUDA?)")
        return "direct"
    if mode != "auto":
        raise ConfigError(f"VLLM_MOE_W2_TIERSTORE_PROMOTE={mode!r}: expected auto, direct or staged")
    return "direct" if has_direct and dev.type == "cuda" and reachable else "staged"


def _widenable(t: torch.Tensor) -> bool:
    return (t.shape[-1] % 8 == 0 and t.stride(-1) == 1 and t.data_ptr() % 8 == 0
            and all(s % 8 == 0 for s in t.stride()[:-1]))


def _words(dst: torch.Tensor, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both uint8 tensors as int64 words when both rows allow (the same bytes, an eighth
    of the elements to index), else both as they are."""
    if _widenable(dst) and _widenable(src):
        return dst.view(torch.int64), src.view(torch.int64)
    return dst, src


def _full_rows(block: torch.Tensor) -> torch.Tensor:
    """The block's rows at their full stride (contiguous [n, stride]), for one H2D copy;
    the block itself when its rows cannot be widened inside their storage."""
    n, sb = block.shape
    stride = block.stride(0) if n > 1 else sb
    if stride == sb:
        return block
    end = block.storage_offset() + n * stride
    if stride < sb or end > block.untyped_storage().nbytes():
        return block.contiguous()
    return block.as_strided((n, stride), (stride, 1))


def copy_block(pool: torch.Tensor, slots, block: torch.Tensor, stream=None) -> None:
    """``pool[slots[i]] = block[i]`` for every i, exactly (see the module doc)."""
    slots = np.asarray(slots, dtype=np.int64).reshape(-1)
    n = len(slots)
    if n == 0:
        return
    if block.dim() != 2 or block.shape[0] != n or block.shape[1] != pool.shape[1] \
            or block.dtype != torch.uint8 or block.stride(1) != 1:
        raise ValueError(f"copy_block: rows must be uint8 [{n}, {pool.shape[1]}] with "
                         f"contiguous rows, found {block.dtype} {list(block.shape)}")
    if not pool.is_cuda:
        dst, src = _words(pool, block)
        dst.index_copy_(0, torch.from_numpy(slots), src)
        return
    with torch.cuda.stream(stream or torch.cuda.current_stream(pool.device)):
        scatter_rows(pool, slots, block)


def scatter_rows(pool: torch.Tensor, slots: np.ndarray, block: torch.Tensor,
                 scratch_bytes: int = SCRATCH_BYTES) -> None:
    """The device path of ``copy_block`` on the current stream: one copy when the slots are
    one ascending run, else chunks through a scratch on ``pool``'s device (any device:
    the tests run it on a CPU pool with a small ``scratch_bytes``)."""
    n = len(slots)
    s0 = int(slots[0])
    if (block.is_contiguous() and s0 >= 0 and s0 + n <= pool.shape[0]
            and (n == 1 or bool(np.all(np.diff(slots) == 1)))):
        pool[s0:s0 + n].copy_(block, non_blocking=True)
        return
    full = _full_rows(block)
    row = full.shape[1]
    per = max(1, min(n, int(scratch_bytes) // row))
    scratch = torch.empty(per, row, dtype=torch.uint8, device=pool.device)
    idx = torch.from_numpy(slots)
    if pool.is_cuda:   # pinned, so the index upload is ordered on the stream, no host sync
        idx = idx.pin_memory().to(pool.device, non_blocking=True)
    for i in range(0, n, per):   # one H2D copy and one device scatter per chunk
        k = min(per, n - i)
        scratch[:k].copy_(full[i:i + k], non_blocking=True)
        dst, src = _words(pool, scratch[:k, :pool.shape[1]])
        dst.index_copy_(0, idx[i:i + k], src)


def by_layer(keys: np.ndarray, slots, victims) -> tuple[np.ndarray, list[int], list[int]]:
    """(keys, slots, victims) reordered together by key, so each layer's rows are one run
    of the block (the host store gathers a layer with one index_select)."""
    order = np.argsort(np.asarray(keys, dtype=np.int64), kind="stable")
    return (np.asarray(keys)[order], np.asarray(slots, np.int64)[order].tolist(),
            np.asarray(victims, np.int64)[order].tolist())


__all__ = ["SCRATCH_BYTES", "by_layer", "copy_block", "promote_path", "scatter_rows"]
