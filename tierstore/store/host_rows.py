"""Host copies of pack rows for a caller that runs its own pool (``ExpertStore.read_rows``).

An adapter that owns its device pool (vLLM-Moet's tier surface) still wants the
store's RAM arena and I/O engine under it. ``read_rows`` copies each requested
row's payload into a host buffer the caller owns, in one engine batch:

* arena hits are memcpy sources (the row is pinned in the arena until the batch
  is done, so no eviction overwrites it mid-copy);
* misses are read from the pack (threaded pread / O_DIRECT), into a free or
  evictable arena row first unless ``scan`` (a one-shot sweep must not wipe the
  arena's hot set), then copied out; with no room they are read straight into
  the caller's buffer.

The bookkeeping runs under the store's lock; the reads run with it released.
A failed read rolls back every arena row the batch took and raises a
TierIOError naming the layer and expert; nothing is admitted.
"""
from __future__ import annotations

import numpy as np
import torch

from tierstore.errors import ConfigError, TierIOError


def _destinations(out: torch.Tensor, n: int, slot_bytes: int, what: str) -> np.ndarray:
    if not isinstance(out, torch.Tensor) or out.device.type != "cpu" or out.dtype != torch.uint8:
        raise ConfigError(f"{what}: out must be a host torch.uint8 tensor")
    if out.dim() != 2 or out.shape[0] < n or out.shape[1] < slot_bytes or out.stride(1) != 1:
        raise ConfigError(f"{what}: out must be [>= {n}, >= {slot_bytes}] with contiguous rows, "
                          f"found {list(out.shape)} strides {list(out.stride())}")
    return (np.uint64(out.data_ptr())
            + np.arange(n, dtype=np.uint64) * np.uint64(out.stride(0) * out.element_size()))


def _annotate(exc: BaseException, pack) -> BaseException:
    if not isinstance(exc, TierIOError):
        return exc
    layer, expert = divmod(int(exc.offset // pack.stride), int(pack.n_experts))
    out = TierIOError(exc.path, exc.offset, exc.errno or 5, what=f"layer {layer} expert {expert} read")
    detail = str(exc)
    if detail and detail not in str(out):  # keep the engine's own words (xxh3_64 mismatch, ...)
        out.args = (out.errno, f"{out} [{detail}]")
    out.layer, out.expert = layer, expert
    return out


def read_rows(pack, engine, arena, lock, keys: np.ndarray, out: torch.Tensor, scan: bool,
              verifier=None, verify: bool = False) -> int:
    """Copy rows ``keys`` (unique dense ids) into ``out[i, :slot_bytes]``; see the module doc.
    Rows read from the file are checked against the sidecar's checksums by the engine as
    the store's ``verifier`` says (store/verify.py), every one when ``verify``; a mismatch
    is a TierIOError (EBADMSG). Returns how many came from the arena."""
    n, sb = len(keys), int(pack.slot_bytes)
    if n == 0:
        return 0
    dst = _destinations(out, n, sb, f"{pack.path}: read_rows")
    with lock:
        a_slot = arena.resident_slot[keys].astype(np.int64)
        hit = a_slot >= 0
        arena.pin(keys[hit])  # before take(): a source row must not become a victim
        pinned = keys[hit]
        new_rows = np.empty(0, np.int64)
        src = np.zeros(n, np.uint64)
        src[hit] = arena.row_ptrs(a_slot[hit])
        if not scan and arena.n_slots:
            got = arena.take(keys[~hit & (arena.slot_of[keys] < 0)], allow_evict=True)
            if len(got.reused):
                arena.begin_load(got.reused)  # arena rows have no device readers
            arena.pin(got.keys)
            pinned, new_rows = np.concatenate([pinned, got.keys]), got.slots
            if len(got.keys):
                order = np.argsort(keys, kind="stable")
                src[order[np.searchsorted(keys[order], got.keys)]] = arena.row_ptrs(got.slots)
        if hit.any():
            arena.policy.on_access(keys[hit])
        offsets = pack.row_offsets(keys).astype(np.int64)
        offsets[hit] = -1
    if verify and pack.has_checksums:
        sums = pack.row_checksums(keys)
    else:
        sums = None if verifier is None else verifier.checksums(keys, offsets)
    try:
        with engine.registered(out):  # the caller's buffer, for this batch only
            engine.submit(offsets, np.full(n, sb, np.int64), src, dst, dst_device=False,
                          checksums=sums).wait()
        pack.check_unchanged()
    except BaseException as exc:
        with lock:
            if len(new_rows):
                arena.rollback(new_rows)
            arena.unpin(pinned)
        err = _annotate(exc, pack)
        if err is exc:
            raise
        raise err from exc
    with lock:
        if len(new_rows):
            arena.commit(new_rows)
        arena.unpin(pinned)
    if sums is not None:
        verifier.passed(keys, offsets)
    return int(hit.sum())
