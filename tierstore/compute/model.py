"""A small generated MoE model, quantised for real: the model ``tierstore demo`` serves,
also used by the examples, tests and benchmarks.

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

from tierstore.errors import ConfigError
from tierstore.format import layouts
from tierstore.format.layouts import expert_layout


@dataclass
class MoEModel:
    """Full-precision experts plus their encoded rows. Tensors are CPU float32."""

    n_layers: int
    n_experts: int
    H: int
    I: int
    seed: int
    dist: str
    w13: torch.Tensor  # [L, E, 2I, H]
    w2: torch.Tensor  # [L, E, H, I]
    router: torch.Tensor  # [L, H, E]
    fp4_rows: np.ndarray  # uint8 [L, E, row_bytes("fp4")]
    base_rows: np.ndarray  # uint8 [L, E, row_bytes("base")]

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
        a = gen.standard_t(4.0, size=shape) / np.sqrt(2.0)  # t4 has variance 2
    elif dist == "gaussian":
        a = gen.standard_normal(shape)
    else:
        raise ConfigError(f"dist {dist!r} unknown; expected 'student_t' or 'gaussian'")
    return (a / np.sqrt(fan_in)).astype(np.float32)


def make_moe_model(
    n_layers: int,
    n_experts: int,
    H: int,
    I: int,
    seed: int = 0,
    dist: str = "student_t",
    order: str = "linear",
) -> MoEModel:
    """Generate and quantise a model. H and I must be multiples of 64."""
    if min(n_layers, n_experts) < 1:
        raise ConfigError(f"n_layers={n_layers}, n_experts={n_experts}: both must be >= 1")
    layouts.row_sections("fp4", H, I)  # validates H, I
    gen = np.random.default_rng(seed)
    w13 = torch.from_numpy(_draw(gen, (n_layers, n_experts, 2 * I, H), dist, H))
    w2 = torch.from_numpy(_draw(gen, (n_layers, n_experts, H, I), dist, I))
    router = torch.from_numpy(gen.standard_normal((n_layers, H, n_experts)).astype(np.float32))
    return MoEModel(
        n_layers,
        n_experts,
        H,
        I,
        seed,
        dist,
        w13,
        w2,
        router,
        layouts.encode_experts(w13, w2, "fp4", order),
        layouts.encode_experts(w13, w2, "base"),
    )


def write_model_packs(
    model: MoEModel, out_dir: str | os.PathLike, ckpt_id: str | None = None
) -> tuple[str, str]:
    """Write the model's ``fp4`` and ``base`` packs into ``out_dir``; returns their paths."""
    from tierstore.format.writer import PackWriter

    os.makedirs(out_dir, exist_ok=True)
    ckpt = ckpt_id or (
        f"tierstore-synthetic-{model.dist}-L{model.n_layers}-E{model.n_experts}"
        f"-H{model.H}-I{model.I}-seed{model.seed}"
    )
    paths = []
    for tag, rows in (("fp4", model.fp4_rows), ("base", model.base_rows)):
        with PackWriter(
            out_dir,
            tag=tag,
            n_layers=model.n_layers,
            n_experts=model.n_experts,
            slot_bytes=rows.shape[-1],
            ckpt_id=ckpt,
            layout=expert_layout(tag, model.H, model.I),
        ) as w:
            for layer in range(model.n_layers):
                w.write_layer(layer, rows[layer])
            paths.append(w.path)
    return paths[0], paths[1]
