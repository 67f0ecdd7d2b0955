"""Adapter + gate costs, with the ceilings they are compared to measured in the same run.

    python bench/bench_adapter.py [--rows-mb 64] [--reps 20]

1. Gate: ``fire_mask`` / ``should_fire`` on decode logits [rows, 129,280] (DS4's vocab),
   float32 and bf16, against one read of the logits at this machine's copy bandwidth
   (``dst.copy_(logits)``, counted as read + write bytes).
2. Tier step overhead at DS4 geometry (43 layers x 256 experts, top-6, batch 1 / 8):
   43 ``mark_seen`` calls, ``step_end`` (one host read of ``seen``, record, store step),
   and a ``force_promote`` whose experts are all resident (bookkeeping only).
3. ``TierstoreBackend.rows_for``: 64 FP4 rows of 13,369,344 bytes (DS4 ``fp4``) from
   the page cache, against (a) vLLM-Moet's way, one ``os.preadv`` per row from an
   8-thread pool, and (b) the ceiling: 2-thread ``preadv`` of the same bytes in
   large chunks into a preallocated buffer (this box has 2 cores).

Results: bench/results/adapter.md. CPU only (the GPU replay is a test, not a bench).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import statistics
import tempfile
import time

import numpy as np
import torch

from tierstore.adapters.moet_backend import TierstoreBackend
from tierstore.adapters.moet_config import config_from_env
from tierstore.adapters.vllm_moet import MoetTier
from tierstore.compute.gate import UncertaintyGate
from tierstore.testing.packs import make_random_pack

VOCAB, L, E, K = 129_280, 43, 256, 6
FP4_ROW = 13_369_344


def median_s(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def timed_after(setup, fn, reps: int) -> float:
    """Median time of ``fn`` alone, ``setup`` run untimed before each call."""
    times = []
    for _ in range(reps + 1):
        setup()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def bench_gate(reps: int) -> list[str]:
    lines = ["| logits | fire_mask | should_fire | copy ceiling (read once) | one exp pass (fp32) "
             "| gate GB/s vs copy GB/s |", "|---|---|---|---|---|---|"]
    gate = UncertaintyGate()
    for rows in (1, 8, 64):
        for dtype in (torch.float32, torch.bfloat16):
            logits = torch.randn(rows, VOCAB).to(dtype)
            dst = torch.empty_like(logits)
            t_mask = median_s(lambda: gate.fire_mask(logits), reps)
            t_fire = median_s(lambda: gate.decide(logits), reps)
            t_copy = median_s(lambda: dst.copy_(logits), reps)
            as_float = logits.float()
            t_exp = median_s(lambda: torch.exp(as_float), reps)
            nbytes = logits.numel() * logits.element_size()
            copy_gbps = 2 * nbytes / t_copy / 1e9
            gate_gbps = nbytes / t_mask / 1e9
            lines.append(f"| [{rows}, {VOCAB}] {str(dtype).split('.')[1]} | {t_mask * 1e6:.0f} us | "
                         f"{t_fire * 1e6:.0f} us | {nbytes / (copy_gbps * 1e9) * 1e6:.0f} us "
                         f"({copy_gbps:.1f} GB/s) | {t_exp * 1e6:.0f} us | {gate_gbps:.2f} / {copy_gbps:.1f} "
                         f"= {gate_gbps / copy_gbps:.2f} |")
    return lines


def bench_tier_step(reps: int) -> list[str]:
    lines = ["| batch | 43 x mark_seen | step_end | force_promote (all resident) |", "|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as d:
        make_random_pack(d, L, E, 64, seed=1).close()
        env = {"VLLM_MOE_W2_STORE_DIR": d, "VLLM_MOE_W2_DELTA_GB": repr(2048 * 64 / 2**30),
               "VLLM_MOE_W2_BASE_RAM_GB": "0", "VLLM_MOE_W2_POOL_HEAT": "0",
               "VLLM_MOE_W2_DELTA_PROMOTE": "0", "VLLM_MOE_W2_GATE_MAX_PROMOTE": "4096"}
        with MoetTier(config_from_env(env), device="cpu", base_tag=None) as tier:
            rng = np.random.default_rng(0)
            for batch in (1, 8):
                ids = [torch.from_numpy(np.stack([rng.choice(E, K, replace=False)
                                                  for _ in range(batch)])) for _ in range(L)]

                def mark():
                    for layer in range(L):
                        tier.mark_seen(layer, ids[layer])

                mark()
                tier.force_promote()              # make this routing resident once
                tier.step_end()
                t_mark = median_s(lambda: (mark(), tier.seen.zero_()), reps)
                t_step = timed_after(mark, tier.step_end, reps)
                t_fire = timed_after(mark, lambda: tier.force_promote(pin=False), reps)
                tier.step_end()
                lines.append(f"| {batch} | {t_mark * 1e6:.0f} us | {t_step * 1e6:.0f} us | "
                             f"{t_fire * 1e6:.0f} us |")
    return lines


def bench_rows_for(n_rows: int, reps: int) -> list[str]:
    with tempfile.TemporaryDirectory() as d:
        pack = make_random_pack(d, 1, n_rows, FP4_ROW, seed=2)
        from tierstore.store.expert_store import ExpertStore
        store = ExpertStore(pack, vram_slots=8, ram_gb=0, device="cpu", threads=8, lazy_per_step=0)
        backend = TierstoreBackend(store)
        pairs = [(0, e) for e in range(n_rows)]
        total = n_rows * FP4_ROW
        fd = os.open(pack.path, os.O_RDONLY)
        ref_buf = np.empty((n_rows, FP4_ROW), np.uint8)
        offsets = pack.row_offsets(np.arange(n_rows))

        def reference_per_row():
            with cf.ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda i: os.preadv(fd, [memoryview(ref_buf[i])], int(offsets[i])),
                              range(n_rows)))

        flat = ref_buf.reshape(-1)
        span = int(offsets[-1]) + pack.stride
        chunk = 64 << 20

        def ceiling():
            def read(off):
                n = min(chunk, total - off)
                os.preadv(fd, [memoryview(flat[off:off + n])], off)
            with cf.ThreadPoolExecutor(2) as pool:
                list(pool.map(read, range(0, total, chunk)))

        def ceiling_fresh():
            nonlocal flat
            flat = np.empty(total, np.uint8)
            ceiling()

        for _ in range(2):                          # the pack is in the page cache now
            reference_per_row()
        t_ceiling = median_s(ceiling, reps)
        t_fresh = median_s(ceiling_fresh, reps)
        flat = ref_buf.reshape(-1)
        t_ref = median_s(reference_per_row, reps)
        t_scan = median_s(lambda: backend.rows_for(pairs, scan=True), reps)
        t_owned = median_s(lambda: backend.rows_for(pairs, scan=True, copy=True), reps)
        os.close(fd)
        store.close()
        gb = lambda t: total / t / 1e9  # noqa: E731
        assert span >= total
        return ["| path | 64 rows (%.2f GB) | GB/s | vs ceiling |" % (total / 1e9), "|---|---|---|---|",
                f"| ceiling: 2-thread preadv, 64 MiB chunks, preallocated | {t_ceiling * 1e3:.0f} ms | "
                f"{gb(t_ceiling):.2f} | 1.00 |",
                f"| vLLM-Moet way: os.preadv per row, 8 threads, preallocated | {t_ref * 1e3:.0f} ms | "
                f"{gb(t_ref):.2f} | {t_ceiling / t_ref:.2f} |",
                f"| rows_for(scan=True): engine batch into the backend's reused stage | "
                f"{t_scan * 1e3:.0f} ms | {gb(t_scan):.2f} | {t_ceiling / t_scan:.2f} |",
                f"| ceiling into a fresh buffer (np.empty each call, page faults) | "
                f"{t_fresh * 1e3:.0f} ms | {gb(t_fresh):.2f} | {t_ceiling / t_fresh:.2f} |",
                f"| rows_for(scan=True, copy=True): caller-owned fresh buffer | "
                f"{t_owned * 1e3:.0f} ms | {gb(t_owned):.2f} | {t_ceiling / t_owned:.2f} |"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch threads 1, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}\n")
    for title, lines in (("gate", bench_gate(args.reps)), ("tier step", bench_tier_step(args.reps)),
                         ("rows_for", bench_rows_for(args.rows, max(3, args.reps // 4)))):
        print(f"## {title}\n")
        print("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
