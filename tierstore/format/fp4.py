"""FP4 and 2-bit codecs for expert weights (torch, vectorised; no Python loop per row).

Bit formats (docs/INTERNALS.md, "Bit formats"); a matrix ``W [N, K]``, K the
reduction dim, K % 32 == 0 (NVFP4: K % 16 == 0):

* e2m1 nibble: bit 3 = sign, bits 0-2 index ``E2M1_GRID = [0, .5, 1, 1.5, 2, 3, 4, 6]``.
  Linear order: byte j of a row holds element 2j in the LOW nibble, 2j+1 in the HIGH.
* MXFP4: ``q uint8 [N, K/2]`` + ``s uint8 [N, K/32]`` e8m0; value = e2m1 * 2^(s-127).
  The block exponent is the smallest e with ``amax <= 6 * 2^e`` (so nothing clips and
  every element is within half a grid step of its value at the block scale);
  elements are rounded to nearest on the e2m1 grid, ties to the even code.
  s = 255 (NaN) is never written; an all-zero block gets s = 0.
* NVFP4: ``q`` + ``s float8_e4m3fn [N, K/16]`` + one float32 global;
  value = e2m1 * e4m3 * global. ``nvfp4_to_mxfp4`` re-quantises to MXFP4.
* 2-bit base: ``codes uint8 [N, K/4]``, element 4j+t in bits 2t..2t+1 of byte j;
  code -> ``{0:-4, 1:-1, 2:+1, 3:+4}`` * 2^(s-127), e8m0 per 32 along K. There is no
  zero level, so the block exponent is picked per block by least squared error among
  four candidates (the no-clip exponent and the three below it, which trade clipping
  the block max for resolution of the bulk -- better for heavy-tailed blocks).

Fragment-major nibble order (row-layout option ``order="fragmajor"``), for the SM120
kernels. The nibble matrix ``[N, K]`` (N % 16 == 0, K % 64 == 0) is cut into blocks of
16 rows x 64 columns; blocks are stored row-block major ((N/16) x (K/64) blocks of 512
bytes). Inside a block, lane l (0..31) owns bytes ``16*l .. 16*l+15`` and holds the 32
elements i = 0..31 of the mma.m16n8k64 e2m1 A fragment, element i in byte i//2 of the
lane (low nibble when i is even). With g = l // 4 and t = l % 4:

    row(l, i) = g + 8 * ((i // 8) % 2)
    col(l, i) = 8 * t + (i % 8) + 32 * (i // 16)

i.e. lane register r = i // 8 covers (rows g / g+8) x (cols 8t..8t+7 / +32). Scales are
never permuted. ``to_fragmajor`` / ``from_fragmajor`` convert the packed q planes.

Expert rows (docs/INTERNALS.md, "Expert rows"): ``encode_expert`` / ``decode_expert`` /
``row_sections`` for the tags ``fp4``, ``delta`` and ``base``.
"""

from __future__ import annotations

import numpy as np
import torch

from tierstore.errors import ConfigError, FormatError

E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
BASE2_LEVELS = (-4.0, -1.0, 1.0, 4.0)
MX_BLOCK = 32
NV_BLOCK = 16
E4M3_MAX = 448.0
TAGS = ("fp4", "delta", "base")

# Decision boundaries between grid points k and k+1, and whether a tie goes up
# (k odd -> k+1 is the even code) or stays (k even).
_E2M1_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _grid_lut(device) -> torch.Tensor:
    mags = torch.tensor(E2M1_GRID, dtype=torch.float32, device=device)
    return torch.cat([mags, -mags])  # index = nibble


def _check_k(w: torch.Tensor, block: int, what: str) -> None:
    if w.dim() < 1 or w.shape[-1] % block != 0:
        raise ConfigError(f"{what}: last dim {tuple(w.shape)[-1:]} is not a multiple of {block}")
    if not torch.is_floating_point(w):
        raise ConfigError(f"{what}: expected a floating tensor, found {w.dtype}")
    finite = torch.isfinite(w)
    if not bool(finite.all()):
        first = int((~finite).reshape(-1).nonzero()[0])
        raise ConfigError(
            f"{what}: non-finite value at flat index {first} "
            f"({float(w.reshape(-1)[first])}); refuse to quantise"
        )


def _work(w: torch.Tensor) -> torch.Tensor:
    return w if w.dtype == torch.float64 else w.to(torch.float32)


# ---- e2m1 ------------------------------------------------------------------------


def round_to_e2m1(v: torch.Tensor) -> torch.Tensor:
    """Nibble codes (uint8) for values already at the block scale; |v| is clipped to 6.

    Round to nearest on the grid, ties to the even code."""
    mag = v.abs()
    code = torch.zeros(v.shape, dtype=torch.uint8, device=v.device)
    for k, b in enumerate(_E2M1_BOUNDS):
        code += (mag >= b) if k % 2 else (mag > b)
    sign = (v < 0) & (code != 0)  # keep zero canonical (0x0, never 0x8)
    return code | (sign.to(torch.uint8) << 3)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] uint8 codes (0..15) -> [..., K/2]; element 2j low nibble of byte j."""
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """[..., K/2] uint8 -> [..., K] codes."""
    q = q.to(torch.uint8)
    return torch.stack([q & 0xF, q >> 4], dim=-1).reshape(*q.shape[:-1], q.shape[-1] * 2)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    return _grid_lut(codes.device)[codes.long()]


# ---- MXFP4 -----------------------------------------------------------------------


def _mx_exponent(amax: torch.Tensor, top: float) -> torch.Tensor:
    """Smallest e in [-127, 127] with amax <= top * 2^e (int32); 0-blocks get -127."""
    a = amax.to(torch.float64)
    e = torch.ceil(torch.log2(torch.where(a > 0, a, 1.0) / top))
    # log2 may be off by one ulp near powers of two: fix with exact ldexp checks.
    e = torch.where(a > top * torch.ldexp(torch.ones_like(e), e), e + 1, e)
    e = torch.where(a <= top * torch.ldexp(torch.ones_like(e), e - 1), e - 1, e)
    e = torch.where(a > 0, e, torch.full_like(e, -127.0))
    return e.clamp(-127, 127).to(torch.int32)


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W [..., K] float -> (q uint8 [..., K/2], s uint8 e8m0 [..., K/32])."""
    _check_k(w, MX_BLOCK, "quantize_mxfp4")
    x = _work(w)
    blocks = x.reshape(*x.shape[:-1], -1, MX_BLOCK)
    e = _mx_exponent(blocks.abs().amax(-1), E2M1_MAX)
    scaled = torch.ldexp(blocks, (-e).to(x.dtype).unsqueeze(-1))
    codes = round_to_e2m1(scaled)
    if bool((e >= 126).any()):
        codes = _keep_float32_finite(codes, e)
    return pack_nibbles(codes.reshape(x.shape)), (e + 127).to(torch.uint8)


def _keep_float32_finite(codes: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    # Near float32's max (|x| > 2^126) rounding up can give grid * 2^e = 2^128 = inf
    # when decoded in float32; step those down one grid point (error stays <= half a
    # step of the upper neighbour, <= 1 at the block scale).
    mag = (codes & 7).long()
    grid = torch.tensor(E2M1_GRID, dtype=torch.float64, device=codes.device)
    top = float(torch.finfo(torch.float32).max)
    over = grid[mag] * torch.ldexp(torch.ones_like(e, dtype=torch.float64), e.double()).unsqueeze(-1) > top
    return torch.where(over, codes - 1, codes)


def e8m0_to_float(s: torch.Tensor) -> torch.Tensor:
    if bool((s == 255).any()):
        raise FormatError("e8m0 scale byte 255 (NaN) found; scales are never NaN")
    return torch.ldexp(torch.ones(s.shape, dtype=torch.float32, device=s.device), s.to(torch.float32) - 127.0)


def _byte_lut(values: torch.Tensor, per_byte: int, bits: int) -> torch.Tensor:
    """[256, per_byte] float32: the values of the codes packed in each byte value."""
    b = torch.arange(256)
    idx = torch.stack([(b >> (bits * t)) & ((1 << bits) - 1) for t in range(per_byte)], -1)
    return values[idx]


_E2M1_BYTE_LUT = _byte_lut(_grid_lut("cpu"), 2, 4)  # [256, 2]
_BASE2_BYTE_LUT = _byte_lut(torch.tensor(BASE2_LEVELS, dtype=torch.float32), 4, 2)  # [256, 4]


def _decode_bytes(q: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    # one table lookup per byte (embedding takes int32 indices: no int64 copy of q)
    flat = torch.nn.functional.embedding(q.reshape(-1).to(torch.int32), lut.to(q.device))
    return flat.reshape(*q.shape[:-1], q.shape[-1] * lut.shape[1])


def dequantize_mxfp4(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """(q [..., K/2], s [..., K/32]) -> float32 [..., K]."""
    vals = _decode_bytes(q.to(torch.uint8), _E2M1_BYTE_LUT)
    vals = vals.reshape(*vals.shape[:-1], -1, MX_BLOCK) * e8m0_to_float(s).unsqueeze(-1)
    return vals.reshape(*q.shape[:-1], q.shape[-1] * 2)


# ---- NVFP4 -----------------------------------------------------------------------


def quantize_nvfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """W [..., K] -> (q uint8 [..., K/2], s float8_e4m3fn [..., K/16], global float32).

    global = amax / (6 * 448); each e4m3 block scale is rounded up (next e4m3 value)
    when rounding to nearest would make the block max clip."""
    _check_k(w, NV_BLOCK, "quantize_nvfp4")
    x = w.to(torch.float32)
    amax = float(x.abs().max()) if x.numel() else 0.0
    g = amax / (E2M1_MAX * E4M3_MAX) if amax > 0 else 1.0
    g = float(np.float32(g))
    blocks = x.reshape(*x.shape[:-1], -1, NV_BLOCK)
    bmax = blocks.abs().amax(-1)
    want = (bmax / (E2M1_MAX * g)).clamp(max=E4M3_MAX)
    s8 = want.to(torch.float8_e4m3fn)
    short = (s8.to(torch.float32) * g * E2M1_MAX < bmax) & (s8.to(torch.float32) < E4M3_MAX)
    bumped = (s8.view(torch.uint8) + 1).view(torch.float8_e4m3fn)  # next e4m3 magnitude
    s8 = torch.where(short, bumped, s8)
    scale = s8.to(torch.float32) * g
    scaled = blocks / torch.where(scale > 0, scale, 1.0).unsqueeze(-1)
    codes = round_to_e2m1(scaled).reshape(x.shape)
    return pack_nibbles(codes), s8, g


def dequantize_nvfp4(q: torch.Tensor, s: torch.Tensor, global_scale: float) -> torch.Tensor:
    vals = _decode_bytes(q.to(torch.uint8), _E2M1_BYTE_LUT)
    vals = vals.reshape(*vals.shape[:-1], -1, NV_BLOCK) * (
        s.to(torch.float32) * float(global_scale)
    ).unsqueeze(-1)
    return vals.reshape(*q.shape[:-1], q.shape[-1] * 2)


def nvfp4_to_mxfp4(q: torch.Tensor, s: torch.Tensor, global_scale: float):
    """Re-quantise an NVFP4 tensor to MXFP4 (what packs store)."""
    return quantize_mxfp4(dequantize_nvfp4(q, s, global_scale))


# ---- 2-bit base ------------------------------------------------------------------


def _base2_codes(v: torch.Tensor) -> torch.Tensor:
    # nearest of {-4,-1,+1,+4}: boundaries -2.5, 0, +2.5
    return torch.where(v >= 0, 2 + (v > 2.5).to(torch.uint8), (v >= -2.5).to(torch.uint8)).to(torch.uint8)


def quantize_base2(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W [..., K] -> (codes uint8 [..., K/4], s uint8 e8m0 [..., K/32])."""
    _check_k(w, MX_BLOCK, "quantize_base2")
    x = _work(w)
    blocks = x.reshape(*x.shape[:-1], -1, MX_BLOCK)
    e_top = _mx_exponent(blocks.abs().amax(-1), 4.0)
    levels = torch.tensor(BASE2_LEVELS, dtype=x.dtype, device=x.device)
    best_e, best_err = e_top, None
    for drop in range(4):  # candidate exponents: e_top, e_top-1, e_top-2, e_top-3
        e = (e_top - drop).clamp(-127, 127)
        scale = torch.ldexp(torch.ones_like(e, dtype=x.dtype), e.to(x.dtype)).unsqueeze(-1)
        err = ((levels[_base2_codes(blocks / scale).long()] * scale - blocks) ** 2).sum(-1)
        if best_err is None:
            best_err = err
        else:
            better = err < best_err
            best_e = torch.where(better, e, best_e)
            best_err = torch.where(better, err, best_err)
    scaled = torch.ldexp(blocks, (-best_e).to(x.dtype).unsqueeze(-1))
    codes = _base2_codes(scaled).reshape(*x.shape[:-1], -1, 4)
    packed = codes[..., 0] | (codes[..., 1] << 2) | (codes[..., 2] << 4) | (codes[..., 3] << 6)
    return packed, (best_e + 127).to(torch.uint8)


def dequantize_base2(codes: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """(codes [..., K/4], s [..., K/32]) -> float32 [..., K]."""
    c = codes.to(torch.uint8)
    vals = _decode_bytes(c, _BASE2_BYTE_LUT)
    vals = vals.reshape(*c.shape[:-1], -1, MX_BLOCK) * e8m0_to_float(s).unsqueeze(-1)
    return vals.reshape(*c.shape[:-1], c.shape[-1] * 4)


# ---- fragment-major order --------------------------------------------------------


def _fragmajor_src() -> torch.Tensor:
    """src[j] = r*64 + c: nibble j of a 512-byte block (j = 32*lane + i) comes from (r, c)."""
    lane = np.arange(32)[:, None]
    i = np.arange(32)[None, :]
    row = lane // 4 + 8 * ((i // 8) % 2)
    col = 8 * (lane % 4) + (i % 8) + 32 * (i // 16)
    return torch.from_numpy((row * 64 + col).reshape(-1))


_FRAG_SRC = _fragmajor_src()
_FRAG_DST = torch.argsort(_FRAG_SRC)


def _frag_check(n: int, k: int) -> None:
    if n % 16 or k % 64:
        raise ConfigError(f"fragmajor order needs rows % 16 == 0 and K % 64 == 0, found [{n}, {k}]")


def to_fragmajor(q: torch.Tensor) -> torch.Tensor:
    """Linear q [..., N, K/2] -> fragment-major bytes [..., N/16, K/64, 512]."""
    lead, n, k = q.shape[:-2], q.shape[-2], q.shape[-1] * 2
    _frag_check(n, k)
    nib = unpack_nibbles(q).reshape(-1, n // 16, 16, k // 64, 64).permute(0, 1, 3, 2, 4)
    nib = nib.reshape(-1, n // 16, k // 64, 1024)[..., _FRAG_SRC.to(q.device)]
    return pack_nibbles(nib).reshape(*lead, n // 16, k // 64, 512)


def from_fragmajor(fq: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Fragment-major bytes of one or more [N, K] matrices -> linear q [..., N, K/2].

    ``fq`` is [..., N/16, K/64, 512] or [..., N*K/2]; used for inspection and decode."""
    _frag_check(n, k)
    lead = (
        fq.shape[:-3] if fq.dim() >= 3 and tuple(fq.shape[-3:]) == (n // 16, k // 64, 512) else fq.shape[:-1]
    )
    nib = unpack_nibbles(fq.reshape(-1, n // 16, k // 64, 512))[..., _FRAG_DST.to(fq.device)]
    nib = nib.reshape(-1, n // 16, k // 64, 16, 64).permute(0, 1, 3, 2, 4).reshape(-1, n, k)
    return pack_nibbles(nib).reshape(*lead, n, k // 2)
