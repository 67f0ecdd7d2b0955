"""FP4 / 2-bit codecs against an fp64 reference, with property tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from tierstore.errors import ConfigError, FormatError
from tierstore.format import fp4, layouts

GRID = np.array(fp4.E2M1_GRID)
GRID_STEP_ABOVE = np.array([0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 2.0, 2.0])  # step to the next point


def _ref_mxfp4(w: np.ndarray):
    """fp64 reference: exponent, then nearest grid point (ties -> even code)."""
    b = w.reshape(*w.shape[:-1], -1, 32)
    amax = np.abs(b).max(-1)
    e = np.where(amax > 0, np.ceil(np.log2(np.where(amax > 0, amax, 1) / 6.0)), -127)
    e = np.where(amax > 6 * 2.0**e, e + 1, e)
    e = np.where((amax > 0) & (amax <= 6 * 2.0 ** (e - 1)), e - 1, e).clip(-127, 127)
    v = np.abs(b) / 2.0 ** e[..., None]
    dist = np.abs(v[..., None] - GRID)
    code = np.argmin(dist + 1e-12 * (np.arange(8) % 2), axis=-1)  # ties -> even index
    return (np.sign(b) * GRID[code] * 2.0 ** e[..., None]).reshape(w.shape), e


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def test_gaussian_mxfp4_matches_fp64_reference_exactly_and_within_half_step():
    w = np.random.default_rng(0).standard_normal((64, 256))
    q, s = fp4.quantize_mxfp4(torch.from_numpy(w))
    got = fp4.dequantize_mxfp4(q, s).double().numpy()
    ref, e = _ref_mxfp4(w)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(s.numpy().astype(int) - 127, e.astype(int))
    # per element: at most half of the local grid step (<= 1.0 at the block scale)
    err_scaled = np.abs(got - w).reshape(64, -1, 32) / 2.0 ** e[..., None]
    assert err_scaled.max() <= 1.0
    assert 0.05 < _rel(got, w) < 0.2


def test_fp32_and_bf16_inputs_agree_with_float64_path():
    w = torch.randn(32, 128, dtype=torch.float64)
    q64, s64 = fp4.quantize_mxfp4(w)
    q32, s32 = fp4.quantize_mxfp4(w.float())
    assert (q64 != q32).float().mean() < 1e-3 and torch.equal(s64, s32)
    qb, sb = fp4.quantize_mxfp4(w.bfloat16())
    assert _rel(fp4.dequantize_mxfp4(qb, sb), w) < 0.2


def test_ties_round_to_even_code():
    # block max 6 -> exponent 0; the tie points go to the even code
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 4, dtype=torch.float64)
    q, s = fp4.quantize_mxfp4(ties[None])
    assert int(s[0, 0]) == 127
    got = fp4.dequantize_mxfp4(q, s)[0, :8].tolist()
    assert got == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0]


@settings(max_examples=60, deadline=None)
@given(
    codes=arrays(np.uint8, (4, 64), elements=st.integers(0, 15)),
    exps=arrays(np.int32, (4, 2), elements=st.integers(-120, 120)),
)
def test_values_on_the_grid_round_trip_exactly(codes, exps):
    lut = np.concatenate([GRID, -GRID])
    vals = lut[codes].reshape(4, 2, 32) * 2.0 ** exps[..., None].astype(np.float64)
    vals = vals.reshape(4, 64)
    q, s = fp4.quantize_mxfp4(torch.from_numpy(vals))
    back = fp4.dequantize_mxfp4(q, s).double().numpy()
    np.testing.assert_array_equal(back, vals)


@settings(max_examples=80, deadline=None)
@given(w=arrays(np.float32, (2, 64), elements=st.floats(allow_nan=False, allow_infinity=False, width=32)))
def test_scale_choice_never_overflows_and_output_is_finite(w):
    q, s = fp4.quantize_mxfp4(torch.from_numpy(w))
    assert int(s.max()) < 255
    d = fp4.dequantize_mxfp4(q, s).double().numpy()
    assert np.isfinite(d).all()
    amax = np.abs(w.astype(np.float64)).reshape(2, 2, 32).max(-1)
    scale = 2.0 ** (s.numpy().astype(np.float64) - 127)
    assert (amax <= 6 * scale).all()  # nothing clips
    nz = amax > 6 * 2.0**-127
    assert (amax[nz] > 3 * scale[nz]).all()  # and the scale is the smallest
    err = np.abs(d - w).reshape(2, 2, 32) / scale[..., None]
    assert err.max() <= 1.0


def test_nvfp4_round_trip_and_requantise_to_mxfp4():
    w = torch.randn(64, 256, dtype=torch.float64)
    q, s, g = fp4.quantize_nvfp4(w)
    assert s.dtype == torch.float8_e4m3fn and s.shape == (64, 16) and q.shape == (64, 128)
    d = fp4.dequantize_nvfp4(q, s, g)
    assert torch.isfinite(d).all() and _rel(d, w) < 0.15
    # block max never clips: |w| <= 6 * e4m3 * global per block
    bound = (s.float() * g * 6).repeat_interleave(16, -1).double()
    assert (w.abs() <= bound * (1 + 1e-6)).all()
    qm, sm = fp4.nvfp4_to_mxfp4(q, s, g)
    assert qm.shape == (64, 128) and sm.shape == (64, 8)
    assert _rel(fp4.dequantize_mxfp4(qm, sm), w) < 0.2


def test_base2_error_is_larger_than_fp4_but_bounded():
    w = torch.randn(128, 256, dtype=torch.float64)
    c, s = fp4.quantize_base2(w)
    assert c.shape == (128, 64) and s.shape == (128, 8)
    r2 = _rel(fp4.dequantize_base2(c, s), w)
    q, sq = fp4.quantize_mxfp4(w)
    r4 = _rel(fp4.dequantize_mxfp4(q, sq), w)
    assert r4 < r2 < 0.45


@settings(max_examples=40, deadline=None)
@given(
    codes=arrays(np.uint8, (3, 32), elements=st.integers(0, 3)),
    e=arrays(np.int32, (3, 1), elements=st.integers(-100, 100)),
)
def test_base2_grid_values_round_trip_and_bit_layout(codes, e):
    vals = np.array(fp4.BASE2_LEVELS)[codes] * 2.0 ** e.astype(np.float64)
    c, s = fp4.quantize_base2(torch.from_numpy(vals))
    np.testing.assert_array_equal(fp4.dequantize_base2(c, s).double().numpy(), vals)
    # decode by hand from the documented layout: element 4j+t in bits 2t..2t+1 of byte j
    cb = c.numpy()
    idx = np.stack([(cb >> (2 * t)) & 3 for t in range(4)], -1).reshape(3, 32)
    scale = 2.0 ** (s.numpy().astype(np.float64) - 127)
    np.testing.assert_array_equal(np.array(fp4.BASE2_LEVELS)[idx] * scale, vals)


def test_nibble_order_low_is_even_element():
    codes = torch.tensor([[1, 2, 3, 4]], dtype=torch.uint8)
    assert fp4.pack_nibbles(codes).tolist() == [[0x21, 0x43]]
    assert torch.equal(fp4.unpack_nibbles(fp4.pack_nibbles(codes)), codes)


def test_fragmajor_lane_layout_matches_the_documented_formula():
    n, k = 32, 128
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    fq = fp4.to_fragmajor(fp4.pack_nibbles(codes))
    nib = fp4.unpack_nibbles(fq)  # [n/16, k/64, 1024]
    for bn, bk, lane, i in [(0, 0, 0, 0), (1, 1, 5, 9), (0, 1, 31, 31), (1, 0, 17, 20)]:
        g, t = lane // 4, lane % 4
        r = bn * 16 + g + 8 * ((i // 8) % 2)
        c = bk * 64 + 8 * t + i % 8 + 32 * (i // 16)
        assert int(nib[bn, bk, 32 * lane + i]) == int(codes[r, c])
    assert torch.equal(fp4.from_fragmajor(fq, n, k), fp4.pack_nibbles(codes))
    with pytest.raises(ConfigError, match="fragmajor"):
        fp4.to_fragmajor(torch.zeros(8, 32, dtype=torch.uint8))


@pytest.mark.parametrize("tag,order", [("fp4", "linear"), ("fp4", "fragmajor"), ("base", "linear")])
def test_expert_row_round_trip_and_sections(tag, order):
    H, I = 128, 64
    w13, w2 = torch.randn(2 * I, H), torch.randn(H, I)
    row = layouts.encode_expert(w13, w2, tag, order)
    secs = layouts.row_sections(tag, H, I, order)
    assert row.dtype == np.uint8 and row.size == secs[-1].offset + secs[-1].bytes
    assert [s.offset for s in secs[1:]] == [a.offset + a.bytes for a in secs[:-1]]
    a, b = layouts.decode_expert(row, tag, H, I, order)
    assert a.shape == (2 * I, H) and b.shape == (H, I)
    limit = 0.2 if tag == "fp4" else 0.45
    assert _rel(a, w13) < limit and _rel(b, w2) < limit
    # the w2 scale section really is w2's scale
    p = layouts.split_row(row, tag, H, I, order)
    assert torch.equal(p["w2.s"], fp4.quantize_mxfp4(w2)[1] if tag == "fp4" else fp4.quantize_base2(w2)[1])


def test_row_bytes_match_compat_sizes_at_ds4_shape():
    assert layouts.row_bytes("fp4", 4096, 2048) == 13_369_344
    assert layouts.row_bytes("delta", 4096, 2048) == 12_582_912
    assert layouts.row_bytes("base", 4096, 2048) == 7_077_888


def test_delta_row_needs_external_scales():
    H, I = 64, 64
    w13, w2 = torch.randn(2 * I, H), torch.randn(H, I)
    row = layouts.encode_expert(w13, w2, "delta")
    with pytest.raises(ConfigError, match="scales"):
        layouts.decode_expert(row, "delta", H, I)
    sc = (fp4.quantize_mxfp4(w13)[1], fp4.quantize_mxfp4(w2)[1])
    a, _ = layouts.decode_expert(row, "delta", H, I, scales=sc)
    assert _rel(a, w13) < 0.2


def test_bad_inputs_name_the_problem():
    with pytest.raises(ConfigError, match="non-finite value at flat index 3"):
        fp4.quantize_mxfp4(torch.tensor([[0.0, 1.0, 2.0, float("nan")] + [0.0] * 28]))
    with pytest.raises(ConfigError, match="multiple of 32"):
        fp4.quantize_mxfp4(torch.zeros(2, 48))
    with pytest.raises(FormatError, match="expected at least"):
        layouts.decode_expert(np.zeros(10, np.uint8), "fp4", 64, 64)
    with pytest.raises(FormatError, match="255"):
        fp4.dequantize_mxfp4(
            torch.zeros(1, 16, dtype=torch.uint8), torch.full((1, 1), 255, dtype=torch.uint8)
        )
    with pytest.raises(ConfigError, match="unknown"):
        layouts.row_sections("fp8", 64, 64)


@pytest.mark.parametrize("v", [2.9774707e38, 3.4e38, -float(np.finfo(np.float32).max), 1.7e38])
def test_values_near_float32_max_decode_finite_in_float32(v):
    q, s = fp4.quantize_mxfp4(torch.full((1, 32), v, dtype=torch.float32))
    d = fp4.dequantize_mxfp4(q, s)
    assert torch.isfinite(d).all()
    assert float((d - v).abs().max()) <= 2.0 ** (int(s[0, 0]) - 127)


def test_batched_encode_equals_per_expert_encode():
    w13, w2 = torch.randn(2, 3, 128, 64), torch.randn(2, 3, 64, 64)
    for tag, order in (("fp4", "linear"), ("fp4", "fragmajor"), ("base", "linear")):
        rows = layouts.encode_experts(w13, w2, tag, order)
        assert rows.shape == (2, 3, layouts.row_bytes(tag, 64, 64))
        np.testing.assert_array_equal(rows[1, 2], layouts.encode_expert(w13[1, 2], w2[1, 2], tag, order))
        a, b = layouts.decode_experts(torch.from_numpy(rows), tag, 64, 64, order)
        a1, b1 = layouts.decode_expert(rows[1, 2], tag, 64, 64, order)
        assert torch.equal(a[1, 2], a1) and torch.equal(b[1, 2], b1)


@settings(max_examples=40, deadline=None)
@given(w=arrays(np.float32, (2, 32), elements=st.floats(-(2.0**100), 2.0**100, width=32)))
def test_nvfp4_never_clips_the_block_max_and_is_finite(w):
    q, s, g = fp4.quantize_nvfp4(torch.from_numpy(w))
    d = fp4.dequantize_nvfp4(q, s, g).double()
    assert torch.isfinite(d).all() and np.isfinite(g) and g > 0
    bmax = torch.from_numpy(np.abs(w.astype(np.float64))).reshape(2, 2, 16).amax(-1)
    scale = s.double() * g
    # the block max is representable without clipping (blocks far below the global max
    # may get a zero e4m3 scale and flush to zero)
    assert bool((bmax[scale > 0] <= 6 * scale[scale > 0] * (1 + 1e-6)).all())
    err = (d - torch.from_numpy(w).double()).abs().reshape(2, 2, 16)
    ok = scale > 0
    assert bool((err.amax(-1)[ok] <= scale[ok] * (1 + 1e-6)).all())  # <= half of the widest step


@settings(max_examples=30, deadline=None)
@given(codes=arrays(np.uint8, (2, 32, 128), elements=st.integers(0, 15)))
def test_fragmajor_round_trip_is_a_permutation(codes):
    q = fp4.pack_nibbles(torch.from_numpy(codes))
    fq = fp4.to_fragmajor(q)
    assert fq.shape == (2, 2, 2, 512)
    assert torch.equal(fp4.from_fragmajor(fq, 32, 128), q)
    # same multiset of nibbles per 16x64 block: nothing lost or duplicated
    blk = torch.from_numpy(codes)[0, :16, :64].reshape(-1).sort().values
    assert torch.equal(fp4.unpack_nibbles(fq[0, 0, 0]).sort().values, blk)
