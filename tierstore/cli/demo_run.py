"""The main job, end to end, on a small generated model (``tierstore demo``).

1. Generate a small MoE model with heavy-tailed weights, quantise it for real
   (MXFP4 "recovery" rows and 2-bit "base" rows) and write both packs.
2. Measure, in this run, the ceilings the figures are compared with: the pool copy
   (pinned H2D on a GPU, a large memcpy on the CPU pool) and the page-cache read.
3. Open an ExpertStore over the FP4 pack (GPU pool if a GPU is present, else the
   CPU pool) and run a decode loop: routing from the synthetic router, the
   slot-aware fused MoE per layer, and the uncertainty gate firing on unsure steps
   (fire = promote the step's routed experts, re-run the step).
4. Print a summary (hit rates per tier, fire latency p50/p99, promote GB/s against
   the ceiling, output error with the base alone and with the pool), save a poolmon
   snapshot, restart warm-started from it and show the difference.

It composes the public pieces only; nothing here is special-cased for the demo.
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class DemoConfig:
    n_layers: int = 8
    n_experts: int = 48
    hidden: int = 128
    inter: int = 64
    top_k: int = 6
    vocab: int = 256
    steps: int = 200
    warm_steps: int = 50          # steps compared cold vs warm after the restart
    pool_fraction: float = 0.25   # pool slots as a fraction of all experts
    ram_fraction: float = 0.5     # arena rows as a fraction of all experts
    seed: int = 0
    device: str = "auto"
    out: str | None = None
    temperature: float = 8.0      # scales the LM head: sets how often the gate fires


@dataclass
class RunReport:
    steps: int = 0
    fires: int = 0
    rounds: int = 0
    err_base: list = field(default_factory=list)
    err_pool: list = field(default_factory=list)
    stats: object = None
    early_pool_hit_rate: float = 0.0
    seconds: float = 0.0


# -- ceilings, measured in the same run ------------------------------------------------------

def measure_copy_ceiling(device: str, nbytes: int = 256 << 20) -> float:
    """GB/s of the pool copy path: pinned H2D (cuda) or a large memcpy (cpu)."""
    if device == "cuda":
        src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).fill_(7)
        dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(src, non_blocking=True)
            b.record()
            b.synchronize()
            best = min(best, a.elapsed_time(b) / 1e3)
        return nbytes / best / 1e9
    src = torch.full((nbytes,), 7, dtype=torch.uint8)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


def measure_pagecache_ceiling(path: str, threads: int = 8, chunk: int = 4 << 20) -> float:
    """GB/s reading ``path`` (just written, so in the page cache) with plain os.pread
    from ``threads`` threads — the read ceiling the engine is compared with."""
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        offsets = range(0, size, chunk)
        with cf.ThreadPoolExecutor(threads) as ex:
            list(ex.map(lambda o: len(os.pread(fd, chunk, o)), offsets))   # warm
            t = time.perf_counter()
            n = sum(ex.map(lambda o: len(os.pread(fd, chunk, o)), offsets))
            dt = time.perf_counter() - t
    finally:
        os.close(fd)
    return n / dt / 1e9


# -- the decode loop -------------------------------------------------------------------------

class TinyLM:
    """Residual stack of MoE layers + an LM head: enough structure for the gate to
    see confident and unsure steps, with routing supplied by the synthetic router."""

    def __init__(self, model, base, vocab: int, temperature: float, device: str, seed: int):
        g = torch.Generator().manual_seed(seed + 17)
        self.model, self.base, self.device = model, base, device
        self.head = (torch.randn(model.H, vocab, generator=g) * temperature
                     / model.H ** 0.5).to(device)
        self.w13 = model.w13            # full precision (CPU), for the reference output
        self.w2 = model.w2

    @staticmethod
    def _norm(x):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)

    def forward(self, x, weights, ids, store):
        """Quantised forward through ``store`` (its slot table decides FP4 vs 2-bit)."""
        from tierstore.compute.moe import fused_moe
        for layer in range(ids.shape[0]):
            x = x + fused_moe(self._norm(x), weights[layer], ids[layer], layer, store, self.base)
        return x

    def forward_reference(self, x, weights, ids):
        from tierstore.compute.moe import dense_moe
        x = x.double().cpu()
        for layer in range(ids.shape[0]):
            x = x + dense_moe(self._norm(x), weights[layer].cpu(), ids[layer].cpu(),
                              self.w13[layer], self.w2[layer])
        return x

    def logits(self, x):
        return self._norm(x.float()) @ self.head


def _rel(a, b) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def run_decode(cfg: DemoConfig, lm: TinyLM, store, steps: int, progress=None, task=None,
               early: int = 0) -> RunReport:
    from tierstore.compute.gate import UncertaintyGate, run_with_gate
    from tierstore.compute.moe import StaticPool
    from tierstore.sim.synth import SyntheticRouter

    router = SyntheticRouter(cfg.n_layers, cfg.n_experts, cfg.top_k, seed=cfg.seed)
    gate = UncertaintyGate("top1", 0.60)
    empty = StaticPool(np.zeros((cfg.n_layers, cfg.n_experts, store.slot_bytes), np.uint8),
                       n_slots=1, device=lm.device)      # slot table all -1: base only
    wgen = torch.Generator().manual_seed(cfg.seed + 5)
    rep = RunReport()
    t0 = time.perf_counter()
    for step in range(steps):
        ids_np = router.step(1)                                   # [L, 1, k]
        ids = torch.from_numpy(ids_np.astype(np.int64)).to(lm.device)
        w = torch.softmax(torch.randn(cfg.n_layers, 1, cfg.top_k, generator=wgen), -1).to(lm.device)
        x0 = lm.model.tokens(1, seed=step).to(lm.device)
        for layer in range(cfg.n_layers):                         # heat: once per step,
            store.record(layer, ids[layer])                       # never per re-run
        routed = np.stack([np.repeat(np.arange(cfg.n_layers), cfg.top_k),
                           ids_np[:, 0, :].reshape(-1)], 1)
        out, rec = run_with_gate(lambda: lm.forward(x0, w, ids, store), gate, store,
                                 lambda: routed, max_rounds=3, logits_of=lm.logits)
        ref = lm.forward_reference(x0, w, ids)
        rep.err_pool.append(_rel(out, ref))
        rep.err_base.append(_rel(lm.forward(x0, w, ids, empty), ref))
        store.step()
        if early and step + 1 == early:
            rep.early_pool_hit_rate = store.stats().pool.hit_rate
        if progress is not None:
            progress.advance(task)
    rep.seconds = time.perf_counter() - t0
    rep.steps = steps
    gs = gate.stats()
    rep.fires, rep.rounds = gs.fires, gs.rounds
    rep.stats = store.stats()
    return rep


# -- the whole job ---------------------------------------------------------------------------

def run(cfg: DemoConfig, console=None) -> dict:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from tierstore import cuda_available
    from tierstore.testing.model import make_moe_model, write_model_packs
    from tierstore.compute.moe import BaseWeights
    from tierstore.format.pack import Pack
    from tierstore.store.expert_store import ExpertStore

    console = console or Console(stderr=True)
    device = ("cuda" if cuda_available() else "cpu") if cfg.device == "auto" else cfg.device
    out_dir = cfg.out or tempfile.mkdtemp(prefix="tierstore-demo-")
    os.makedirs(out_dir, exist_ok=True)
    n_keys = cfg.n_layers * cfg.n_experts
    result: dict = {"device": device, "out": out_dir, "config": cfg.__dict__.copy()}

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=False) as progress:
        t = progress.add_task("generate + quantise model", total=1)
        model = make_moe_model(cfg.n_layers, cfg.n_experts, cfg.hidden, cfg.inter, seed=cfg.seed)
        fp4_path, base_path = write_model_packs(model, out_dir)
        progress.advance(t)

        t = progress.add_task("measure ceilings", total=2)
        copy_gbps = measure_copy_ceiling(device)
        progress.advance(t)
        read_gbps = measure_pagecache_ceiling(fp4_path)
        progress.advance(t)
        result["ceilings"] = {"pool_copy_gbps": copy_gbps, "pagecache_read_gbps": read_gbps}

        pack = Pack.open(fp4_path)
        base = BaseWeights.from_pack(Pack.open(base_path), device=device)
        lm = TinyLM(model, base, cfg.vocab, cfg.temperature, device, cfg.seed)
        slots = max(8, int(cfg.pool_fraction * n_keys))
        ram_gb = cfg.ram_fraction * n_keys * pack.stride / 2**30
        store_args = dict(vram_slots=slots, ram_gb=ram_gb, policy="heat", device=device,
                          top_k=None)
        poolmon = os.path.join(out_dir, "poolmon.json")

        t = progress.add_task(f"decode, cold start ({device} pool, {slots} slots)", total=cfg.steps)
        with ExpertStore(pack, **store_args) as store:
            cold = run_decode(cfg, lm, store, cfg.steps, progress, t, early=cfg.warm_steps)
            store.save_poolmon(poolmon)

        t = progress.add_task("decode, warm restart from poolmon", total=cfg.warm_steps)
        with ExpertStore(pack, warm_start=poolmon, **store_args) as store:
            warm = run_decode(cfg, lm, store, cfg.warm_steps, progress, t, early=cfg.warm_steps)
        pack.close()

    result["cold"], result["warm"] = _summarise(cold), _summarise(warm)
    result["poolmon"] = poolmon
    result["row_bytes"] = int(pack.slot_bytes)
    return result


def _summarise(rep: RunReport) -> dict:
    s = rep.stats
    return {
        "steps": rep.steps, "fires": rep.fires, "fire_rounds": rep.rounds,
        "pool_hit_rate": s.pool.hit_rate, "pool_distinct_hit_rate": s.pool.distinct_hit_rate,
        "arena_hit_rate": s.arena.hit_rate, "early_pool_hit_rate": rep.early_pool_hit_rate,
        "fire_p50_ms": s.fire_p50_ms, "fire_p99_ms": s.fire_p99_ms,
        "promote_gbps": s.promote_gbps, "promotions": s.pool.promotions,
        "evictions": s.pool.evictions, "bytes_read": s.bytes_read,
        "err_base": float(np.mean(rep.err_base)), "err_pool": float(np.mean(rep.err_pool)),
        "seconds": rep.seconds,
    }


def print_summary(result: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    c, w, ceil = result["cold"], result["warm"], result["ceilings"]
    copy_ceiling = ceil["pool_copy_gbps"]
    tab = Table(title=f"tierstore demo — {result['device']} pool", show_lines=False)
    tab.add_column("metric")
    tab.add_column("cold start", justify="right")
    tab.add_column("warm restart", justify="right")
    pct = lambda v: f"{100 * v:.1f}%"   # noqa: E731
    rows = [
        ("decode steps", str(c["steps"]), str(w["steps"])),
        ("gate fires (re-run rounds)", f"{c['fires']} ({c['fire_rounds']})", f"{w['fires']} ({w['fire_rounds']})"),
        (f"pool hit rate, first {w['steps']} steps", pct(c["early_pool_hit_rate"]), pct(w["early_pool_hit_rate"])),
        ("pool hit rate, whole run (token / distinct)",
         f"{pct(c['pool_hit_rate'])} / {pct(c['pool_distinct_hit_rate'])}",
         f"{pct(w['pool_hit_rate'])} / {pct(w['pool_distinct_hit_rate'])}"),
        ("arena hit rate (pool misses)", pct(c["arena_hit_rate"]), pct(w["arena_hit_rate"])),
        ("fire latency p50 / p99 (ms)", f"{c['fire_p50_ms']:.2f} / {c['fire_p99_ms']:.2f}",
         f"{w['fire_p50_ms']:.2f} / {w['fire_p99_ms']:.2f}"),
        ("promote GB/s (x pool-copy ceiling)",
         f"{c['promote_gbps']:.2f} ({c['promote_gbps'] / copy_ceiling:.2f}x)",
         f"{w['promote_gbps']:.2f} ({w['promote_gbps'] / copy_ceiling:.2f}x)"),
        ("output rel. error, 2-bit base only", f"{c['err_base']:.4f}", f"{w['err_base']:.4f}"),
        ("output rel. error, with the FP4 pool", f"{c['err_pool']:.4f}", f"{w['err_pool']:.4f}"),
    ]
    for r in rows:
        tab.add_row(*r)
    console.print(tab)
    console.print(f"ceilings measured in this run: pool copy {copy_ceiling:.1f} GB/s, "
                  f"page-cache read {ceil['pagecache_read_gbps']:.1f} GB/s (8 threads)")
    console.print(f"rows here are {result['row_bytes'] / 1024:.0f} KiB, so promote GB/s measures per-fire "
                  f"latency, not bandwidth; `tierstore bench io` measures 12 MiB rows")
    console.print(f"packs and poolmon snapshot in {result['out']}")


def main(args) -> int:
    import json
    cfg = DemoConfig(seed=args.seed, device=args.device, out=args.out)
    if args.quick:
        cfg.steps, cfg.warm_steps = 80, 30
    if args.steps:
        cfg.steps = args.steps
    result = run(cfg)
    if args.json:
        json.dump(result, sys.stdout, indent=2, default=str)
        print()
    else:
        print_summary(result)
    return 0
