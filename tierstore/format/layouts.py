"""Expert row layouts: where each matrix of a SiLU-gated expert (w13 [2I, H], w2 [H, I])
sits inside one pack row, for the tags ``fp4`` (MXFP4), ``delta`` (nibbles only) and
``base`` (2-bit), in linear or fragment-major nibble order (bit layouts: docs/INTERNALS.md).

One place for the layout rules: the codecs (fp4.py) encode matrices, this module puts
them in rows, the builders and the model kit describe rows with ``expert_layout``, and
readers recover (H, I) with ``expert_shape_of``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from tierstore.errors import ConfigError, FormatError
from tierstore.format.fp4 import (
    TAGS,
    dequantize_base2,
    dequantize_mxfp4,
    from_fragmajor,
    quantize_base2,
    quantize_mxfp4,
    to_fragmajor,
)
from tierstore.format.sidecar import RowLayout, RowSection

OPAQUE_BLOCK_BYTES = 17  # one MXFP4 block of 32 elements: 16 nibble bytes + 1 e8m0


class Section(NamedTuple):
    name: str
    offset: int
    bytes: int
    dtype: str
    shape: tuple
    codec: str


def _matrix_sections(tag: str, H: int, I: int, order: str) -> list[tuple]:
    mats = (("w13", 2 * I, H), ("w2", H, I))
    out = []
    for name, n, k in mats:
        if tag == "base":
            out.append((f"{name}.codes", (n, k // 4), "base2"))
        else:
            q_codec = "e2m1" if order == "linear" else "e2m1.fragmajor"
            q_shape = (n, k // 2) if order == "linear" else (n // 16, k // 64, 512)
            out.append((f"{name}.q", q_shape, q_codec))
        if tag != "delta":
            out.append((f"{name}.s", (n, k // 32), "e8m0"))
    return out


def row_sections(tag: str, H: int, I: int, order: str = "linear") -> list[Section]:
    """Named sections of one expert row, contiguous from offset 0 (INTERNALS.md)."""
    if tag not in TAGS:
        raise ConfigError(f"row tag {tag!r} unknown; expected one of {TAGS}")
    if order not in ("linear", "fragmajor"):
        raise ConfigError(f"row order {order!r} unknown; expected 'linear' or 'fragmajor'")
    align = 32 if order == "linear" else 64
    if H % align or I % align or H <= 0 or I <= 0:
        raise ConfigError(
            f"expert shape H={H}, I={I}: both must be positive multiples of {align} for order={order!r}"
        )
    secs, off = [], 0
    for name, shape, codec in _matrix_sections(tag, H, I, order):
        nbytes = int(np.prod(shape))
        secs.append(Section(name, off, nbytes, "uint8", tuple(shape), codec))
        off += nbytes
    return secs


def row_bytes(tag: str, H: int, I: int) -> int:
    last = row_sections(tag, H, I)[-1]
    return last.offset + last.bytes


def _as_torch(a) -> torch.Tensor:
    return a if isinstance(a, torch.Tensor) else torch.from_numpy(np.asarray(a))


def encode_experts(w13, w2, tag: str = "fp4", order: str = "linear") -> np.ndarray:
    """w13 [..., 2I, H], w2 [..., H, I] float -> rows np.uint8 [..., row_bytes(tag, H, I)].

    Vectorised over the leading dims (e.g. [n_layers, n_experts])."""
    w13, w2 = _as_torch(w13).cpu(), _as_torch(w2).cpu()
    if w13.dim() < 2 or w2.dim() != w13.dim():
        raise ConfigError(
            f"expert shapes w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}: "
            f"expected [..., 2I, H] and [..., H, I]"
        )
    lead, H, I = w13.shape[:-2], w13.shape[-1], w13.shape[-2] // 2
    if tuple(w13.shape[-2:]) != (2 * I, H) or tuple(w2.shape) != (*lead, H, I):
        raise ConfigError(
            f"expert shapes w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}: "
            f"expected [..., 2I, H] and [..., H, I] with the same leading dims"
        )
    secs = row_sections(tag, H, I, order)
    parts = {}
    for name, w in (("w13", w13), ("w2", w2)):
        if tag == "base":
            parts[f"{name}.codes"], parts[f"{name}.s"] = quantize_base2(w)
        else:
            q, s = quantize_mxfp4(w)
            parts[f"{name}.q"] = q if order == "linear" else to_fragmajor(q)
            parts[f"{name}.s"] = s
    flat = [parts[s.name].reshape(*lead, -1) for s in secs]
    return torch.cat(flat, dim=-1).numpy().astype(np.uint8, copy=False)


def encode_expert(w13, w2, tag: str = "fp4", order: str = "linear") -> np.ndarray:
    """w13 [2I, H], w2 [H, I] float -> one row, np.uint8 [row_bytes(tag, H, I)]."""
    if _as_torch(w13).dim() != 2:
        raise ConfigError(f"encode_expert: w13 must be 2-D [2I, H], found {tuple(_as_torch(w13).shape)}")
    return encode_experts(w13, w2, tag, order)


def split_row(row, tag: str, H: int, I: int, order: str = "linear") -> dict[str, torch.Tensor]:
    """Views of the sections of one row [bytes] or many rows [..., bytes] (torch uint8,
    shaped [..., *section.shape]), on the rows' device. Extra trailing bytes (a pool
    slot larger than the row) are ignored."""
    r = _as_torch(row)
    if r.dim() == 0:
        r = r.reshape(1)
    secs = row_sections(tag, H, I, order)
    need = secs[-1].offset + secs[-1].bytes
    if r.shape[-1] < need or r.dtype != torch.uint8:
        raise FormatError(
            f"{tag} row for H={H}, I={I}: {r.shape[-1]} bytes of {r.dtype}, expected at least {need} uint8"
        )
    lead = r.shape[:-1]
    return {s.name: r[..., s.offset : s.offset + s.bytes].reshape(*lead, *s.shape) for s in secs}


def decode_expert(
    row, tag: str, H: int, I: int, order: str = "linear", scales: tuple | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row(s) [..., bytes] -> (w13 [..., 2I, H], w2 [..., H, I]) float32. ``delta`` rows
    need ``scales=(w13_s, w2_s)`` since their scales live elsewhere."""
    p = split_row(row, tag, H, I, order)
    if tag == "delta":
        if scales is None:
            raise ConfigError("decode_expert: a 'delta' row carries no scales; pass scales=(w13_s, w2_s)")
        p["w13.s"], p["w2.s"] = (_as_torch(x) for x in scales)
    out = []
    for name, n, k in (("w13", 2 * I, H), ("w2", H, I)):
        if tag == "base":
            out.append(dequantize_base2(p[f"{name}.codes"], p[f"{name}.s"]))
        else:
            q = p[f"{name}.q"]
            q = q if order == "linear" else from_fragmajor(q, n, k)
            out.append(dequantize_mxfp4(q, p[f"{name}.s"]))
    return out[0], out[1]


decode_experts = decode_expert  # same function; the plural reads better for batches


def expert_layout(tag: str, H: int, I: int, order: str = "linear") -> RowLayout:
    secs = [
        RowSection(
            name=s.name, offset=s.offset, bytes=s.bytes, dtype=s.dtype, shape=list(s.shape), codec=s.codec
        )
        for s in row_sections(tag, H, I, order)
    ]
    return RowLayout(kind=tag, sections=secs, order=order, params={"H": H, "I": I})


def opaque_layout(slot_bytes: int) -> RowLayout:
    """No (H, I) fits: the row holds ``n`` MXFP4 blocks (all nibbles, then all scales);
    the tail of ``slot_bytes - 17 n`` bytes stays zero."""
    n = slot_bytes // OPAQUE_BLOCK_BYTES
    if n == 0:
        raise ConfigError(
            f"slot_bytes {slot_bytes}: too small for one MXFP4 block ({OPAQUE_BLOCK_BYTES} bytes)"
        )
    return RowLayout(
        kind="opaque",
        order="linear",
        params={"blocks": n},
        sections=[
            RowSection(name="q", offset=0, bytes=16 * n, dtype="uint8", shape=[n, 16], codec="e2m1"),
            RowSection(name="s", offset=16 * n, bytes=n, dtype="uint8", shape=[n, 1], codec="e8m0"),
        ],
    )


def fit_expert_shape(tag: str, slot_bytes: int) -> tuple[int, int] | None:
    """(H, I) whose ``tag`` row is exactly ``slot_bytes``, or None. Rule (FORMAT.md):
    H and I multiples of 64; row bytes = c_tag * H * I (fp4 51/32, delta 3/2, base 27/32);
    among all factorisations pick H/I closest to 2 (DeepSeek's ratio), then larger H."""
    if tag not in TAGS:
        return None
    per_4096 = row_bytes(tag, 64, 64)  # bytes of a 64x64 (H x I) expert
    if (slot_bytes * 4096) % per_4096:
        return None
    units = slot_bytes * 4096 // per_4096 // 4096  # H*I / 4096 = (H/64) * (I/64)
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
    assert row_bytes(tag, H, I) == slot_bytes
    return H, I


def expert_shape_of(pack) -> tuple[int, int]:
    """(H, I) from a pack's row layout params (packs written by ``write_model_packs``)."""
    layout = getattr(pack, "layout", None)
    if layout is None or "H" not in layout.params or "I" not in layout.params:
        raise FormatError(
            f"{pack.path}: sidecar has no row layout with H and I params; "
            f"cannot interpret its rows as experts"
        )
    return int(layout.params["H"]), int(layout.params["I"])
