"""``tierstore bench fire``, second half: the pipelined 43-layer step, the bookkeeping
floors, the ways around the page-cache copy bound (a registered window of file pages,
GPU reads of mapped pages, io_uring availability) and the PNG.

A failing experiment records its error as a string and the run goes on.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import mmap
import os
import tempfile
import time

import numpy as np

from tierstore.cli import bench_fire_measure as fm


# -- pipelined step -----------------------------------------------------------------------
def _sleep_cycles_per_ms(torch) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return 20_000_000 / start.elapsed_time(end)


def pipelined_step(ctx, misses: int, repeats: int, layer_ms: float | None, groups: list[int] = (0,)) -> dict:
    """A synthetic decode step: every layer has ``misses`` routed experts not resident
    (page cache); a stand-in op per layer (a GPU sleep of ``layer_ms`` plus a checksum
    of that layer's routed rows read through the slot table). Serial: fire, then the
    43 ops; pipelined: fire(pipelined=True), then per layer wait_layer + op. Default
    ``layer_ms``: the serial fire's time / layers (reads and compute of one size)."""
    torch, device, store, E = ctx.torch, ctx.device, ctx.store_read, ctx.E
    L = ctx.pack.n_layers
    cuda = device == "cuda"
    stream = torch.cuda.current_stream() if cuda else None
    out = {"layers": L, "misses_per_layer": misses, "repeats": repeats}
    rng = np.random.default_rng(7)
    cyc = _sleep_cycles_per_ms(torch) if cuda else 0.0
    sums = torch.zeros(L, dtype=torch.int64, device=store.pool.device)
    table = store.slot_table

    def routed():
        ex = np.stack([rng.choice(E, misses, replace=False) for _ in range(L)])
        return np.stack([np.repeat(np.arange(L), misses), ex.reshape(-1)], axis=1)

    def op(layer, ids, ms):
        if cuda and ms > 0:
            torch.cuda._sleep(int(ms * cyc))
        rows = store.pool[table[layer, ids].long()]
        sums[layer] = rows.view(torch.int64).sum()

    def one(pairs, pipelined, ms):
        fm.empty_pool(store)
        per_layer = [torch.as_tensor(pairs[pairs[:, 0] == l, 1], device=table.device) for l in range(L)]
        fm.sync(torch, device)
        t0 = time.perf_counter()
        fr = store.fire(pairs, max_promote=len(pairs), stream=stream, pipelined=pipelined)
        t_fire = time.perf_counter() - t0
        fm.check_placed(store, fr, len(pairs), "pipelined step")
        for l in range(L):
            fr.wait_layer(l)
            op(l, per_layer[l], ms)
        fm.sync(torch, device)
        t = time.perf_counter() - t0
        dense = pairs[:, 0] * E + pairs[:, 1]
        want = np.array([ctx.check.sums[dense[pairs[:, 0] == l]].sum() for l in range(L)])
        got = sums.cpu().numpy()
        ctx.check.rows += len(dense)
        if not np.array_equal(got, want):
            ctx.check.bad.append(
                f"pipelined={pipelined} step: {int(np.sum(got != want))} layers' checksums differ"
            )
        store.release(fr)
        return t, t_fire

    fires = [one(routed(), False, 0.0)[0] for _ in range(3)]
    fire_ms = float(np.median(fires[1:]) * 1e3)
    ms = (fire_ms / L) if layer_ms is None else float(layer_ms)
    out.update({"fire_only_ms": fire_ms, "layer_ms": ms, "compute_only_ms": ms * L})
    # Serial and every grouping on the same routing, interleaved, so drift hits all.
    serial, piped, piped_return = [], {g: [] for g in groups}, {g: [] for g in groups}
    for rep in range(repeats + 1):
        pairs = routed()
        s = one(pairs, False, ms)[0]
        for g in groups:
            p, pr = one(pairs, g if g else True, ms)
            if rep:
                piped[g].append(p)
                piped_return[g].append(pr)
        if rep:
            serial.append(s)
    out["serial_ms"] = float(np.median(serial) * 1e3)
    out["by_group_bytes"] = {
        str(g): {
            "pipelined_ms": float(np.median(piped[g]) * 1e3),
            "fire_returns_ms": float(np.median(piped_return[g]) * 1e3),
        }
        for g in groups
    }
    best = min(groups, key=lambda g: np.median(piped[g]))
    out["group_bytes"] = best
    out["pipelined_ms"] = out["by_group_bytes"][str(best)]["pipelined_ms"]
    out["pipelined_fire_returns_ms"] = out["by_group_bytes"][str(best)]["fire_returns_ms"]
    out["speedup"] = out["serial_ms"] / out["pipelined_ms"]
    out["saved_share"] = 1 - out["pipelined_ms"] / out["serial_ms"]
    return out


# -- bookkeeping --------------------------------------------------------------------------
def bookkeeping(device: str, work_dir: str, rounds: int = 2000) -> dict:
    """DS4 geometry (43 layers x 256 experts, top-6) with tiny rows: an all-resident fire
    of 258 keys + release, and 43 x record + step at batch 1 and 256 (medians, us)."""
    import tierstore as ts

    L, E, K = 43, 256, 6
    d = tempfile.mkdtemp(prefix="bookkeeping-", dir=work_dir)
    path = fm.create_pack(d, L, E, 64)
    out = {}
    with ts.ExpertStore(path, vram_slots=1024, ram_gb=0, device=device, lazy_per_step=0, threads=2) as s:
        rng = np.random.default_rng(3)
        routed = np.array([(l, e) for l in range(L) for e in rng.choice(E, K, replace=False)])
        s.promote(routed).wait(60)

        def med(f, n):
            for _ in range(min(200, n)):
                f()
            t = []
            for _ in range(n):
                t0 = time.perf_counter()
                f()
                t.append(time.perf_counter() - t0)
            return float(np.median(t) * 1e6), float(np.min(t) * 1e6)

        out["fire_release_258_resident_us"] = med(lambda: s.release(s.fire(routed)), rounds)
        for batch in (1, 256):
            ids = [rng.integers(0, E, (batch, K)) for _ in range(L)]

            def rs():
                for l in range(L):
                    s.record(l, ids[l])
                s.step()

            out[f"record43_step_b{batch}_us"] = med(rs, max(100, rounds // 5))
    return out


# -- ways around the copy bound -----------------------------------------------------------
def io_uring_probe() -> str:
    """Whether this kernel lets us create an io_uring (raw syscall; no liburing)."""
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
    fd = libc.syscall(425, 8, params)  # __NR_io_uring_setup on x86_64 and arm64
    if fd >= 0:
        os.close(fd)
        return "available"
    err = ctypes.get_errno()
    return f"unavailable: {_errno.errorcode.get(err, err)}"


def registered_window(ctx, n: int, repeats: int) -> dict:
    """mmap n contiguous rows of the (cached) file, cudaHostRegister them read-only
    once, then fire from the window (engine rows with no read: DMA straight from the
    page-cache pages); register / fire / unregister times. Then, on the same window
    registered as mapped, a GPU kernel that reads the pages itself (cupy), and the
    same kernel on the plain mapping when the device reads pageable memory."""
    torch, row, store = ctx.torch, ctx.row, ctx.store_read
    cudart = torch.cuda.cudart()
    out = {"rows": n}
    span = n * ctx.pack.stride
    fd = os.open(ctx.path, os.O_RDONLY)
    mm = mmap.mmap(fd, span, prot=mmap.PROT_READ)
    os.close(fd)
    window = np.frombuffer(mm, dtype=np.uint8)
    base = window.ctypes.data
    store.engine.register_buffer(window)  # the engine's submit accepts registered memory only
    fm.sync(torch, "cuda")
    keys = np.arange(n)
    try:
        for flags, name in ((8, "readonly"), (8 | 2, "readonly_mapped")):
            t0 = time.perf_counter()
            rc = cudart.cudaHostRegister(base, span, flags)
            out[f"register_{name}_ms"] = (time.perf_counter() - t0) * 1e3
            if int(rc) != 0:
                out[f"register_{name}"] = f"failed: cudaError {int(rc)}"
                continue
            try:
                if name == "readonly":
                    fm.empty_pool(store)
                    src = base + np.arange(n, dtype=np.uint64) * np.uint64(ctx.pack.stride)
                    dst = store._pool.slot_ptrs(keys)
                    t = [
                        fm.engine_fire(torch, "cuda", store.engine, np.full(n, -1, np.int64), src, dst, row)
                        for _ in range(repeats + 1)
                    ][1:]
                    ctx.check.pool_rows(store.pool, keys, "registered window fire")
                    out["window_fire"] = fm.summary(t, n, row)
                else:
                    out["gpu_reads_mapped"] = _gpu_read(ctx, base, n, repeats, "mapped window")
            finally:
                t0 = time.perf_counter()
                cudart.cudaHostUnregister(base)
                out[f"unregister_{name}_ms"] = (time.perf_counter() - t0) * 1e3
        out["gpu_reads_pageable"] = _gpu_read(ctx, base, n, repeats, "pageable mapping", need_pageable=True)
    finally:
        store.engine.unregister_buffer(window)
        del base, window
        try:
            mm.close()
        except BufferError:
            pass
    return out


def _gpu_read(ctx, base: int, n: int, repeats: int, what: str, need_pageable=False):
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001
        return f"skipped: cupy import failed ({type(exc).__name__})"
    if need_pageable and not cupy.cuda.runtime.deviceGetAttribute(88, 0):  # PageableMemoryAccess
        return "skipped: the device does not read pageable host memory (no HMM/ATS)"
    try:
        stride, row = ctx.pack.stride, ctx.row
        mem = cupy.cuda.UnownedMemory(base, n * stride, None)
        src = cupy.ndarray((n, stride // 8), dtype=cupy.uint64, memptr=cupy.cuda.MemoryPointer(mem, 0))
        dst = cupy.empty((n, stride // 8), dtype=cupy.uint64)
        copy = cupy.ElementwiseKernel("raw uint64 x", "uint64 y", "y = x[i]", "tierstore_mapped_read")
        t = []
        for _ in range(repeats + 1):
            cupy.cuda.runtime.deviceSynchronize()
            t0 = time.perf_counter()
            copy(src, dst)
            cupy.cuda.runtime.deviceSynchronize()
            t.append(time.perf_counter() - t0)
        got = dst[:, : row // 8].sum(axis=1).get().view(np.int64)
        ctx.check.compare(got, np.arange(n), f"GPU reads of {what}")
        return fm.summary(t[1:], n, row)
    except Exception as exc:  # noqa: BLE001
        return f"failed: {type(exc).__name__}: {exc}"


# -- the PNG ------------------------------------------------------------------------------
def plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sources = [s for s in ("arena", "pagecache", "cold") if s in res["fires"]]
    fig, axes = plt.subplots(1, max(1, len(sources)), figsize=(5 * max(1, len(sources)), 4))
    axes = np.atleast_1d(axes)
    for ax, src in zip(axes, sources):
        rows = sorted(res["fires"][src].items(), key=lambda kv: int(kv[0]))
        n = [int(k) for k, _ in rows]
        ax.plot(n, [v["store"]["gbps_p50"] for _, v in rows], "o-", label="store.fire")
        ax.plot(n, [v["engine"]["gbps_p50"] for _, v in rows], "s--", label="engine alone")
        ceiling = res["ratios"].get(f"{src}_ceiling_gbps")
        if ceiling:
            ax.axhline(ceiling, color="k", lw=1, ls=":", label=f"bound {ceiling:.1f} GB/s")
        for name, v in res["baselines"].get(src, {}).items():
            if isinstance(v, dict):
                ax.plot([v["rows"]], [v["gbps_p50"]], "x", ms=9, label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("rows per fire")
        ax.set_ylabel("GB/s (p50)")
        ax.set_title(src)
        ax.legend(fontsize=7)
    fig.suptitle(f"tierstore bench fire ({res['device']}, rows of {res['row_bytes']} B)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
