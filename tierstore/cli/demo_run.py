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
import contextlib
import os
import sys
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
    warm_steps: int = 50  # steps compared cold vs warm after the restart
    pool_fraction: float = 0.25  # pool slots as a fraction of all experts
    ram_fraction: float = 0.5  # arena rows as a fraction of all experts
    seed: int = 0  # model, router and the learning run's routing
    warm_seed: int | None = None  # routing of the cold/warm comparison (None: seed + 1)
    device: str = "auto"
    out: str | None = None
    temperature: float = 8.0  # scales the LM head: sets how often the gate fires

    def large(self) -> None:
        """Rows of ~200 KiB (H 512, I 256; 13 KiB by default) so a fire moves MBs and
        promote GB/s means bandwidth; the default on a GPU."""
        self.n_experts, self.hidden, self.inter = 32, 512, 256


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
    hit_rate_per_step: list = field(default_factory=list)
    fire_latencies_ms: list = field(default_factory=list)


# One token per step: every op of the decode loop is a [1, H] x [H, 2I] product or smaller.
# Under this many multiply-adds torch's intra-op pool costs more than it saves (waking
# its threads, and on a busy 2-core machine spin-waiting for a preempted one: the demo
# took minutes there with the default threads, seconds with one).
_ONE_THREAD_MACS = 1 << 22


def decode_threads(cfg: DemoConfig) -> int:
    """torch intra-op threads for the decode loops of ``cfg``'s sizes."""
    return 1 if cfg.hidden * 2 * cfg.inter < _ONE_THREAD_MACS else torch.get_num_threads()


@contextlib.contextmanager
def torch_threads(n: int):
    """torch's intra-op thread count set to ``n`` inside the block and the caller's
    setting restored after (also on an error or Ctrl-C): the demo is a command that
    may be called in-process, so it leaves the process as it found it."""
    old = torch.get_num_threads()
    if n == old:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


class TimedFires:
    """The store as the gate sees it, keeping each fire's latency for the picture."""

    def __init__(self, store, latencies: list):
        self._store, self._lat = store, latencies

    def fire(self, routed, max_promote=None):
        result = self._store.fire(routed, max_promote=max_promote)
        self._lat.append(result.latency_s * 1e3)
        return result

    def release(self, result) -> None:
        self._store.release(result)


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
            list(ex.map(lambda o: len(os.pread(fd, chunk, o)), offsets))  # warm
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
        self.head = (torch.randn(model.H, vocab, generator=g) * temperature / model.H**0.5).to(device)
        self.w13 = model.w13  # full precision (CPU), for the reference output
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
            x = x + dense_moe(
                self._norm(x), weights[layer].cpu(), ids[layer].cpu(), self.w13[layer], self.w2[layer]
            )
        return x

    def logits(self, x):
        return self._norm(x.float()) @ self.head


def _rel(a, b) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def run_decode(
    cfg: DemoConfig,
    lm: TinyLM,
    store,
    steps: int,
    progress=None,
    task=None,
    early: int = 0,
    stream: int | None = None,
) -> RunReport:
    """``steps`` decode steps. ``stream`` None: the router's own routing (seed); else the
    same router sampled with ``stream`` (routing a snapshot of the first never saw).
    Lazy promotions are settled at every step boundary (wait_idle) so the run, fire
    counts included, is the same for the same seed; only timings vary."""
    from tierstore.compute.gate import UncertaintyGate, run_with_gate
    from tierstore.compute.moe import StaticPool
    from tierstore.sim.synth import SyntheticRouter

    router = SyntheticRouter(cfg.n_layers, cfg.n_experts, cfg.top_k, seed=cfg.seed, stream_seed=stream)
    tag = 0 if stream is None else 1_000_003 * (stream + 1)  # token / weight streams
    gate = UncertaintyGate("top1", 0.60)
    empty = StaticPool(
        np.zeros((cfg.n_layers, cfg.n_experts, store.slot_bytes), np.uint8), n_slots=1, device=lm.device
    )  # slot table all -1: base only
    wgen = torch.Generator().manual_seed(cfg.seed + 5 + tag)
    rep = RunReport()
    timed = TimedFires(store, rep.fire_latencies_ms)
    seen = (0, 0)
    t0 = time.perf_counter()
    for step in range(steps):
        ids_np = router.step(1)  # [L, 1, k]
        ids = torch.from_numpy(ids_np.astype(np.int64)).to(lm.device)
        w = torch.softmax(torch.randn(cfg.n_layers, 1, cfg.top_k, generator=wgen), -1).to(lm.device)
        x0 = lm.model.tokens(1, seed=step + tag).to(lm.device)
        for layer in range(cfg.n_layers):  # heat: once per step,
            store.record(layer, ids[layer])  # never per re-run
        routed = np.stack([np.repeat(np.arange(cfg.n_layers), cfg.top_k), ids_np[:, 0, :].reshape(-1)], 1)
        out, rec = run_with_gate(
            lambda: lm.forward(x0, w, ids, store),
            gate,
            timed,
            lambda: routed,
            max_rounds=3,
            logits_of=lm.logits,
        )
        ref = lm.forward_reference(x0, w, ids)
        rep.err_pool.append(_rel(out, ref))
        rep.err_base.append(_rel(lm.forward(x0, w, ids, empty), ref))
        store.step()
        store.wait_idle()
        pool = store.stats().pool
        hits, lookups = pool.hits - seen[0], pool.hits + pool.misses - seen[1]
        rep.hit_rate_per_step.append(hits / lookups if lookups else 0.0)
        seen = (pool.hits, pool.hits + pool.misses)
        if early and step + 1 == early:
            rep.early_pool_hit_rate = pool.hit_rate
        if progress is not None:
            progress.advance(task)
    rep.seconds = time.perf_counter() - t0
    rep.steps = steps
    gs = gate.stats()
    rep.fires, rep.rounds = gs.fires, gs.rounds
    rep.stats = store.stats()
    return rep


# -- the whole job ---------------------------------------------------------------------------


def run(cfg: DemoConfig, out_dir: str, console=None) -> dict:
    """The whole job in ``out_dir`` (which must exist). Returns the result dict."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from tierstore import cuda_available
    from tierstore.compute.model import make_moe_model, write_model_packs
    from tierstore.compute.moe import BaseWeights
    from tierstore.format.pack import Pack
    from tierstore.store.expert_store import ExpertStore

    console = console or Console(stderr=True)
    device = ("cuda" if cuda_available() else "cpu") if cfg.device == "auto" else cfg.device
    warm_seed = cfg.seed + 1 if cfg.warm_seed is None else cfg.warm_seed
    n_keys = cfg.n_layers * cfg.n_experts
    result: dict = {"device": device, "out": out_dir, "config": cfg.__dict__.copy()}
    result["config"]["warm_seed"] = warm_seed
    torch.manual_seed(cfg.seed)  # nothing below should draw from torch's global stream

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
        disable=not console.is_terminal,
    ) as progress:

        def stage(text: str, total: int):
            if not console.is_terminal:  # a log or a pipe: plain lines
                print(f"[demo] {text}", file=sys.stderr, flush=True)
            return progress.add_task(text, total=total)

        t = stage("generate + quantise model", 1)
        model = make_moe_model(cfg.n_layers, cfg.n_experts, cfg.hidden, cfg.inter, seed=cfg.seed)
        fp4_path, base_path = write_model_packs(model, out_dir)
        progress.advance(t)

        t = stage("measure ceilings", 2)
        copy_gbps = measure_copy_ceiling(device)
        progress.advance(t)
        read_gbps = measure_pagecache_ceiling(fp4_path)
        progress.advance(t)
        result["ceilings"] = {"pool_copy_gbps": copy_gbps, "pagecache_read_gbps": read_gbps}

        with Pack.open(fp4_path) as pack, Pack.open(base_path) as base_pack:
            base = BaseWeights.from_pack(base_pack, device=device)
            lm = TinyLM(model, base, cfg.vocab, cfg.temperature, device, cfg.seed)
            slots = max(8, int(cfg.pool_fraction * n_keys))
            ram_gb = cfg.ram_fraction * n_keys * pack.stride / 2**30
            store_args = dict(vram_slots=slots, ram_gb=ram_gb, policy="heat", device=device, top_k=None)
            poolmon = os.path.join(out_dir, "poolmon.json")

            threads = decode_threads(cfg)  # the host-side ops are one token wide on a GPU too
            t = stage(f"decode, learning run (seed {cfg.seed}, {device} pool, {slots} slots)", cfg.steps)
            with torch_threads(threads), ExpertStore(pack, **store_args) as store:
                learn = run_decode(cfg, lm, store, cfg.steps, progress, t, early=cfg.warm_steps)
                store.save_poolmon(poolmon)

            t = stage(f"decode, cold start on unseen routing (stream {warm_seed})", cfg.warm_steps)
            with torch_threads(threads), ExpertStore(pack, **store_args) as store:
                cold = run_decode(
                    cfg, lm, store, cfg.warm_steps, progress, t, early=cfg.warm_steps, stream=warm_seed
                )

            t = stage("decode, warm restart from poolmon on the same routing", cfg.warm_steps)
            with torch_threads(threads), ExpertStore(pack, warm_start=poolmon, **store_args) as store:
                warm = run_decode(
                    cfg, lm, store, cfg.warm_steps, progress, t, early=cfg.warm_steps, stream=warm_seed
                )
            result["torch_threads"] = {"decode": threads, "default": torch.get_num_threads()}
            result["row_bytes"] = int(pack.slot_bytes)

    result["learn"], result["cold"], result["warm"] = (_summarise(learn), _summarise(cold), _summarise(warm))
    result["poolmon"] = poolmon
    return result


def _summarise(rep: RunReport) -> dict:
    s = rep.stats
    return {
        "steps": rep.steps,
        "fires": rep.fires,
        "fire_rounds": rep.rounds,
        "store_fires": len(rep.fire_latencies_ms),  # store.fire calls: the picture's count
        "pool_hit_rate": s.pool.hit_rate,
        "pool_distinct_hit_rate": s.pool.distinct_hit_rate,
        "arena_hit_rate": s.arena.hit_rate,
        "early_pool_hit_rate": rep.early_pool_hit_rate,
        "fire_p50_ms": s.fire_p50_ms,
        "fire_p99_ms": s.fire_p99_ms,
        "promote_gbps": s.promote_gbps,
        "promotions": s.pool.promotions,
        "evictions": s.pool.evictions,
        "bytes_read": s.bytes_read,
        "err_base": float(np.mean(rep.err_base)),
        "err_pool": float(np.mean(rep.err_pool)),
        "seconds": rep.seconds,
        "hit_rate_per_step": [round(v, 6) for v in rep.hit_rate_per_step],
        "fire_latencies_ms": [round(v, 4) for v in rep.fire_latencies_ms],
    }


def print_summary(result: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    runs = (result["learn"], result["cold"], result["warm"])
    ceil = result["ceilings"]
    copy_ceiling = ceil["pool_copy_gbps"]
    cfg = result["config"]
    tab = Table(title=f"tierstore demo: {result['device']} pool, seed {cfg['seed']}")
    tab.add_column("metric")
    tab.add_column(f"learning run\n(routing {cfg['seed']})", justify="right")
    tab.add_column(f"cold start\n(unseen routing {cfg['warm_seed']})", justify="right")
    tab.add_column("warm restart\n(same unseen routing)", justify="right")
    pct = lambda v: f"{100 * v:.1f}%"  # noqa: E731
    row_kib = result["row_bytes"] / 1024
    bandwidth = result["row_bytes"] >= 128 << 10

    def gbps(r):
        if not bandwidth:
            return "latency-bound"
        return f"{r['promote_gbps']:.2f} ({r['promote_gbps'] / copy_ceiling:.2f}x)"

    rows = [
        ("decode steps", *(str(r["steps"]) for r in runs)),
        ("steps the gate fired on (store fires)", *(f"{r['fires']} ({r['store_fires']})" for r in runs)),
        (
            "pool hit rate (token / distinct)",
            *(f"{pct(r['pool_hit_rate'])} / {pct(r['pool_distinct_hit_rate'])}" for r in runs),
        ),
        ("arena hit rate (pool misses)", *(pct(r["arena_hit_rate"]) for r in runs)),
        ("fire latency p50 / p99 (ms)", *(f"{r['fire_p50_ms']:.2f} / {r['fire_p99_ms']:.2f}" for r in runs)),
        ("promote GB/s (x pool-copy ceiling)", *(gbps(r) for r in runs)),
        ("output rel. error, 2-bit base only", *(f"{r['err_base']:.4f}" for r in runs)),
        ("output rel. error, with the FP4 pool", *(f"{r['err_pool']:.4f}" for r in runs)),
    ]
    for r in rows:
        tab.add_row(*r)
    console.print(tab)
    console.print(warm_start_headline(result))
    console.print(
        f"ceilings measured in this run: pool copy {copy_ceiling:.1f} GB/s, "
        f"page-cache read {ceil['pagecache_read_gbps']:.1f} GB/s (8 threads)"
    )
    if not bandwidth:
        console.print(
            f"rows here are {row_kib:.0f} KiB: a fire moves too little for GB/s to mean "
            "bandwidth (--rows large, the GPU default, uses ~200 KiB rows; "
            "`tierstore bench io` measures 12 MiB rows)"
        )


def first_steps(run: dict) -> int:
    """How many opening steps the headline compares: a fifth of the run, at least one."""
    return max(1, len(run["hit_rate_per_step"]) // 5)


def warm_start_headline(result: dict) -> str:
    """What a warm start buys, as hit rates a user compares directly: the pool's hit rate
    over the opening steps (where a cold pool is still empty), the first step and the
    whole run, warm against cold on the same routing. Fire counts are left out on
    purpose: the gate fires on the model's confidence, which a warm pool does not set."""
    cold, warm = result["cold"], result["warm"]
    n = first_steps(cold)

    def opening(run):
        return float(np.mean(run["hit_rate_per_step"][:n])) if run["hit_rate_per_step"] else 0.0

    def first(run):
        return run["hit_rate_per_step"][0] if run["hit_rate_per_step"] else 0.0

    return (
        f"warm restart on routing the snapshot never saw: the pool served "
        f"{opening(warm):.1%} of the first {n} steps' experts against {opening(cold):.1%} "
        f"after a cold start (first step {first(warm):.1%} vs {first(cold):.1%}; all "
        f"{cold['steps']} steps {warm['pool_hit_rate']:.1%} vs {cold['pool_hit_rate']:.1%})"
    )
