"""Measurements behind ``tierstore bench fire``: the bench pack, byte checks, store
fires through the public API, the engine alone and the baselines on the same rows.

Every timed fire is ``ExpertStore.fire`` + ``torch.cuda.synchronize`` (nothing on
the CPU pool), then, untimed, every row it made resident is checked against the
pack: the sum of its 64-bit words (mod 2**64) must equal the sum computed from the
file (on the GPU the sums run on the device, one reduction per fire).
"""

from __future__ import annotations

import os
import time

import numpy as np

from tierstore.cli import bench_io_measure as m
from tierstore.errors import CapacityError


# -- the pack -----------------------------------------------------------------------------
def create_pack(out_dir: str, n_layers: int, n_experts: int, slot_bytes: int) -> str:
    """The bench pack in ``out_dir`` (written once; a re-run reuses it): non-zero
    pseudo-random rows that all differ (each gets its own 8-byte header and a rotation
    of one 64 MiB block), so a row copied to the wrong slot fails its check. Writing
    stays at disk speed (no per-row random generation). Returns the pack's path."""
    from tierstore.format.writer import PackWriter

    rng = np.random.default_rng(0)
    block = rng.integers(1, 256, size=max(64 << 20, 2 * slot_bytes), dtype=np.uint8)
    rows = np.empty((n_experts, slot_bytes), dtype=np.uint8)
    with PackWriter(
        out_dir,
        tag="bench",
        n_layers=n_layers,
        n_experts=n_experts,
        slot_bytes=slot_bytes,
        ckpt_id=f"bench-fire-{n_layers}x{n_experts}x{slot_bytes}",
        quantizer_abi="tierstore-bench-v1",
    ) as w:
        for layer in range(n_layers):
            if w.is_written(layer):
                continue
            for e in range(n_experts):
                k = layer * n_experts + e
                start = (k * 4097 * 8) % (len(block) - slot_bytes)
                rows[e] = block[start : start + slot_bytes]
                rows[e, :8] = np.frombuffer(np.int64(k).tobytes(), np.uint8) | 1
            w.write_layer(layer, rows)
        return w.path


def row_sums(pack) -> np.ndarray:
    """int64 [n_keys]: the wrapping sum of each row's 64-bit words, from the file."""
    out = np.zeros(pack.n_layers * pack.n_experts, dtype=np.int64)
    mm = np.memmap(pack.path, dtype=np.uint8, mode="r")
    for k in range(len(out)):
        off = k * pack.stride
        row = np.asarray(mm[off : off + pack.slot_bytes])
        out[k] = row.view(np.uint64).sum(dtype=np.uint64).view(np.int64)
    del mm
    return out


def device_sums(torch, rows) -> np.ndarray:
    """The same sums of tensor rows [n, slot_bytes] (uint8), on the rows' device."""
    if rows.shape[0] == 0:
        return np.zeros(0, np.int64)
    return rows.view(torch.int64).sum(dim=1).cpu().numpy()


class Checker:
    """Counts every row checked and every mismatch (a mismatch is also an error)."""

    def __init__(self, torch, sums: np.ndarray):
        self.torch, self.sums, self.rows, self.bad = torch, sums, 0, []

    def store_rows(self, store, keys: np.ndarray, what: str) -> None:
        torch = self.torch
        table = store.slot_table.view(-1)
        slots = table[torch.as_tensor(keys, device=table.device)].long()
        if bool((slots < 0).any()):
            self.bad.append(f"{what}: {int((slots < 0).sum())} keys not resident")
            return
        self.compare(device_sums(torch, store.pool[slots]), keys, what)

    def pool_rows(self, pool, keys: np.ndarray, what: str) -> None:
        self.compare(device_sums(self.torch, pool[: len(keys)]), keys, what)

    def compare(self, got: np.ndarray, keys: np.ndarray, what: str) -> None:
        self.rows += len(keys)
        wrong = np.flatnonzero(got != self.sums[keys])
        if len(wrong):
            self.bad.append(
                f"{what}: {len(wrong)} of {len(keys)} rows differ (first key {int(keys[wrong[0]])})"
            )


# -- timing helpers -----------------------------------------------------------------------
def sync(torch, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def empty_pool(store) -> None:
    """Evict every unpinned pool key (untimed set-up: the next fire misses)."""
    res = store.resident_keys("pool")
    if len(res):
        store.evict(res)


def store_fire(torch, device, store, keys, pairs) -> tuple[float, float, object]:
    """(seconds to fire + device sync, seconds inside fire, FireResult)."""
    sync(torch, device)
    t0 = time.perf_counter()
    fr = store.fire(pairs, max_promote=len(keys))
    sync(torch, device)
    return time.perf_counter() - t0, fr.latency_s, fr


def check_placed(store, fr, n: int, what: str) -> None:
    """A benchmark fire must place every routed row; one that did not was sized wrong
    by the benchmark (a pool smaller than the fire), which is said as such instead of
    surfacing later as a byte check of rows that were never read."""
    if fr.no_slot or fr.over_cap:
        raise CapacityError(
            f"{store.pack.path}: bench fire {what}: the pool of {store.n_slots} "
            f"slots left {fr.no_slot + fr.over_cap} of {n} routed rows unplaced "
            f"(no slot {fr.no_slot}, over max_promote {fr.over_cap}); the "
            f"benchmark's pool is smaller than its fire"
        )


def engine_fire(torch, device, engine, offsets, src, dst, row) -> float:
    """The engine alone, same rows: one submit, then wait for the copies."""
    sync(torch, device)
    t0 = time.perf_counter()
    c = engine.submit(offsets, row, src, dst, dst_device=(device == "cuda"))
    c.synchronize()
    sync(torch, device)
    return time.perf_counter() - t0


def summary(seconds, n_rows: int, row_bytes: int, inner=None) -> dict:
    out = m.summarize(list(seconds), n_rows, row_bytes)
    if inner:
        out["in_fire_p50_ms"] = float(np.median(inner) * 1e3)
    return out


# -- the fires ----------------------------------------------------------------------------
def run_source(ctx, source: str, n: int, repeats: int) -> dict:
    """Store fires of n rows from ``source`` (arena / pagecache / cold), the engine alone
    on the same rows in the same loop; every store fire byte-checked."""
    torch, device, row = ctx.torch, ctx.device, ctx.row
    store = ctx.store_arena if source == "arena" else ctx.store_read
    engine = store.engine
    t_store, t_in, t_engine = [], [], []
    for rep in range(repeats + (0 if source == "cold" else 1)):  # one warm-up where cheap
        keys = ctx.pick(n)
        pairs = np.stack([keys // ctx.E, keys % ctx.E], axis=1)
        empty_pool(store)
        if source == "arena":
            store.load_arena(pairs)
        elif source == "cold":
            ctx.res["evict"] = m.evict(ctx.path, ctx.drop_caches)
        t, inner, fr = store_fire(torch, device, store, keys, pairs)
        check_placed(store, fr, n, f"{source} fire")
        ok = fr.promoted == n and (source != "arena" or fr.sources["arena"] == n)
        if not ok:
            ctx.check.bad.append(f"{source} {n}: promoted {fr.promoted}, sources {fr.sources}")
        ctx.check.store_rows(store, keys, f"{source} fire of {n}")
        store.release(fr)
        # The engine alone on the same rows, into the same (now unpublished) slots.
        empty_pool(store)
        dst = store._pool.slot_ptrs(np.arange(n))
        if source == "arena":
            a = store._arena
            src = a.row_ptrs(a.resident_slot[keys].astype(np.int64))
            offsets = np.full(n, -1, np.int64)
        else:
            src, offsets = None, ctx.pack.row_offsets(keys)
            if source == "cold":
                m.evict(ctx.path, ctx.drop_caches)
        te = engine_fire(torch, device, engine, offsets, src, dst, row)
        ctx.check.pool_rows(store.pool, keys, f"engine {source} {n}")
        if rep or source == "cold" or repeats == 0:
            t_store.append(t)
            t_in.append(inner)
            t_engine.append(te)
    return {"store": summary(t_store, n, row, t_in), "engine": summary(t_engine, n, row)}


def run_baselines(ctx, source: str, n: int, kvikio_threads: list[int]) -> dict:
    """The plain Python store and kvikio (when importable, CUDA only) on the same rows
    of the same file, into the read store's pool memory; each byte-checked."""
    torch, device, row = ctx.torch, ctx.device, ctx.row
    pool = ctx.store_read.pool
    empty_pool(ctx.store_read)
    out = {}
    side = torch.cuda.Stream() if device == "cuda" else None
    stage = torch.empty((n, row), dtype=torch.uint8, pin_memory=(device == "cuda"))
    reps = 1 if source == "cold" else ctx.repeats
    t = []
    for rep in range(reps + (0 if source == "cold" else 1)):
        keys = ctx.pick(n)
        if source == "cold":
            m.evict(ctx.path, ctx.drop_caches)
        s = m.python_baseline_fire(torch, ctx.path, ctx.pack.row_offsets(keys), row, pool, stage, side)
        ctx.check.pool_rows(pool, keys, f"plain python {source} {n}")
        if rep or source == "cold":
            t.append(s)
    out["python8t"] = summary(t, n, row)
    del stage
    if device != "cuda":
        out["kvikio"] = "skipped: needs a CUDA device"
        return out
    os.environ.setdefault("KVIKIO_COMPAT_MODE", "ON")
    try:
        import kvikio
    except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
        out["kvikio"] = f"skipped: import failed ({type(exc).__name__}: {exc})"
        return out
    for threads in kvikio_threads:
        try:
            m.kvikio_set_threads(kvikio, threads)
            f = kvikio.CuFile(ctx.path, "r")
            t = []
            try:
                for rep in range(reps + (0 if source == "cold" else 1)):
                    keys = ctx.pick(n)
                    if source == "cold":
                        m.evict(ctx.path, ctx.drop_caches)
                    s = m.kvikio_fire(kvikio, f, ctx.pack.row_offsets(keys), row, pool)
                    sync(torch, device)
                    ctx.check.pool_rows(pool, keys, f"kvikio {threads}t {source} {n}")
                    if rep or source == "cold":
                        t.append(s)
            finally:
                f.close()
            out[f"kvikio{threads}t"] = summary(t, n, row)
        except Exception as exc:  # noqa: BLE001 - a baseline failing must not lose the run
            out[f"kvikio{threads}t"] = f"failed: {type(exc).__name__}: {exc}"
    return out


def read_bounds(ctx, n: int, threads: int) -> dict:
    """In C++, this run: N threads pread the same kind of rows into pinned memory, from
    the page cache (file warm) and with O_DIRECT (disk)."""
    from tierstore import _C

    keys = np.sort(ctx.pick(n))
    offsets = np.ascontiguousarray(ctx.pack.row_offsets(keys), dtype=np.int64)
    m.warm(ctx.path, os.path.getsize(ctx.path))
    pc = _C.measure_read_bound(ctx.path, offsets, ctx.row, threads, False, 4 << 20, 5)
    out = {
        "rows": n,
        "threads": threads,
        "pagecache_gbps": pc["bytes"] / pc["best_s"] / 1e9,
        "pagecache_median_gbps": pc["bytes"] / pc["median_s"] / 1e9,
        "pinned": bool(pc["pinned"]),
    }
    try:
        dr = _C.measure_read_bound(ctx.path, offsets, ctx.row, threads, True, 4 << 20, 1)
        out["odirect_gbps"] = dr["bytes"] / dr["best_s"] / 1e9
    except OSError as exc:  # tmpfs and some filesystems refuse O_DIRECT
        out["odirect_gbps"] = None
        out["odirect_error"] = str(exc).split(" [")[0]
    return out
