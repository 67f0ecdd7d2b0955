"""Measurements behind ``tierstore bench io``: ceilings, baselines and tierstore fires,
all on one file in one run so every ratio compares like with like.

Sources of a fire: ``arena`` (rows already in pinned host memory), ``pagecache``
(the file is in the page cache), ``cold`` (the file was evicted first: fsync +
POSIX_FADV_DONTNEED on the whole file; plus drop_caches only with --drop-caches).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

import numpy as np

PAGE = 4096


# -- the file ---------------------------------------------------------------------------------
def create_file(path: str, nbytes: int, seed: int = 0, progress=None) -> None:
    """Write nbytes of non-zero pseudo-random data (temp + fsync + rename: an interrupt
    leaves neither the file nor its temp). ``progress(text)`` gets a line every ~10%."""
    block = np.random.default_rng(seed).integers(1, 256, size=64 << 20, dtype=np.uint8)
    from tierstore.files.atomic import atomic_output

    with atomic_output(path) as f:
        written, k = 0, 0
        while written < nbytes:
            n = min(block.size, nbytes - written)
            block[:8] = np.frombuffer(np.int64(k).tobytes(), np.uint8) | 1  # blocks differ
            f.write(block[:n].tobytes())
            written, k = written + n, k + 1
            if (
                progress is not None
                and nbytes >= 10 * block.size
                and k % max(1, nbytes // block.size // 10) == 0
            ):
                progress(f"created {written / 1e9:.2f} of {nbytes / 1e9:.2f} GB")


def evict(path: str, drop_caches: bool = False) -> str:
    """Drop the file from the page cache; returns how ("drop_caches" or "fadvise").

    ``drop_caches`` (the --drop-caches flag) also writes /proc/sys/vm/drop_caches, which
    empties the whole machine's page cache: never done unless asked."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages survive a drop
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if not drop_caches:
        return "fadvise"
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        return "fadvise"


def warm(path: str, nbytes: int, threads: int = 16) -> None:
    """Read [0, nbytes) buffered so it sits in the page cache."""
    chunk = 64 << 20
    fd = os.open(path, os.O_RDONLY)
    try:

        def one(off):
            os.pread(fd, min(chunk, nbytes - off), off)

        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(one, range(0, nbytes, chunk)))
    finally:
        os.close(fd)


# -- ceilings ---------------------------------------------------------------------------------
def ceiling_h2d(torch, device: str, nbytes: int, repeats: int = 3) -> float:
    """GB/s of one pinned host -> device copy of nbytes (host -> host memcpy on CPU).

    The best of torch's pinned allocation (cudaHostAlloc) and a registered page-aligned
    buffer (cudaHostRegister, what the engine uses), so the ceiling is not understated."""
    from tierstore import _C

    registered = torch.from_numpy(_C.alloc_host(nbytes, True)[0])
    sources = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=(device == "cuda")), registered]
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    best = float("inf")
    for src in sources:
        src.fill_(1)
        for _ in range(repeats + 1):
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            if device == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
    del sources, registered, dst
    return nbytes / best / 1e9


def ceiling_read(
    path: str,
    nbytes: int,
    row_bytes: int,
    threads: int,
    direct: bool,
    passes: int = 1,
    dest_bytes: int = 1 << 30,
) -> float:
    """GB/s of `threads` Python threads preadv-ing row-sized pieces of [0, nbytes); best pass.

    Every read lands in its own destination among distinct buffers spanning at least
    `dest_bytes` (1 GiB: far beyond the CPU caches, so the copies' writes go to DRAM as the
    engine's do), pre-faulted before timing so first-touch faults are not counted."""
    flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
    fd = os.open(path, flags)
    piece = (row_bytes + PAGE - 1) // PAGE * PAGE
    offsets = list(range(0, nbytes - piece + 1, piece))
    n_dest = max(threads, -(-dest_bytes // piece))
    # The engine's own kind of buffer (2 MiB-aligned, huge-page hinted), written once.
    from tierstore import _C

    dest = _C.alloc_host(n_dest * piece, False)[0]
    dest.fill(1)
    views = [memoryview(dest[k * piece : (k + 1) * piece]) for k in range(n_dest)]

    def worker(k: int) -> int:
        got = 0
        for i in range(k, len(offsets), threads):  # at any instant threads write distinct views
            got += os.preadv(fd, [views[i % n_dest]], offsets[i])
        return got

    best = 0.0
    try:
        with ThreadPoolExecutor(threads) as ex:
            for _ in range(passes):
                t0 = time.perf_counter()
                total = sum(ex.map(worker, range(threads)))
                best = max(best, total / (time.perf_counter() - t0) / 1e9)
        return best
    finally:
        os.close(fd)
        # Release the views before the buffer (worker still names `views`, so empty it
        # rather than delete the name).
        views.clear()
        del dest


# -- baselines --------------------------------------------------------------------------------
def python_baseline_fire(torch, path, offsets, row_bytes, pool, stage, side) -> float:
    """The plain Python store: 8-thread os.preadv into a pinned stage, one copy per row on a
    side stream as each read lands. Returns seconds."""
    fd = os.open(path, os.O_RDONLY)
    views = [memoryview(stage[j].numpy()) for j in range(len(offsets))]
    try:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(8) as ex:
            futs = {ex.submit(os.preadv, fd, [views[j]], int(o)): j for j, o in enumerate(offsets)}
            for fut in as_completed(futs):
                j = futs[fut]
                fut.result()
                if side is not None:
                    with torch.cuda.stream(side):
                        pool[j].copy_(stage[j], non_blocking=True)
                else:
                    pool[j].copy_(stage[j])
        if side is not None:
            side.synchronize()
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def kvikio_fire(kvikio, cufile, offsets, row_bytes, pool) -> float:
    """kvikio CuFile.pread of every row into its pool row (POSIX compat mode). Seconds."""
    t0 = time.perf_counter()
    futs = [cufile.pread(pool[j], row_bytes, int(o)) for j, o in enumerate(offsets)]
    for f in futs:
        f.get()
    return time.perf_counter() - t0


def kvikio_set_threads(kvikio, n: int) -> None:
    import kvikio.defaults as defaults  # a submodule: not imported by `import kvikio`

    if hasattr(defaults, "set"):
        defaults.set({"num_threads": n})
    else:  # kvikio < 24.x
        defaults.num_threads_reset(n)


# -- tierstore fires --------------------------------------------------------------------------
def tierstore_fire(torch, engine, device, offsets, row_bytes, pool, arena=None) -> float:
    """One fire through the engine: submit, then wait until the copies are done. Seconds."""
    n = len(offsets)
    dst = pool.data_ptr() + np.arange(n, dtype=np.uint64) * np.uint64(pool.stride(0))
    t0 = time.perf_counter()
    if arena is not None:  # arena hits: no read, copy straight from pinned memory
        src = arena.data_ptr() + np.arange(n, dtype=np.uint64) * np.uint64(arena.stride(0))
        c = engine.submit(np.full(n, -1, np.int64), row_bytes, src, dst, dst_device=(device == "cuda"))
    else:
        c = engine.submit(np.asarray(offsets, np.int64), row_bytes, None, dst, dst_device=(device == "cuda"))
    c.synchronize()
    return time.perf_counter() - t0


def summarize(seconds: list[float], n_rows: int, row_bytes: int) -> dict:
    s = np.asarray(seconds)
    gb = n_rows * row_bytes / 1e9
    return {
        "rows": n_rows,
        "repeats": len(seconds),
        "p50_ms": float(np.percentile(s, 50) * 1e3),
        "p99_ms": float(np.percentile(s, 99) * 1e3),
        "best_ms": float(s.min() * 1e3),
        "gbps_p50": float(gb / np.percentile(s, 50)),
        "gbps_best": float(gb / s.min()),
    }
