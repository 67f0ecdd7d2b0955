"""Benchmarks of the slot-aware fused MoE.

GPU (default when CUDA is present): kernel time at DS4 shapes vs the HBM roofline, for
the tensor-core grouped kernels (every T) and the v2 decode GEMV (T <= 16), with the
dequantise-then-bf16-GEMM baseline (torch reference in bf16) and the bf16 GEMM floor
(bf16 weights already gathered) beside each row. Bytes = the rows of the distinct routed
experts, read once (fp4 rows for resident experts, 2-bit rows otherwise); roofline = a
device-to-device copy measured in the same run (read + write bytes / time). Each timed
unit is a CUDA graph of R calls with R different routings, so consecutive calls do not hit
in L2.

    python bench/bench_moe.py --baseline           # GPU kernels, T = 1 .. 512, + baselines
    python bench/bench_moe.py --device cpu         # the torch reference (smaller E)
    python bench/bench_moe.py --pool-benefit       # output error: 2-bit base vs FP4 pool

--json PATH writes the numbers as JSON too.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import torch

from tierstore.compute.moe import BaseWeights, StaticPool, fused_moe_reference
from tierstore.format import layouts
from tierstore.testing.model import make_moe_model, pool_benefit, random_expert_rows


def _routings(R, T, E, k, seed, device):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]) for _ in range(R)])
    w = torch.rand(R, T, k, generator=g) + 0.1
    return w.to(device), ids.to(device)


def _bytes_read(ids, slot_table, H, I):
    fp4_b, base_b = layouts.row_bytes("fp4", H, I), layouts.row_bytes("base", H, I)
    total = 0
    for r in range(ids.shape[0]):
        experts = torch.unique(ids[r].reshape(-1))
        resident = slot_table[experts] >= 0
        total += int(resident.sum()) * fp4_b + int((~resident).sum()) * base_b
    return total


def copy_bandwidth(nbytes=1 << 30, iters=20) -> float:
    """Device-to-device copy, GB/s counting read + write."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    return 2 * nbytes * iters / (start.elapsed_time(end) / 1e3) / 1e9


def _graph_time(calls, iters) -> float:
    """Seconds per replay of a CUDA graph of ``calls`` (median of 3 runs of ``iters``)."""
    calls()  # warm-up and module load, eager
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    graph.replay()
    times = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / iters)
    return sorted(times)[1]


def _event_time(fn, iters=3) -> float:
    """Seconds per eager call (median), host syncs inside included."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def _bf16_gemm_floor(x, w, ids, W13, W2, iters=5) -> float:
    """The grouped bf16 GEMMs alone (weights already bf16 and gathered per routed expert,
    tokens padded per expert): the floor of any dequantise-then-bf16-GEMM path."""
    T, k = ids.shape
    I = W2.shape[-1]
    flat = ids.reshape(-1)
    experts, inv, counts = torch.unique(flat, return_inverse=True, return_counts=True)
    order = torch.argsort(inv, stable=True)
    pos = torch.arange(flat.numel(), device=x.device) - (torch.cumsum(counts, 0) - counts)[inv[order]]
    xin = torch.zeros(len(experts), int(counts.max()), x.shape[1], dtype=torch.bfloat16, device=x.device)
    xin[inv[order], pos] = x.bfloat16()[torch.arange(T, device=x.device).repeat_interleave(k)[order]]
    w13, w2 = W13[experts], W2[experts]

    def run():
        g = torch.bmm(xin, w13.transpose(1, 2))
        torch.bmm(torch.nn.functional.silu(g[..., :I]) * g[..., I:], w2.transpose(1, 2))

    # The gathered copies are freed when this returns (run's closure is the last holder).
    return _event_time(run, iters)


def bench_gpu(args) -> list[dict]:
    import importlib.util

    from tierstore.compute.moe_cuda import decode_workspace, fused_moe_decode, fused_moe_mma, mma_workspace

    H, I, E, k = args.H, args.I, args.E, args.k
    pool = StaticPool(random_expert_rows(E, "fp4", H, I, 0, "cuda").reshape(1, E, -1), E, "cuda")
    base = BaseWeights(random_expert_rows(E, "base", H, I, 1, "cuda").reshape(1, E, -1), H, I, "cuda")
    bw = copy_bandwidth()
    vllm = importlib.util.find_spec("vllm") is not None
    print(
        f"copy roofline {bw:.0f} GB/s (read + write); vLLM {'found' if vllm else 'not installed'}", flush=True
    )
    W13 = torch.randn(E, 2 * I, H, device="cuda", dtype=torch.bfloat16) if args.baseline else None
    W2 = torch.randn(E, H, I, device="cuda", dtype=torch.bfloat16) if args.baseline else None
    rows = []
    for resident in args.resident:
        pool.clear()
        chosen = {"none": [], "half": list(range(0, E, 2)), "all": list(range(E))}[resident]
        pool.promote([(0, e) for e in chosen])
        for T in args.T:
            R = args.rounds if T <= 16 else 2
            w, ids = _routings(R, T, E, k, seed=T, device="cuda")
            nbytes = _bytes_read(ids, pool.slot_table[0], H, I) / R
            base_us = floor_us = None
            if args.baseline:
                xb = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
                base_us = 1e6 * _event_time(
                    lambda: fused_moe_reference(xb, w[0], ids[0], 0, pool, base, dtype=torch.bfloat16)
                )
                floor_us = 1e6 * _bf16_gemm_floor(xb, w[0], ids[0], W13, W2)
            for dtype in [getattr(torch, d) for d in args.dtypes]:
                xs = torch.randn(R, T, H, device="cuda").to(dtype)
                for kernel in ["mma", "gemv"] if T <= 16 else ["mma"]:
                    if kernel not in args.kernels:
                        continue
                    outs = torch.empty_like(xs)
                    if kernel == "mma":
                        wss = [mma_workspace(T, k, E, H, I, dtype, "cuda") for _ in range(R)]
                        fn = fused_moe_mma
                    else:
                        wss = [decode_workspace(T, k, H, I, "cuda") for _ in range(R)]
                        fn = fused_moe_decode
                    calls = lambda: [
                        fn(xs[r], w[r], ids[r], 0, pool, base, out=outs[r], workspace=wss[r])
                        for r in range(R)
                    ]
                    t = _graph_time(calls, args.iters if T <= 64 else max(3, args.iters // 4)) / R
                    rel = None  # fp64 oracle only where it is quick (tests cover the rest)
                    if T <= args.max_check_T:
                        ref = fused_moe_reference(xs[0], w[0], ids[0], 0, pool, base, dtype=torch.float64)
                        rel = float((outs[0].double() - ref).norm() / ref.norm())
                    gbs = nbytes / t / 1e9
                    tflops = 2 * T * k * 3 * H * I / t / 1e12
                    rows.append(
                        {
                            "resident": resident,
                            "T": T,
                            "dtype": str(dtype).split(".")[-1],
                            "kernel": kernel,
                            "us": t * 1e6,
                            "MB_read": nbytes / 1e6,
                            "GB_s": gbs,
                            "copy_GB_s": bw,
                            "ratio": gbs / bw,
                            "TFLOP_s": tflops,
                            "rel_err_vs_fp64": rel,
                            "baseline_dequant_bf16_gemm_us": base_us,
                            "baseline_bf16_gemm_floor_us": floor_us,
                            "vllm_fused_moe": None if not vllm else "not run",
                        }
                    )
                    extra = (
                        ""
                        if base_us is None
                        else f"  | dequant+bf16 GEMM {base_us:9.1f} us, bf16 GEMM floor {floor_us:8.1f} us"
                    )
                    print(
                        f"{kernel:4s} resident={resident:4s} T={T:3d} {rows[-1]['dtype']:8s} "
                        f"{t * 1e6:8.1f} us {nbytes / 1e6:7.1f} MB {gbs:6.0f} GB/s = {gbs / bw:.2f} x copy "
                        f"{tflops:6.1f} TFLOP/s "
                        f"rel {'-' if rel is None else f'{rel:.1e}'}{extra}",
                        flush=True,
                    )
                    # Free this kernel's buffers before the next one allocates (the graph's
                    # closure `calls` still names them, so rebind rather than delete).
                    outs = wss = None
    if args.kernel_split:
        rows_split = _kernel_split(pool, base, H, I, E, k)
        for r in rows_split:
            print(
                f"kernel split T={r['T']:2d} resident={r['resident']}: "
                + "  ".join(f"{n} {us:.1f} us" for n, us in r["kernels_us"].items()),
                flush=True,
            )
    return rows


def _kernel_split(pool, base, H, I, E, k) -> list[dict]:
    """Mean device time of each decode kernel (torch profiler, eager calls), to see
    which stage the time goes to. Best effort: returns [] when the profiler fails."""
    from tierstore.compute.moe_cuda import decode_workspace, fused_moe_decode

    out = []
    try:
        from torch.profiler import ProfilerActivity, profile

        for resident in ("all", "none"):
            pool.clear()
            if resident == "all":
                pool.promote([(0, e) for e in range(E)])
            for T in (1, 16):
                w, ids = _routings(8, T, E, k, seed=100 + T, device="cuda")
                xs = torch.randn(8, T, H, device="cuda", dtype=torch.bfloat16)
                ws = decode_workspace(T, k, H, I, "cuda")
                res = torch.empty_like(xs[0])
                for r in range(8):
                    fused_moe_decode(xs[r], w[r], ids[r], 0, pool, base, out=res, workspace=ws)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for r in range(8):
                        fused_moe_decode(xs[r], w[r], ids[r], 0, pool, base, out=res, workspace=ws)
                    torch.cuda.synchronize()
                times = {}
                for ev in prof.key_averages():
                    if "moe_" in ev.key:
                        name = ev.key.split("moe_")[1].split("_kernel")[0]
                        dev_us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
                        times[name] = dev_us / max(ev.count, 1)
                out.append({"T": T, "resident": resident, "kernels_us": times})
    except Exception as exc:  # diagnostics only; never fail the bench
        print(f"kernel split skipped: {type(exc).__name__}: {exc}", flush=True)
    return out


def bench_cpu(args) -> list[dict]:
    H, I, E, k = args.H, args.I, args.cpu_E, args.k
    pool = StaticPool(random_expert_rows(E, "fp4", H, I, 0).reshape(1, E, -1), E)
    base = BaseWeights(random_expert_rows(E, "base", H, I, 1).reshape(1, E, -1), H, I)
    pool.promote([(0, e) for e in range(0, E, 2)])
    rows = []
    for T in args.T:
        w, ids = _routings(1, T, E, k, seed=T, device="cpu")
        x = torch.randn(T, H)
        fused_moe_reference(x, w[0], ids[0], 0, pool, base)
        t0 = time.perf_counter()
        n = 3
        for _ in range(n):
            fused_moe_reference(x, w[0], ids[0], 0, pool, base)
        t = (time.perf_counter() - t0) / n
        nbytes = _bytes_read(ids, pool.slot_table[0], H, I)
        rows.append({"T": T, "ms": t * 1e3, "MB_read": nbytes / 1e6, "GB_s": nbytes / t / 1e9})
        print(
            f"cpu reference T={T:2d} E={E} half resident: {t * 1e3:8.1f} ms, "
            f"{nbytes / 1e6:.1f} MB of rows -> {nbytes / t / 1e9:.2f} GB/s",
            flush=True,
        )
    return rows


def bench_pool_benefit(args) -> dict:
    out = {}
    for dist in ("student_t", "gaussian"):
        m = make_moe_model(args.pb_layers, args.pb_experts, args.pb_H, args.pb_I, seed=0, dist=dist)
        r = pool_benefit(m, n_tokens=args.pb_tokens, top_k=args.pb_topk)
        out[dist] = r
        errs = "  ".join(f"{f:.2f}:{e:.3f}" for f, e in zip(r["fractions"], r["rel_err"]))
        print(
            f"pool benefit {dist:9s} L={args.pb_layers} E={args.pb_experts} H={args.pb_H} "
            f"I={args.pb_I} top{args.pb_topk} T={args.pb_tokens}: fraction FP4 -> rel err  {errs}",
            flush=True,
        )
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu"
    )
    p.add_argument(
        "--T", type=lambda s: [int(v) for v in s.split(",")], default=[1, 4, 16, 32, 64, 128, 256, 512]
    )
    p.add_argument(
        "--kernels",
        type=lambda s: s.split(","),
        default=["mma", "gemv"],
        help="mma: tensor-core grouped kernels (any T); gemv: the v2 decode kernel (T <= 16)",
    )
    p.add_argument("--max-check-T", type=int, default=64, help="largest T checked against fp64")
    p.add_argument(
        "--baseline",
        action="store_true",
        help="also time dequantise-then-bf16-GEMM (torch) and the bf16 GEMM floor",
    )
    p.add_argument("--H", type=int, default=4096)
    p.add_argument("--I", type=int, default=2048)
    p.add_argument("--E", type=int, default=256)
    p.add_argument("--cpu-E", type=int, default=32)
    p.add_argument("--k", type=int, default=6)
    p.add_argument("--rounds", type=int, default=8, help="routings per graph (defeats L2 reuse)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--resident", type=lambda s: s.split(","), default=["none", "half", "all"])
    p.add_argument("--dtypes", type=lambda s: s.split(","), default=["bfloat16", "float32"])
    p.add_argument("--kernel-split", action="store_true", help="also profile each kernel (GPU)")
    p.add_argument("--pool-benefit", action="store_true")
    p.add_argument("--pb-layers", type=int, default=4)
    p.add_argument("--pb-experts", type=int, default=32)
    p.add_argument("--pb-H", type=int, default=512)
    p.add_argument("--pb-I", type=int, default=256)
    p.add_argument("--pb-topk", type=int, default=4)
    p.add_argument("--pb-tokens", type=int, default=64)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    result = {
        "machine": platform.node(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "argv": sys.argv[1:],
        "torch": torch.__version__,
    }
    if args.pool_benefit:
        result["pool_benefit"] = bench_pool_benefit(args)
    elif args.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name()
        result["kernel"] = bench_gpu(args)
    else:
        result["cpu_reference"] = bench_cpu(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
