"""Preheat timing on the GPU machine (``bench_warm.py --preheat``).

For a ``--pool-gb`` pool of ``--slot-bytes`` rows (default 6 GiB of 12 MiB FP4
experts = 512 slots), with no RAM arena so every row comes from the pack:

1. write a pack of 1.125x the pool's rows (distinct non-zero rows, cheaply made)
   and a poolmon naming every row, hottest first;
2. page cache: read the pack once so it is cached, then time the engine's own
   read->H2D of the same rows into the pool (the ceiling), then ``store.preheat``;
3. disk: drop the pack's pages (POSIX_FADV_DONTNEED: the file is clean after
   the writer's fsync), time the engine again, drop again, time ``preheat``;
4. a plain pinned->GPU copy of the pool's bytes (the PCIe ceiling).

Every ratio is to a ceiling measured in this same run (LIMITS.md: the page
cache varies 2x between runs). Prints one JSON object.
"""

from __future__ import annotations

import os
import tempfile
import time
import warnings

import numpy as np


def _write_pack(directory: str, n_layers: int, n_experts: int, slot_bytes: int):
    from tierstore.format import Pack, PackWriter

    rng = np.random.default_rng(0)
    block = rng.integers(1, 256, size=(n_experts, slot_bytes), dtype=np.uint8)
    with PackWriter(
        directory,
        tag="fp4",
        n_layers=n_layers,
        n_experts=n_experts,
        slot_bytes=slot_bytes,
        ckpt_id="bench-warm-preheat",
        quantizer_abi="tierstore-random-v1",
    ) as w:
        for layer in range(n_layers):
            block[:, 0] = layer + 1  # every row distinct, still non-zero
            w.write_layer(layer, block)
        path = w.path
    return Pack.open(path)


def _drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _fill_cache(path: str) -> float:
    t0, n = time.perf_counter(), 0
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(64 << 20)
        while k := f.readinto(buf):
            n += k
    return n / (time.perf_counter() - t0) / 1e9


def _engine_ceiling(pack, keys: np.ndarray, pool, device: str) -> float:
    """GB/s of the bare engine moving the rows ``keys`` into ``pool`` slots 0..N-1."""
    from tierstore.io.engine import Engine

    n = len(keys)
    offsets = np.array([pack.row_offset(int(l), int(e)) for l, e in keys], dtype=np.int64)
    lengths = np.full(n, pack.slot_bytes, dtype=np.int64)
    dst = np.uint64(pool.data_ptr()) + np.arange(n, dtype=np.uint64) * np.uint64(pool.stride(0))
    engine = Engine(pack.path, device=device)
    engine.register_buffer(pool)  # submit accepts registered memory only
    try:
        _sync(device)
        t0 = time.perf_counter()
        done = engine.submit(offsets, lengths, np.zeros(n, np.uint64), dst, dst_device=device == "cuda")
        done.wait()
        done.synchronize()
        dt = time.perf_counter() - t0
    finally:
        engine.close()
    return n * pack.slot_bytes / dt / 1e9


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _h2d_ceiling(nbytes: int) -> float:
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    return nbytes / (time.perf_counter() - t0) / 1e9


def _timed_preheat(pack, poolmon: str, args) -> dict:
    from tierstore import warm as warmstart
    from tierstore.store.expert_store import ExpertStore

    with ExpertStore(pack, vram_gb=args.pool_gb, ram_gb=0.0, device=args.device, force=True) as store:
        _sync(args.device)
        t0 = time.perf_counter()
        s = warmstart.preheat(store, poolmon, pool_fill=args.pool_fill, progress=False)
        _sync(args.device)  # count the copies still in flight, as the engine ceiling does
        dt = time.perf_counter() - t0
        n_slots = store.n_slots
    return {
        "seconds": round(dt, 3),
        "rows": s.pool_rows,
        "bytes": s.pool_bytes,
        "gbps": round(s.pool_bytes / dt / 1e9, 2),
        "n_slots": n_slots,
        "cold": s.cold,
    }


def bench_preheat(args) -> dict:
    import torch

    from tierstore import warm as ws

    warnings.simplefilter("default")
    slot_bytes = int(args.slot_bytes)
    n_slots = max(int(args.pool_gb * 2**30 // slot_bytes), 8)
    n_experts = 64
    n_layers = -(-int(n_slots * 1.125) // n_experts)
    # Not /tmp by default: it may be tmpfs, where pages cannot be dropped and
    # O_DIRECT is refused, which would make the "disk" numbers page-cache ones.
    with tempfile.TemporaryDirectory(dir=args.dir or ".", prefix=".bench-warm-") as tmp:
        t0 = time.perf_counter()
        pack = _write_pack(tmp, n_layers, n_experts, slot_bytes)
        write_s = time.perf_counter() - t0
        rng = np.random.default_rng(1)
        dense = rng.permutation(n_layers * n_experts)
        keys = np.stack([dense // n_experts, dense % n_experts], axis=1)
        wf = ws.WarmFile(
            "<bench>",
            "poolmon",
            ws.PackIdentity.of_pack(pack),
            ws.WarmTier(keys, np.linspace(1e3, 1.0, len(keys)), n_slots),
            ws.WarmTier.empty(),
            wall_time=time.time(),
        )
        poolmon = os.path.join(tmp, "poolmon.json")
        ws.write_warm_file(wf, poolmon, "poolmon")
        n_fill = int(args.pool_fill * n_slots)
        pool = torch.empty((n_fill, slot_bytes), dtype=torch.uint8, device=args.device)

        is_cuda = args.device == "cuda"
        out = {
            "bench": "warm_preheat",
            "device": torch.cuda.get_device_name(0) if is_cuda else "cpu",
            "pool_gb": args.pool_gb,
            "slot_bytes": slot_bytes,
            "n_slots": n_slots,
            "pool_fill": args.pool_fill,
            "rows_moved": n_fill,
            "pack_rows": n_layers * n_experts,
            "pack_write_s": round(write_s, 1),
        }
        out["pagecache_fill_gbps"] = round(_fill_cache(pack.path), 2)
        out["engine_pagecache_gbps"] = round(_engine_ceiling(pack, keys[:n_fill], pool, args.device), 2)
        out["preheat_pagecache"] = _timed_preheat(pack, poolmon, args)
        _drop_cache(pack.path)
        out["engine_disk_gbps"] = round(_engine_ceiling(pack, keys[:n_fill], pool, args.device), 2)
        _drop_cache(pack.path)
        out["preheat_disk"] = _timed_preheat(pack, poolmon, args)
        del pool
        if is_cuda:
            out["h2d_pinned_gbps"] = round(_h2d_ceiling(n_fill * slot_bytes), 2)
        for src in ("pagecache", "disk"):
            p = out[f"preheat_{src}"]
            p["ratio_to_engine"] = round(p["gbps"] / out[f"engine_{src}_gbps"], 3)
            if is_cuda:
                p["ratio_to_h2d"] = round(p["gbps"] / out["h2d_pinned_gbps"], 3)
        pack.close()
    return out
