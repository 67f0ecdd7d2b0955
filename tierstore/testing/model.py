"""Test kits around the generated model (``tierstore.compute.model``, re-exported here):
how much the FP4 pool buys over the 2-bit base, and random valid expert rows at any
shape for kernel checks and benchmarks."""

from __future__ import annotations

import numpy as np
import torch

from tierstore.compute.model import MoEModel, make_moe_model, write_model_packs
from tierstore.format import layouts

__all__ = ["MoEModel", "make_moe_model", "write_model_packs", "pool_benefit", "random_expert_rows"]


def pool_benefit(
    model: MoEModel,
    n_tokens: int = 64,
    top_k: int = 4,
    layers=None,
    fractions=(0.0, 0.25, 0.5, 0.75, 1.0),
    seed: int = 0,
) -> dict:
    """The point of the pool, measured: relative error ||out - ref|| / ||ref|| of the MoE
    output vs the full-precision experts, when a fraction of the routed experts is
    promoted to FP4 (0.0 = the 2-bit base alone, 1.0 = every routed expert in FP4).

    Returns {"fractions": [...], "rel_err": [...], "n_tokens", "top_k", "layers"}; the
    error is pooled over the given layers (default: all)."""
    from tierstore.compute.moe import BaseWeights, StaticPool, dense_moe, fused_moe_reference

    layers = list(range(model.n_layers)) if layers is None else list(layers)
    base = BaseWeights(model.base_rows, model.H, model.I)
    pool = StaticPool(model.fp4_rows, n_slots=model.n_layers * model.n_experts)
    x = model.tokens(n_tokens, seed)
    gen = np.random.default_rng(seed)
    routed = {}
    for layer in layers:
        w, ids = model.route(x, layer, top_k)
        ranked = np.unique(ids.numpy())  # distinct routed experts of this layer
        routed[layer] = (w, ids, gen.permutation(ranked))
    errs = []
    for frac in fractions:
        pool.clear()
        num = den = 0.0
        for layer in layers:
            w, ids, experts = routed[layer]
            chosen = experts[: int(round(frac * len(experts)))]
            if len(chosen):
                pool.promote(np.stack([np.full(len(chosen), layer), chosen], 1))
            ref = dense_moe(x, w, ids, model.w13[layer], model.w2[layer])
            got = fused_moe_reference(x, w, ids, layer, pool, base, dtype=torch.float64)
            num += float(((got - ref) ** 2).sum())
            den += float((ref**2).sum())
        errs.append(float(np.sqrt(num / den)))
    return {
        "fractions": list(fractions),
        "rel_err": errs,
        "n_tokens": n_tokens,
        "top_k": top_k,
        "layers": layers,
        "dist": model.dist,
        "shape": {"n_layers": model.n_layers, "n_experts": model.n_experts, "H": model.H, "I": model.I},
    }


def random_expert_rows(
    n: int, tag: str, H: int, I: int, seed: int = 0, device="cpu", scale_exp=(-8, -4)
) -> torch.Tensor:
    """``n`` valid rows of random codes (every nibble / 2-bit code value occurs) with e8m0
    scales 2^e, e uniform in ``scale_exp``: uint8 [n, row_bytes]. Fast at DS4 shapes
    (no quantisation), for kernel checks and benchmarks."""
    g = torch.Generator(device=device).manual_seed(seed)
    rows = torch.randint(
        0, 256, (n, layouts.row_bytes(tag, H, I)), dtype=torch.uint8, generator=g, device=device
    )
    lo, hi = scale_exp
    for s in layouts.row_sections(tag, H, I):
        if s.codec == "e8m0":
            rows[:, s.offset : s.offset + s.bytes] = torch.randint(
                127 + lo, 127 + hi + 1, (n, s.bytes), dtype=torch.uint8, generator=g, device=device
            )
    return rows
