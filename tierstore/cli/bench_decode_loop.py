"""The decode loops behind ``tierstore bench decode``: the bench pack, the routing replayed,
and one decode step per mode.

A step is, for each MoE layer: the attention stand-in (a GPU spin of ``attn_us``), the
routed experts made resident, the slot-aware MoE kernel (``tierstore.compute.fused_moe``);
then the gate's device op (``UncertaintyGate.fire_mask`` over a [T, 4096] logit block). A
step the replayed gate fires is run again (the re-run of a fired step).

Modes (the same routing, the same pool of ``slots`` slots, the same CLOCK rule):
- ``all_resident``: every expert in the pool before the run; attention + MoE only.
- ``device``: ``DeviceResidency.page_in`` (decide on the GPU, page-in by SM gather from the
  pinned arena over UVA, publish on the device); the whole step is one CUDA graph.
- ``host_planned``: per layer the routed ids are read to the host (a sync), the same
  decide runs on a host mirror, the planned rows are copied by the copy engine and the
  slot table uploaded, then the layer's MoE graph runs.
- ``device_hits_first``: ``device`` with a layer's resident experts computed while its
  misses load (on a side stream), then the misses.
- ``uva_static``: decide on the GPU over a static hot set (the trace's hottest keys,
  locked in the pool) and a scratch of the most ids one layer routes: every other expert
  is streamed from pinned host memory by the SMs each time it is routed.
On ``device="cpu"`` the same steps run eagerly (no attention stand-in, the torch MoE
reference), and ``host_planned`` is the host decide on a mirror with memcpy page-ins.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

ROW_MIX_BYTES = 64 << 20  # the random block each row's nibbles are cut from


# -- the pack --------------------------------------------------------------------------------
def create_decode_pack(out_dir: str, n_layers: int, n_experts: int, H: int, I: int) -> str:
    """An fp4 pack of ``n_layers`` x ``n_experts`` experts of shape (H, I) in ``out_dir``
    (written once, reused): nibbles cut from one random block at a different offset per
    row (rows differ; writing runs at disk speed), every e8m0 scale in 119..122 so the
    MoE's outputs stay finite. Returns the pack's path."""
    from tierstore.format import layouts
    from tierstore.format.writer import PackWriter

    layout = layouts.expert_layout("fp4", H, I)
    row = layouts.row_bytes("fp4", H, I)
    rng = np.random.default_rng(0)
    block = rng.integers(0, 256, size=max(ROW_MIX_BYTES, 2 * row), dtype=np.uint8)
    scales = [s for s in layout.sections if s.codec == "e8m0"]
    rows = np.empty((n_experts, row), dtype=np.uint8)
    with PackWriter(
        out_dir,
        tag="fp4",
        n_layers=n_layers,
        n_experts=n_experts,
        slot_bytes=row,
        ckpt_id=f"bench-decode-{n_layers}x{n_experts}-H{H}-I{I}",
        quantizer_abi="tierstore-bench-v1",
        layout=layout,
    ) as w:
        for layer in range(n_layers):
            if w.is_written(layer):
                continue
            for e in range(n_experts):
                k = layer * n_experts + e
                start = (k * 4099 * 16) % (len(block) - row)
                rows[e] = block[start : start + row]
                for s in scales:
                    rows[e, s.offset : s.offset + s.bytes] = 119 + (k + np.arange(s.bytes)) % 4
            w.write_layer(layer, rows)
        return w.path


# -- routing -----------------------------------------------------------------------------------
def synthetic_routing(n_steps: int, L: int, E: int, k: int, T: int, seed: int) -> np.ndarray:
    """int32 [n_steps, L, T, k] from the synthetic router (tierstore.sim.synth)."""
    from tierstore.sim.synth import SyntheticRouter

    router = SyntheticRouter(L, E, k, seed)
    return np.stack([router.step(T) for _ in range(n_steps)]).astype(np.int32)


def cyclic_routing(n_steps: int, L: int, E: int, k: int, T: int) -> np.ndarray:
    """Every step routes the next T x k experts of each layer, round the layer: with a
    pool under the whole model every expert misses (CLOCK's, and LRU's, worst case)."""
    t = np.arange(n_steps)[:, None, None, None]
    pos = (t * T + np.arange(T)[None, None, :, None]) * k + np.arange(k)[None, None, None, :]
    return np.broadcast_to(pos % E, (n_steps, L, T, k)).astype(np.int32).copy()


def trace_routing(trace, n_steps: int, T: int, k: int) -> tuple[np.ndarray, int]:
    """The first ``n_steps`` ticks of a capture-format trace whose layers each route at
    most T x k ids (decode ticks of a batch up to T; prefill ticks are skipped), as int32
    [n_steps, L, T, k] padded with -1. Returns (routing, ticks skipped). FormatError when
    the trace has too few such ticks."""
    from tierstore.errors import FormatError

    L, P = trace.n_layers, T * k
    out = np.full((n_steps, L, P), -1, dtype=np.int32)
    starts, layers, experts = trace.tick_starts, trace.layers, trace.experts
    n, skipped = 0, 0
    for i in range(len(starts) - 1):
        if n == n_steps:
            break
        a, b = int(starts[i]), int(starts[i + 1])
        lay = np.asarray(layers[a:b])
        counts = np.bincount(lay, minlength=L)
        if counts.max(initial=0) > P:
            skipped += 1
            continue
        order = np.argsort(lay, kind="stable")
        lay, exp = lay[order], np.asarray(experts[a:b])[order]
        pos = np.arange(len(lay)) - np.concatenate(([0], np.cumsum(counts)))[lay]
        out[n, lay, pos] = exp
        n += 1
    if n < n_steps:
        raise FormatError(
            f"{trace.name}: {n} decode ticks with at most {P} ids per layer "
            f"(batch {T} x top-{k}), the run needs {n_steps} (--steps + --warmup); "
            f"{skipped} larger ticks skipped"
        )
    return out.reshape(n_steps, L, T, k), skipped


def distinct_per_decide(routing: np.ndarray, E: int) -> np.ndarray:
    """int [n_steps, L]: distinct valid ids each decide sees (hits + misses of a decide)."""
    s, L = routing.shape[:2]
    flat = routing.reshape(s * L, -1).astype(np.int64)
    out = np.zeros(s * L, dtype=np.int64)
    for i, row in enumerate(flat):
        out[i] = len(np.unique(row[(row >= 0) & (row < E)]))
    return out.reshape(s, L)


def routed_keys(routing: np.ndarray, E: int) -> np.ndarray:
    """The distinct dense keys the routing routes, sorted."""
    s, L = routing.shape[:2]
    ids = routing.reshape(s, L, -1).astype(np.int64)
    keys = (np.arange(L)[None, :, None] * E + ids)[(ids >= 0) & (ids < E)]
    return np.unique(keys)


def hottest_keys(routing: np.ndarray, E: int, n: int) -> np.ndarray:
    """The ``n`` most routed dense keys of the routing (ties: lower key first)."""
    s, L = routing.shape[:2]
    keys = (np.arange(L)[None, :, None] * E + routing.reshape(s, L, -1)).reshape(-1)
    valid = routing.reshape(-1)
    keys = keys[(valid >= 0) & (valid < E)]
    counts = np.bincount(keys, minlength=L * E)
    order = np.lexsort((np.arange(L * E), -counts))
    return order[:n]


# -- one decoder ---------------------------------------------------------------------------------
class Decoder:
    """The model's stand-ins on one store: inputs, the MoE call, attention, gate."""

    def __init__(
        self, torch, store, H: int, I: int, T: int, k: int, attn_us: float, routing: np.ndarray, seed: int = 0
    ):
        from tierstore.compute import BaseWeights, UncertaintyGate

        self.torch, self.store = torch, store
        self.cuda = store.pool.is_cuda
        dev = store.pool.device
        self.dev, self.L, self.E = dev, store._L, store._E
        self.H, self.I, self.T, self.k = H, I, T, k
        g = torch.Generator(device="cpu").manual_seed(seed)
        dtype = torch.bfloat16 if self.cuda else torch.float32
        self.x = torch.randn(T, H, generator=g).to(dev, dtype)
        self.out = torch.empty(T, H, dtype=dtype, device=dev)
        w = torch.rand(self.L, T, k, generator=g)
        self.w = (w / w.sum(-1, keepdim=True)).to(dev)
        from tierstore.format import layouts

        base_bytes = layouts.row_bytes("base", H, I)
        # Never read while every routed expert is resident; an unplaced miss reads zeros.
        self.base = BaseWeights(
            torch.zeros(self.L, self.E, base_bytes, dtype=torch.uint8, device=dev), H, I, dev
        )
        self.gate = UncertaintyGate("top1")
        self.logits = torch.randn(T, 4096, generator=g).to(dev)
        self.routing_dev = torch.from_numpy(routing).to(dev)  # [steps, L, T, k]
        self.ids = torch.zeros_like(self.routing_dev[0])  # the step's routing
        self.cycles = 0
        if self.cuda and attn_us > 0:
            from tierstore.cli.bench_fire_extra import _sleep_cycles_per_ms

            self.cycles = int(_sleep_cycles_per_ms(torch) * attn_us / 1000.0)
        if self.cuda:  # module loads outside any capture
            self.moe(0)
            torch.cuda.synchronize()

    def load_step(self, t: int) -> None:
        self.ids.copy_(self.routing_dev[t])  # stream-ordered, no host sync

    def attn(self) -> None:
        if self.cycles:
            self.torch.cuda._sleep(self.cycles)

    def moe(self, layer: int) -> None:
        from tierstore.compute import fused_moe

        fused_moe(self.x, self.w[layer], self.ids[layer], layer, self.store, self.base, out=self.out)

    def gate_op(self) -> None:
        self.gate.fire_mask(self.logits)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()


def capture(torch, body):
    """``body`` as a CUDA graph (captured on a side stream; replayed on the current one)."""
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.cuda.graph(g, stream=side):
        body()
    torch.cuda.current_stream().wait_stream(side)
    return g


# -- the modes ---------------------------------------------------------------------------------
class HostPlanned:
    """The host-planned baseline's state: the residency rule on a host mirror of the slot
    table and the CLOCK state; the page-in by the copy engine (memcpy on a CPU pool)."""

    def __init__(self, torch, store, n_slots: int, max_ids: int):
        from tierstore.store.residency import ResidencyState

        self.torch, self.store = torch, store
        arena = store._arena
        self.cuda = store.pool.is_cuda
        self.table = torch.full((store._L * store._E,), -1, dtype=torch.int32, pin_memory=self.cuda)
        self.state = ResidencyState(
            n_layers=store._L,
            n_experts=store._E,
            n_slots=n_slots,
            slot_bytes=store.slot_bytes,
            max_ids=max(max_ids, store._E),
            device="cpu",
            table=self.table,
            pool_ptr=store.pool.data_ptr(),
            arena_ptr=arena.rows.data_ptr() if arena.n_slots else 0,
            arena_rows=arena.n_slots,
            arena_stride=arena.stride,
            heat=True,
            pin=self.cuda,
        )
        with store.lock:
            self.state.arena_row.copy_(torch.from_numpy(arena.resident_slot.astype(np.int32)))
        self.max_ids = max(max_ids, store._E)
        self.ids_host = torch.empty(self.max_ids, dtype=torch.int32, pin_memory=self.cuda)

    def page_in(self, layer: int, ids_dev) -> None:
        torch = self.torch
        n = ids_dev.numel()
        host = self.ids_host[:n]
        host.copy_(ids_dev.reshape(-1))  # the per-layer sync: ids to the host
        self.state.decide_host(layer, host)  # plan on the host
        if self.cuda:
            from tierstore import _C

            stream = torch.cuda.current_stream()
            dev = self.store.pool.device
            _C.residency_copy_plan(
                self.state.view,
                self.store.pool.data_ptr(),
                dev.index if dev.index is not None else torch.cuda.current_device(),
                stream.cuda_stream,
            )
            plan_len = int(self.state.ctrl[2])
            if plan_len:  # the publish into the mirror (the copies are ordered before the upload)
                plan = self.state.plan[: 2 * plan_len].view(-1, 2)
                placed = plan[:, 1] >= 0
                self.table[plan[placed, 0].long()] = plan[placed, 1]
            self.store.slot_table.view(-1).copy_(self.table, non_blocking=True)  # upload
        else:
            plan_len = int(self.state.ctrl[2])
            if plan_len:  # the page-in into the real pool, then the table
                self.state.view.gather_host()
            self.store.slot_table.view(-1).copy_(self.table)


def run_steps(
    torch, dec: Decoder, step_fn, t0: int, n: int, fires: np.ndarray, fold=None, fold_every: int = 0
) -> tuple[float, int]:
    """Run steps t0..t0+n (re-running the fired ones); returns (seconds, re-runs)."""
    dec.sync()
    start = time.perf_counter()
    reruns = 0
    for t in range(t0, t0 + n):
        dec.load_step(t)
        step_fn()
        if fires[t]:
            step_fn()
            reruns += 1
        if fold is not None and fold_every and (t + 1) % fold_every == 0:
            fold()
    dec.sync()
    return time.perf_counter() - start, reruns


def residency_step(dec: Decoder, res) -> None:
    for layer in range(dec.L):
        dec.attn()
        res.page_in(layer, dec.ids[layer])
        dec.moe(layer)
    dec.gate_op()


class HitsFirst:
    """The ``device_hits_first`` step: a layer's decide, then its resident experts' MoE on
    the compute stream while the page-in of its misses runs on a side stream, then the
    misses' MoE; the two partial outputs are summed (bf16: one more rounding than one
    MoE over all pairs). Fork and join are events, so the whole step is still one graph."""

    def __init__(self, dec: Decoder, res):
        torch = dec.torch
        self.dec, self.res = dec, res
        self.out_m = torch.empty_like(dec.out)
        self.side = torch.cuda.Stream() if dec.cuda else None

    def step(self) -> None:
        dec, res, torch = self.dec, self.res, self.dec.torch
        from tierstore.compute import fused_moe

        for layer in range(dec.L):
            dec.attn()
            ids = dec.ids[layer]
            res.page_in(layer, ids, gather=False)  # misses planned, not yet published
            hit = dec.store.slot_table[layer][ids.long()] >= 0
            none = torch.full_like(ids, -1)
            ids_h, ids_m = torch.where(hit, ids, none), torch.where(hit, none, ids)
            if self.side is not None:
                main = torch.cuda.current_stream()
                self.side.wait_stream(main)
                with torch.cuda.stream(self.side):
                    res.gather()
                fused_moe(dec.x, dec.w[layer], ids_h, layer, dec.store, dec.base, out=dec.out)
                main.wait_stream(self.side)
            else:
                res.gather()
                fused_moe(dec.x, dec.w[layer], ids_h, layer, dec.store, dec.base, out=dec.out)
            fused_moe(dec.x, dec.w[layer], ids_m, layer, dec.store, dec.base, out=self.out_m)
            dec.out.add_(self.out_m)
        dec.gate_op()


def resident_step(dec: Decoder) -> None:
    for layer in range(dec.L):
        dec.attn()
        dec.moe(layer)
    dec.gate_op()


def host_planned_runner(torch, dec: Decoder, hp: HostPlanned):
    """One step of the host-planned baseline: per layer attention, the host's page-in,
    then the layer's MoE (a CUDA graph per layer, so the launches cost what a graph's do)."""
    if not dec.cuda:

        def step():
            for layer in range(dec.L):
                hp.page_in(layer, dec.ids[layer])
                dec.moe(layer)
            dec.gate_op()

        return step
    moe_graphs = [capture(torch, lambda layer=layer: dec.moe(layer)) for layer in range(dec.L)]

    def step():
        for layer in range(dec.L):
            dec.attn()
            hp.page_in(layer, dec.ids[layer])
            moe_graphs[layer].replay()
        dec.gate_op()

    return step


@contextlib.contextmanager
def attached(store, **kw):
    """A DeviceResidency for one run, emptied after it (so every run starts cold)."""
    res = store.device_residency(**kw)
    try:
        res.reset()
        yield res
    finally:
        try:
            res.reset()
        finally:
            res.close()


def counter_delta(after: dict, before: dict) -> dict:
    return {k: after[k] - before.get(k, 0) for k in after}
