"""Building packs: row layouts for (tag, H, I), synthetic packs of quantised heavy-tailed
weights, and packs from a directory of safetensors expert weights (pack_safetensors).

Every build goes through PackWriter, so it is crash-safe and resumable: layers
already listed in an existing pack of the same identity are skipped.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from tierstore.errors import ConfigError
from tierstore.format import layouts
from tierstore.format.layouts import expert_layout, fit_expert_shape, opaque_layout
from tierstore.format.sidecar import RowLayout
from tierstore.format.writer import PackWriter

FORMATS = ("mxfp4", "nvfp4")
SYNTHETIC_T_DF = 4.0  # Student-t degrees of freedom: heavy tails like real experts
SYNTHETIC_STD = 0.02


def quantizer_abi(fmt: str, tag: str, order: str = "linear") -> str:
    """Names what produced the bytes; part of the pack identity (key20)."""
    codec = "base2-e8m0" if tag == "base" else "mxfp4-e8m0"
    src = "" if fmt == "mxfp4" or tag == "base" else f"-from-{fmt}"
    return f"tierstore-{codec}-b32-{order}{src}-v1"


def _heavy_tailed(rng: np.random.Generator, shape) -> np.ndarray:
    t = rng.standard_t(SYNTHETIC_T_DF, size=shape).astype(np.float32)
    return t * np.float32(SYNTHETIC_STD / math.sqrt(SYNTHETIC_T_DF / (SYNTHETIC_T_DF - 2)))


def through_nvfp4(w):
    """What an NVFP4 checkpoint of ``w`` holds, decoded: one global scale per matrix."""
    import torch

    from tierstore.format import fp4

    w = torch.as_tensor(w)
    flat = w.reshape(-1, *w.shape[-2:])
    out = torch.empty_like(flat)
    for i in range(flat.shape[0]):  # per expert matrix: each has its own f32 global
        q, s, g = fp4.quantize_nvfp4(flat[i])
        out[i] = fp4.dequantize_nvfp4(q, s, g)
    return out.reshape(w.shape)


def synthetic_layer_rows(
    layout: RowLayout, n_experts: int, seed: int, layer: int, fmt: str = "mxfp4"
) -> np.ndarray:
    """(rows uint8 [E, used], used): quantised Student-t weights, deterministic in
    (seed, layer); ``used`` <= slot_bytes (opaque rows leave a zero tail)."""
    import torch

    from tierstore.format import fp4

    rng = np.random.default_rng([seed, layer, 0x7A5])
    if layout.kind == "opaque":
        n = layout.params["blocks"]
        w = torch.from_numpy(_heavy_tailed(rng, (n_experts, n * 32)))
        if fmt == "nvfp4":
            w = through_nvfp4(w.reshape(n_experts, n, 32)).reshape(n_experts, n * 32)
        q, s = fp4.quantize_mxfp4(w)
        slot = layout.sections[-1].offset + layout.sections[-1].bytes
        return torch.cat([q, s], dim=-1).numpy(), slot
    H, I = layout.params["H"], layout.params["I"]
    w13 = _heavy_tailed(rng, (n_experts, 2 * I, H))
    w2 = _heavy_tailed(rng, (n_experts, H, I))
    if fmt == "nvfp4":
        w13, w2 = through_nvfp4(w13), through_nvfp4(w2)
    rows = layouts.encode_experts(w13, w2, layout.kind, layout.order)
    return rows, rows.shape[-1]


def build_synthetic(
    out: str,
    n_layers: int,
    n_experts: int,
    slot_bytes: int,
    *,
    tag: str = "fp4",
    fmt: str = "mxfp4",
    order: str = "linear",
    seed: int = 0,
    on_layer: Callable[[int, int], None] | None = None,
    discard_on_error: bool = False,
    check_space: bool = False,
) -> tuple[str, RowLayout]:
    """Write a pack of real quantised random weights. Returns (path, layout).
    ``discard_on_error`` / ``check_space``: as PackWriter's."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: expected one of {FORMATS}")
    if min(n_layers, n_experts, slot_bytes) <= 0:
        raise ConfigError(f"--synthetic {n_layers},{n_experts},{slot_bytes}: all must be > 0")
    shape = fit_expert_shape(tag, slot_bytes)
    layout = expert_layout(tag, *shape, order) if shape else opaque_layout(slot_bytes)
    abi = quantizer_abi(fmt, tag, layout.order)
    if layout.kind == "opaque":
        abi = abi.replace("-v1", "-opaque-v1")
    with PackWriter(
        out,
        tag=tag,
        n_layers=n_layers,
        n_experts=n_experts,
        slot_bytes=slot_bytes,
        ckpt_id=f"synthetic-t{SYNTHETIC_T_DF:g}-seed{seed}",
        quantizer_abi=abi,
        layout=layout,
        discard_on_error=discard_on_error,
        check_space=check_space,
    ) as w:
        for layer in range(n_layers):
            if not w.is_written(layer):
                data, used = synthetic_layer_rows(layout, n_experts, seed, layer, fmt)
                rows = np.zeros((n_experts, slot_bytes), np.uint8)
                rows[:, :used] = data
                w.write_layer(layer, rows)
            if on_layer:
                on_layer(layer + 1, n_layers)
        return w.path, layout
