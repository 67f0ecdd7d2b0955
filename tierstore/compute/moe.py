"""Slot-aware fused MoE: each routed (token, k) uses its expert's FP4 row from the pool
when ``store.slot_table[layer, e] >= 0``, else the expert's 2-bit base row.

    y_t = sum_k  w[t,k] * W2_e @ (silu(W13_e[:I] @ x_t) * (W13_e[I:] @ x_t)),  e = ids[t,k]

Two paths, same numbers:
* a torch reference (dequantise, then batched matmuls, tokens grouped by expert: one
  Python step per chunk of distinct experts, never per token); runs anywhere; the CPU
  path and the oracle of the tests;
* on CUDA tensors, any T: the tensor-core grouped kernels (``tierstore._C.moe_mma``,
  see ``tierstore.compute.moe_cuda``): pairs sorted by expert on the device into
  fixed-size buffers, the slot table read on the device, MXFP4 / 2-bit dequantised in
  registers into bf16 mma fragments, each routed expert read once per tile of its
  pairs; launched on torch's current stream with no host sync and no data-dependent
  shape, so a call can be captured in a CUDA graph at every T (1..512 and beyond).

Routed ids outside ``[0, E)`` (e.g. -1, vLLM's "skip") contribute nothing on both paths.
Pool rows must be ``fp4`` rows in linear nibble order (the pack's default layout).
"""

from __future__ import annotations

import numpy as np
import torch

from tierstore.compute.checks import DECODE_MAX_TOKENS, check_moe_args
from tierstore.errors import ConfigError
from tierstore.format import layouts

_CHUNK_BYTES = 256 << 20  # bound on dequantised weights held at once (reference)


class BaseWeights:
    """The 2-bit base rows of every expert: ``rows`` uint8 [n_layers, E, base_bytes]."""

    def __init__(self, rows, H: int, I: int, device="cpu"):
        rows = rows if isinstance(rows, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(rows))
        need = layouts.row_bytes("base", H, I)
        if rows.dim() != 3 or rows.dtype != torch.uint8 or rows.shape[-1] < need:
            raise ConfigError(
                f"base rows must be uint8 [n_layers, E, >= {need}] for H={H}, I={I}; "
                f"found {rows.dtype} {list(rows.shape)}"
            )
        self.rows = rows.to(device).contiguous()
        self.H, self.I = int(H), int(I)
        self.n_layers, self.n_experts = rows.shape[0], rows.shape[1]

    @classmethod
    def from_pack(cls, pack, device="cpu", H: int | None = None, I: int | None = None) -> BaseWeights:
        """Load every written row of a ``base`` pack (unwritten layers stay zero)."""
        from tierstore.format.layouts import expert_shape_of
        from tierstore.format.pack import Pack

        if not hasattr(pack, "read_row"):
            pack = Pack.open(pack)
        if H is None or I is None:
            H, I = expert_shape_of(pack)
        rows = np.zeros((pack.n_layers, pack.n_experts, pack.slot_bytes), np.uint8)
        for layer in pack.layers:
            for e in range(pack.n_experts):
                rows[layer, e] = pack.read_row(layer, e)
        return cls(rows, H, I, device)


class StaticPool:
    """A minimal pool with the store's compute-facing surface (``slot_table``, ``pool``,
    ``slot_bytes``): rows are copied in by ``promote`` and never evicted. For tests,
    the demo and benchmarks; the real one is ``tierstore.ExpertStore``."""

    def __init__(self, fp4_rows, n_slots: int, device="cpu"):
        rows = fp4_rows if isinstance(fp4_rows, torch.Tensor) else torch.from_numpy(np.asarray(fp4_rows))
        self._rows = rows
        L, E, self.slot_bytes = rows.shape
        self.n_slots = int(n_slots)
        self.pool = torch.zeros(self.n_slots, self.slot_bytes, dtype=torch.uint8, device=device)
        self.slot_table = torch.full((L, E), -1, dtype=torch.int32, device=device)
        self._used = 0

    def promote(self, keys) -> int:
        """Copy (layer, expert) rows into free slots and publish them; returns new slots."""
        keys = np.asarray(keys, dtype=np.int64).reshape(-1, 2)
        fresh = [
            k
            for k in dict.fromkeys(map(tuple, keys.tolist()))  # in order, once
            if int(self.slot_table[k[0], k[1]]) < 0
        ]
        if self._used + len(fresh) > self.n_slots:
            raise ConfigError(
                f"StaticPool: {len(fresh)} new rows do not fit ({self._used} of {self.n_slots} slots used)"
            )
        for l, e in fresh:
            self.pool[self._used].copy_(self._rows[l, e])
            self.slot_table[l, e] = self._used  # publish after the bytes are in
            self._used += 1
        return len(fresh)

    def clear(self) -> None:
        self.slot_table.fill_(-1)
        self._used = 0


# ---- reference -------------------------------------------------------------------


def _slot_aware_weights(layer: int, store, base: BaseWeights, dtype):
    H, I = base.H, base.I
    n_slots = store.pool.shape[0]

    def weights(experts: torch.Tensor):
        slots = store.slot_table[layer].to(experts.device)[experts].long()
        resident = (slots >= 0) & (slots < n_slots)
        w13 = torch.empty(len(experts), 2 * I, H, dtype=dtype, device=experts.device)
        w2 = torch.empty(len(experts), H, I, dtype=dtype, device=experts.device)
        if bool(resident.any()):
            a, b = layouts.decode_experts(store.pool[slots[resident]], "fp4", H, I)
            w13[resident], w2[resident] = a.to(dtype), b.to(dtype)
        if bool((~resident).any()):
            a, b = layouts.decode_experts(
                base.rows[layer].to(experts.device)[experts[~resident]], "base", H, I
            )
            w13[~resident], w2[~resident] = a.to(dtype), b.to(dtype)
        return w13, w2

    return weights


def grouped_experts_forward(
    x, topk_weights, topk_ids, weights, n_experts: int, I: int, dtype=torch.float32
) -> torch.Tensor:
    """SiLU-gated experts, tokens grouped by expert. ``weights(expert_ids [U])`` returns
    (w13 [U, 2I, H], w2 [U, H, I]). Returns float ``dtype`` [T, H]."""
    T, k = topk_ids.shape
    H = x.shape[1]
    dev = x.device
    ids = topk_ids.reshape(-1).long().to(dev)
    gate = topk_weights.reshape(-1).to(dev, dtype)
    tok = torch.arange(T, device=dev).repeat_interleave(k)
    valid = (ids >= 0) & (ids < n_experts)
    ids, gate, tok = ids[valid], gate[valid], tok[valid]
    out = torch.zeros(T, H, dtype=dtype, device=dev)
    if ids.numel() == 0:
        return out
    experts, inv, counts = torch.unique(ids, return_inverse=True, return_counts=True)
    order = torch.argsort(inv, stable=True)
    inv, gate, tok = inv[order], gate[order], tok[order]
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(len(inv), device=dev) - starts[inv]
    xs = x.to(dtype)
    per_expert = 3 * H * I * torch.empty((), dtype=dtype).element_size()
    chunk = max(1, _CHUNK_BYTES // per_expert)
    counts_h = counts.tolist()
    first_pair = 0
    for a in range(0, len(experts), chunk):  # one step per chunk of experts
        b = min(a + chunk, len(experts))
        n_pairs = sum(counts_h[a:b])
        sl = slice(first_pair, first_pair + n_pairs)
        first_pair += n_pairs
        w13, w2 = weights(experts[a:b])
        grp, p = inv[sl] - a, pos[sl]
        xin = torch.zeros(b - a, max(counts_h[a:b]), H, dtype=dtype, device=dev)
        xin[grp, p] = xs[tok[sl]]
        g = torch.bmm(xin, w13.transpose(1, 2))
        h = torch.nn.functional.silu(g[..., :I]) * g[..., I:]
        y = torch.bmm(h, w2.transpose(1, 2))
        out.index_add_(0, tok[sl], y[grp, p] * gate[sl, None])
    return out


def fused_moe_reference(
    x, topk_weights, topk_ids, layer: int, store, base: BaseWeights, dtype=torch.float32
) -> torch.Tensor:
    """The torch reference: output [T, H] in ``dtype`` (use float64 for test oracles)."""
    check_moe_args(x, topk_weights, topk_ids, layer, store, base)
    return grouped_experts_forward(
        x,
        topk_weights,
        topk_ids,
        _slot_aware_weights(layer, store, base, dtype),
        base.n_experts,
        base.I,
        dtype,
    )


def dense_moe(x, topk_weights, topk_ids, w13, w2, dtype=torch.float64) -> torch.Tensor:
    """Unquantised experts of one layer (w13 [E, 2I, H], w2 [E, H, I]) -> [T, H] ``dtype``."""

    def weights(experts):
        return w13[experts.cpu()].to(x.device, dtype), w2[experts.cpu()].to(x.device, dtype)

    return grouped_experts_forward(x, topk_weights, topk_ids, weights, w13.shape[0], w13.shape[1] // 2, dtype)


# ---- dispatch --------------------------------------------------------------------


def fused_moe(
    x, topk_weights, topk_ids, layer: int, store, base: BaseWeights, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Routed-expert MoE output [T, H] in x's dtype (written into ``out`` when given).

    CUDA tensors take the grouped tensor-core kernels, except T <= ``GEMV_MAX_TOKENS``
    (k <= 16), which takes the v2 decode GEMV; both are graph-capturable. CPU tensors
    take the torch reference. ``store`` needs ``slot_table``, ``pool`` and ``slot_bytes``."""
    if x.is_cuda and _kernel_available("moe_mma"):
        if x.shape[0] <= min(GEMV_MAX_TOKENS, DECODE_MAX_TOKENS) and topk_ids.shape[-1] <= 16:
            from tierstore.compute.moe_cuda import fused_moe_decode

            return fused_moe_decode(x, topk_weights, topk_ids, layer, store, base, out=out)
        from tierstore.compute.moe_cuda import fused_moe_mma

        return fused_moe_mma(x, topk_weights, topk_ids, layer, store, base, out=out)
    y = fused_moe_reference(x, topk_weights, topk_ids, layer, store, base).to(x.dtype)
    return y if out is None else out.copy_(y)


# Largest T served by the v2 FFMA GEMV instead of the tensor-core kernels: on the H200
# (bench/results/moe.md, 2026-12-02) the GEMV is faster at T = 1 (45 vs 50 us bf16, 47 vs
# 60 us f32: the grouped path's fixed cost of four launches) and 1.3-1.6x slower from T = 4.
GEMV_MAX_TOKENS = 1


def _kernel_available(name: str = "moe_mma") -> bool:
    try:
        from tierstore import _C
    except ImportError:
        return False
    return hasattr(_C, name) and bool(_C.built_with_cuda())
