"""Pack rows into memory the caller owns, for a caller that runs its own pool
(``ExpertStore.read_rows``).

An adapter that owns its device pool (vLLM-Moet's tier surface) still wants the
store's RAM arena and I/O engine under it. ``read_rows`` copies each requested
row's payload into a buffer the caller owns, in one engine batch. ``out`` is a
host stage (row ``i`` -> ``out[i]``) or, with ``rows=``, the caller's pool itself
(row ``i`` -> ``out[rows[i]]``, scattered: the addresses are one vectorised
multiply, no Python loop per row). A CUDA ``out`` needs a store opened on that
device: the engine then copies arena rows H2D straight from the (pinned) arena,
and rows read from the file H2D from the arena row they are read into, or from its
own pinned staging ring, chunk by chunk as they land (tierstore/io/engine.py);
``read_rows`` returns once those copies have completed (``Completion.synchronize``),
so the caller may publish at once. The caller orders the engine's copy stream
(``engine.copy_stream``) after any work that still reads the destination rows.

* arena hits are memcpy sources (the row is pinned in the arena until the batch
  is done, so no eviction overwrites it mid-copy);
* misses are read from the pack (threaded pread / O_DIRECT), into a free or
  evictable arena row first unless ``scan`` (a one-shot sweep must not wipe the
  arena's hot set), then copied out; with no room they are read straight into
  the caller's buffer.

The bookkeeping runs under the store's lock; the reads run with it released.
Source arena rows stay pinned until every copy out of them has completed (on a
failure too). A failed read rolls back every arena row the batch took and raises
a TierIOError naming the layer and expert; nothing is admitted. The destination
rows of a failed batch may hold some of the new bytes (sibling rows land, a
failed row may land in part): the caller must treat them all as overwritten.
"""
from __future__ import annotations

import numpy as np
import torch

from tierstore.errors import ConfigError, TierIOError


def destinations(out: torch.Tensor, n: int, slot_bytes: int, what: str,
                 rows=None) -> tuple[np.ndarray, bool]:
    """(address of each row's destination, on the device?): ``out[i]``, or ``out[rows[i]]``
    when ``rows`` is given (unique indices into ``out``'s rows). ConfigError naming
    ``what`` for a tensor or an index that does not fit."""
    if not isinstance(out, torch.Tensor) or out.device.type not in ("cpu", "cuda") \
            or out.dtype != torch.uint8:
        raise ConfigError(f"{what}: out must be a torch.uint8 tensor on the host or a CUDA device")
    need = n if rows is None else 1
    if out.dim() != 2 or out.shape[0] < need or out.shape[1] < slot_bytes or out.stride(1) != 1:
        raise ConfigError(f"{what}: out must be [>= {need}, >= {slot_bytes}] with contiguous rows, "
                          f"found {list(out.shape)} strides {list(out.stride())}")
    if rows is None:
        index = np.arange(n, dtype=np.uint64)
    else:
        idx = np.asarray(rows).reshape(-1)
        if idx.shape[0] != n or (n and idx.dtype.kind not in "iu"):
            raise ConfigError(f"{what}: rows must be {n} integer row indices, found "
                              f"{idx.shape[0]} of dtype {idx.dtype}")
        idx = idx.astype(np.int64)
        bad = np.flatnonzero((idx < 0) | (idx >= out.shape[0]))
        if len(bad):
            raise ConfigError(f"{what}: rows[{int(bad[0])}] = {int(idx[bad[0]])} is outside "
                              f"out's {out.shape[0]} rows")
        if len(np.unique(idx)) != n:
            raise ConfigError(f"{what}: rows must be unique (two rows would land in one)")
        index = idx.astype(np.uint64)
    step = np.uint64(out.stride(0) * out.element_size())
    return np.uint64(out.data_ptr()) + index * step, out.device.type == "cuda"


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


def _device_check(engine, out: torch.Tensor, what: str) -> None:
    if getattr(engine, "device", "cpu") != "cuda":
        raise ConfigError(f"{what}: out is on {out.device} but the store's engine writes host "
                          f"memory only (open the ExpertStore with device='{out.device}')")
    index = torch.cuda.current_device() if out.device.index is None else out.device.index
    if int(engine.device_index) != int(index):
        raise ConfigError(f"{what}: out is on {out.device} but the store's engine copies to "
                          f"cuda:{engine.device_index}")


def _settle(done) -> None:
    """On a failure path: wait until nothing of the batch still writes or reads memory."""
    if done is None:
        return
    try:
        done.synchronize()
    except BaseException:  # noqa: BLE001 - the first error is the one reported
        pass


def read_rows(pack, engine, arena, lock, keys: np.ndarray, out: torch.Tensor, scan: bool,
              verifier=None, verify: bool = False, rows=None, phases=None) -> int:
    """Copy rows ``keys`` (unique dense ids) into ``out[i, :slot_bytes]``, or into
    ``out[rows[i], :slot_bytes]`` with ``rows``; ``out`` on the host or (a CUDA engine)
    on its device; see the module doc. Rows read from the file are checked against
    the sidecar's checksums by the engine as the store's ``verifier`` says
    (store/verify.py), every one when ``verify``; a mismatch is a TierIOError
    (EBADMSG). Returns how many came from the arena, once every copy completed."""
    n, sb = len(keys), int(pack.slot_bytes)
    if n == 0:
        return 0
    what = f"{pack.path}: read_rows"
    dst, on_device = destinations(out, n, sb, what, rows)
    if on_device:
        _device_check(engine, out, what)
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
    done = None
    if phases is not None:
        phases.mark("rr_plan")
    try:
        with engine.registered(out):  # the caller's buffer, for this batch only
            done = engine.submit(offsets, np.full(n, sb, np.int64), src, dst,
                                 dst_device=on_device, checksums=sums)
            # H2D: wait() means read and copies issued; the arena rows are their sources
            # until the copies complete, so they stay pinned until then.
            done.synchronize() if on_device else done.wait()
        pack.check_unchanged()
        if phases is not None:
            phases.mark("rr_engine")
    except BaseException as exc:
        _settle(done)
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
    if phases is not None:
        phases.mark("rr_finish")
    return int(hit.sum())
