"""Building packs: row layouts for (tag, H, I), synthetic packs of quantised heavy-tailed
weights, and packs from a directory of safetensors expert weights (pack_safetensors).

Every build goes through PackWriter, so it is crash-safe and resumable: layers
already listed in an existing pack of the same identity are skipped.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from tierstore.errors import ConfigError
from tierstore.format.sidecar import RowLayout, RowSection
from tierstore.format.writer import PackWriter

FORMATS = ("mxfp4", "nvfp4")
OPAQUE_BLOCK_BYTES = 17           # one MXFP4 block of 32 elements: 16 nibble bytes + 1 e8m0
SYNTHETIC_T_DF = 4.0              # Student-t degrees of freedom: heavy tails like real experts
SYNTHETIC_STD = 0.02


def quantizer_abi(fmt: str, tag: str, order: str = "linear") -> str:
    """Names what produced the bytes; part of the pack identity (key20)."""
    codec = "base2-e8m0" if tag == "base" else "mxfp4-e8m0"
    src = "" if fmt == "mxfp4" or tag == "base" else f"-from-{fmt}"
    return f"tierstore-{codec}-b32-{order}{src}-v1"


def fit_expert_shape(tag: str, slot_bytes: int) -> tuple[int, int] | None:
    """(H, I) whose ``tag`` row is exactly ``slot_bytes``, or None. Rule (FORMAT.md):
    H and I multiples of 64; row bytes = c_tag * H * I (fp4 51/32, delta 3/2, base 27/32);
    among all factorisations pick H/I closest to 2 (DeepSeek's ratio), then larger H."""
    from tierstore.format import fp4
    if tag not in fp4.TAGS:
        return None
    per_4096 = fp4.row_bytes(tag, 64, 64)           # bytes of a 64x64 (H x I) expert
    if (slot_bytes * 4096) % per_4096:
        return None
    units = slot_bytes * 4096 // per_4096 // 4096    # H*I / 4096 = (H/64) * (I/64)
    if units * per_4096 != slot_bytes:
        return None
    best = None
    for h in range(1, math.isqrt(units) + 1):
        if units % h:
            continue
        for hu, iu in ((h, units // h), (units // h, h)):
            score = (abs(math.log2(hu / iu) - 1.0), -hu)
            if best is None or score < best[0]:
                best = (score, (64 * hu, 64 * iu))
    H, I = best[1]
    assert fp4.row_bytes(tag, H, I) == slot_bytes
    return H, I


def expert_layout(tag: str, H: int, I: int, order: str = "linear") -> RowLayout:
    from tierstore.format import fp4
    secs = [RowSection(name=s.name, offset=s.offset, bytes=s.bytes, dtype=s.dtype,
                       shape=list(s.shape), codec=s.codec)
            for s in fp4.row_sections(tag, H, I, order)]
    return RowLayout(kind=tag, sections=secs, order=order, params={"H": H, "I": I})


def opaque_layout(slot_bytes: int) -> RowLayout:
    """No (H, I) fits: the row holds ``n`` MXFP4 blocks (all nibbles, then all scales);
    the tail of ``slot_bytes - 17 n`` bytes stays zero."""
    n = slot_bytes // OPAQUE_BLOCK_BYTES
    if n == 0:
        raise ConfigError(f"slot_bytes {slot_bytes}: too small for one MXFP4 block "
                          f"({OPAQUE_BLOCK_BYTES} bytes)")
    return RowLayout(kind="opaque", order="linear", params={"blocks": n}, sections=[
        RowSection(name="q", offset=0, bytes=16 * n, dtype="uint8", shape=[n, 16], codec="e2m1"),
        RowSection(name="s", offset=16 * n, bytes=n, dtype="uint8", shape=[n, 1], codec="e8m0")])


def _heavy_tailed(rng: np.random.Generator, shape) -> np.ndarray:
    t = rng.standard_t(SYNTHETIC_T_DF, size=shape).astype(np.float32)
    return t * np.float32(SYNTHETIC_STD / math.sqrt(SYNTHETIC_T_DF / (SYNTHETIC_T_DF - 2)))


def _through_nvfp4(w):
    """What an NVFP4 checkpoint of ``w`` holds, decoded: one global scale per matrix."""
    import torch
    from tierstore.format import fp4
    w = torch.as_tensor(w)
    flat = w.reshape(-1, *w.shape[-2:])
    out = torch.empty_like(flat)
    for i in range(flat.shape[0]):     # per expert matrix: each has its own f32 global
        q, s, g = fp4.quantize_nvfp4(flat[i])
        out[i] = fp4.dequantize_nvfp4(q, s, g)
    return out.reshape(w.shape)


def synthetic_layer_rows(layout: RowLayout, n_experts: int, seed: int, layer: int,
                         fmt: str = "mxfp4") -> np.ndarray:
    """(rows uint8 [E, used], used): quantised Student-t weights, deterministic in
    (seed, layer); ``used`` <= slot_bytes (opaque rows leave a zero tail)."""
    import torch
    from tierstore.format import fp4
    rng = np.random.default_rng([seed, layer, 0x7A5])
    if layout.kind == "opaque":
        n = layout.params["blocks"]
        w = torch.from_numpy(_heavy_tailed(rng, (n_experts, n * 32)))
        if fmt == "nvfp4":
            w = _through_nvfp4(w.reshape(n_experts, n, 32)).reshape(n_experts, n * 32)
        q, s = fp4.quantize_mxfp4(w)
        slot = layout.sections[-1].offset + layout.sections[-1].bytes
        return torch.cat([q, s], dim=-1).numpy(), slot
    H, I = layout.params["H"], layout.params["I"]
    w13 = _heavy_tailed(rng, (n_experts, 2 * I, H))
    w2 = _heavy_tailed(rng, (n_experts, H, I))
    if fmt == "nvfp4":
        w13, w2 = _through_nvfp4(w13), _through_nvfp4(w2)
    rows = fp4.encode_experts(w13, w2, layout.kind, layout.order)
    return rows, rows.shape[-1]


def build_synthetic(out: str, n_layers: int, n_experts: int, slot_bytes: int, *,
                    tag: str = "fp4", fmt: str = "mxfp4", order: str = "linear", seed: int = 0,
                    on_layer: Callable[[int, int], None] | None = None) -> tuple[str, RowLayout]:
    """Write a pack of real quantised random weights. Returns (path, layout)."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: expected one of {FORMATS}")
    if min(n_layers, n_experts, slot_bytes) <= 0:
        raise ConfigError(f"--synthetic {n_layers},{n_experts},{slot_bytes}: all must be > 0")
    shape = fit_expert_shape(tag, slot_bytes)
    layout = expert_layout(tag, *shape, order) if shape else opaque_layout(slot_bytes)
    abi = quantizer_abi(fmt, tag, layout.order)
    if layout.kind == "opaque":
        abi = abi.replace("-v1", "-opaque-v1")
    with PackWriter(out, tag=tag, n_layers=n_layers, n_experts=n_experts, slot_bytes=slot_bytes,
                    ckpt_id=f"synthetic-t{SYNTHETIC_T_DF:g}-seed{seed}", quantizer_abi=abi,
                    layout=layout) as w:
        for layer in range(n_layers):
            if not w.is_written(layer):
                data, used = synthetic_layer_rows(layout, n_experts, seed, layer, fmt)
                rows = np.zeros((n_experts, slot_bytes), np.uint8)
                rows[:, :used] = data
                w.write_layer(layer, rows)
            if on_layer:
                on_layer(layer + 1, n_layers)
        return w.path, layout
