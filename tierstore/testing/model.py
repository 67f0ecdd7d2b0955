"""A small generated MoE model, quantised for real, for tests, the demo and benchmarks.

Weights are drawn from a heavy-tailed distribution (Student-t, 4 degrees of freedom by
default), which is what makes 2-bit alone visibly worse than FP4: a block's outliers
set its scale and crush the bulk to the {-4,-1,+1,+4} levels. Each expert is a
DeepSeek-style SiLU-gated MLP (``w13 [2I, H]`` = gate then up rows, ``w2 [H, I]``); a
router ``[n_layers, H, E]`` gives top-k routing for generated tokens.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from tierstore.format import layouts
from tierstore.format.layouts import expert_layout
from tierstore.errors import ConfigError


@dataclass
class MoEModel:
    """Full-precision experts plus their encoded rows. Tensors are CPU float32."""
    n_layers: int
    n_experts: int
    H: int
    I: int
    seed: int
    dist: str
    w13: torch.Tensor          # [L, E, 2I, H]
    w2: torch.Tensor           # [L, E, H, I]
    router: torch.Tensor       # [L, H, E]
    fp4_rows: np.ndarray       # uint8 [L, E, row_bytes("fp4")]
    base_rows: np.ndarray      # uint8 [L, E, row_bytes("base")]

    @property
    def fp4_bytes(self) -> int:
        return self.fp4_rows.shape[-1]

    @property
    def base_bytes(self) -> int:
        return self.base_rows.shape[-1]

    def route(self, x: torch.Tensor, layer: int, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Softmax-top-k routing: (topk_weights float32 [T, k] renormalised, topk_ids int64)."""
        logits = x.float() @ self.router[layer].to(x.device)
        w, ids = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)
        return w / w.sum(-1, keepdim=True), ids

    def tokens(self, n: int, seed: int = 0) -> torch.Tensor:
        """Random activations [n, H] float32 (unit RMS)."""
        g = torch.Generator().manual_seed(self.seed * 7919 + seed)
        return torch.randn(n, self.H, generator=g)


def _draw(gen: np.random.Generator, shape, dist: str, fan_in: int) -> np.ndarray:
    if dist == "student_t":
        a = gen.standard_t(4.0, size=shape) / np.sqrt(2.0)   # t4 has variance 2
    elif dist == "gaussian":
        a = gen.standard_normal(shape)
    else:
        raise ConfigError(f"dist {dist!r} unknown; expected 'student_t' or 'gaussian'")
    return (a / np.sqrt(fan_in)).astype(np.float32)


def make_moe_model(n_layers: int, n_experts: int, H: int, I: int, seed: int = 0,
                   dist: str = "student_t", order: str = "linear") -> MoEModel:
    """Generate and quantise a model. H and I must be multiples of 64."""
    if min(n_layers, n_experts) < 1:
        raise ConfigError(f"n_layers={n_layers}, n_experts={n_experts}: both must be >= 1")
    layouts.row_sections("fp4", H, I)          # validates H, I
    gen = np.random.default_rng(seed)
    w13 = torch.from_numpy(_draw(gen, (n_layers, n_experts, 2 * I, H), dist, H))
    w2 = torch.from_numpy(_draw(gen, (n_layers, n_experts, H, I), dist, I))
    router = torch.from_numpy(gen.standard_normal((n_layers, H, n_experts)).astype(np.float32))
    return MoEModel(n_layers, n_experts, H, I, seed, dist, w13, w2, router,
                    layouts.encode_experts(w13, w2, "fp4", order),
                    layouts.encode_experts(w13, w2, "base"))


def write_model_packs(model: MoEModel, out_dir: str | os.PathLike,
                      ckpt_id: str | None = None) -> tuple[str, str]:
    """Write the model's ``fp4`` and ``base`` packs into ``out_dir``; returns their paths."""
    from tierstore.format.writer import PackWriter
    os.makedirs(out_dir, exist_ok=True)
    ckpt = ckpt_id or (f"tierstore-synthetic-{model.dist}-L{model.n_layers}-E{model.n_experts}"
                       f"-H{model.H}-I{model.I}-seed{model.seed}")
    paths = []
    for tag, rows in (("fp4", model.fp4_rows), ("base", model.base_rows)):
        with PackWriter(out_dir, tag=tag, n_layers=model.n_layers, n_experts=model.n_experts,
                        slot_bytes=rows.shape[-1], ckpt_id=ckpt,
                        layout=expert_layout(tag, model.H, model.I)) as w:
            for layer in range(model.n_layers):
                w.write_layer(layer, rows[layer])
            paths.append(w.path)
    return paths[0], paths[1]


def pool_benefit(model: MoEModel, n_tokens: int = 64, top_k: int = 4, layers=None,
                 fractions=(0.0, 0.25, 0.5, 0.75, 1.0), seed: int = 0) -> dict:
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
        ranked = np.unique(ids.numpy())            # distinct routed experts of this layer
        routed[layer] = (w, ids, gen.permutation(ranked))
    errs = []
    for frac in fractions:
        pool.clear()
        num = den = 0.0
        for layer in layers:
            w, ids, experts = routed[layer]
            chosen = experts[:int(round(frac * len(experts)))]
            if len(chosen):
                pool.promote(np.stack([np.full(len(chosen), layer), chosen], 1))
            ref = dense_moe(x, w, ids, model.w13[layer], model.w2[layer])
            got = fused_moe_reference(x, w, ids, layer, pool, base, dtype=torch.float64)
            num += float(((got - ref) ** 2).sum())
            den += float((ref ** 2).sum())
        errs.append(float(np.sqrt(num / den)))
    return {"fractions": list(fractions), "rel_err": errs, "n_tokens": n_tokens,
            "top_k": top_k, "layers": layers, "dist": model.dist,
            "shape": {"n_layers": model.n_layers, "n_experts": model.n_experts,
                      "H": model.H, "I": model.I}}


def random_expert_rows(n: int, tag: str, H: int, I: int, seed: int = 0, device="cpu",
                       scale_exp=(-8, -4)) -> torch.Tensor:
    """``n`` valid rows of random codes (every nibble / 2-bit code value occurs) with e8m0
    scales 2^e, e uniform in ``scale_exp``: uint8 [n, row_bytes]. Fast at DS4 shapes
    (no quantisation), for kernel checks and benchmarks."""
    g = torch.Generator(device=device).manual_seed(seed)
    rows = torch.randint(0, 256, (n, layouts.row_bytes(tag, H, I)), dtype=torch.uint8,
                         generator=g, device=device)
    lo, hi = scale_exp
    for s in layouts.row_sections(tag, H, I):
        if s.codec == "e8m0":
            rows[:, s.offset:s.offset + s.bytes] = torch.randint(
                127 + lo, 127 + hi + 1, (n, s.bytes), dtype=torch.uint8, generator=g, device=device)
    return rows
