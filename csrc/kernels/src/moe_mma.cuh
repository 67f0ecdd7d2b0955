// Tensor-core grouped MoE kernels, any T (contract and kernel list: moe.hpp, "tensor-core
// grouped path"; host launch in moe_mma_launch.cu; the CPU emulator includes this file).
//
// The weights are the mma A operand (16 weight rows per m16n8k16), the routed pairs the
// B operand (8 per n-tile), so a tile of 8..32 pairs of one expert reads the expert's
// bytes once. A lane (g = lane/4, t = lane%4) owns rows g and g+8 of a row group and,
// in chunk c, the whole 32-element scale block 4c+t: one 16-byte (fp4) or 8-byte (2-bit)
// load per row and one scale byte. The dot product's K order is free as long as A and B
// agree, so the block's 16 element pairs (8i+j, 8i+j+4) (i < 4, j < 4) are the 16
// bf16x2 A registers of 8 k-steps, and x / h are staged in that order ("position" q of a
// block holds element elem_of_pos(q)), making each B fragment one 8-byte load.
// Dequantisation, per pair: fp4 two nibbles -> bf16 bits by AND, IMAD, AND (the nibble
// as e2m1 * 2^-126, subnormal for e = 0), then one bf16x2 FMA by the e8m0 scale; 2-bit
// codes -> bf16 by shift, LOP3, PRMT from a per-(row, block) byte table that has the
// scale folded in. Every value is exact in bf16; fp4 carries 2^-64 and 2-bit 2^32
// (undone in f32 at the end) so that every realistic scale stays normal.
#pragma once
#include "moe_mma_common.cuh"

#ifndef TS_MOE_PRELOAD
#define TS_MOE_PRELOAD 1   // chunks loaded at once by decode tiles (1 = one-chunk prefetch)
#endif

namespace tierstore {
namespace {

constexpr int kMmaPreload = TS_MOE_PRELOAD;

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
#ifdef TS_MOE_CPU_EMULATION
  return emu_bf16x2_mul(a, b);
#else
  uint32_t d;   // a * b + (-0): one FMA, exact here (power-of-two scale)
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
#endif
}

// d += A (16x16, bf16, row) * B (16x8, bf16, col), f32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef TS_MOE_CPU_EMULATION
  emu_mma_m16n8k16_bf16(d, a, b0, b1);
#else
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
               "{%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// bf16x2 (both halves) of 2^(s + bias - 127), exact; subnormal below 2^-126.
__device__ __forceinline__ uint32_t scale_bf16x2(uint32_t s, int bias) {
  const int f = static_cast<int>(s) + bias;
  const uint32_t b = f >= 1 ? static_cast<uint32_t>(min(f, 254)) << 7 : (f >= -5 ? 0x40u >> (-f) : 0u);
  return b | (b << 16);
}

// Nibbles j and j+4 of w (nibble n = bits 4n..4n+3) -> bf16x2 of e2m1 * 2^-126: sign to
// bit 15, (e1 e0 m) to bits 8..6; the two shifted copies added by one IMAD never overlap.
__device__ __forceinline__ uint32_t fp4_pair_bf16(uint32_t w, int j) {
  const uint32_t src = j >= 2 ? w >> 8 : w;
  const uint32_t t = src & ((j & 1) ? 0x00F000F0u : 0x000F000Fu);
  return (t * ((j & 1) ? 0x104u : 0x1040u)) & 0x81C081C0u;
}

// The 2-bit lookup table of one (row, block) with the scale folded in: bf16 high bytes of
// {-4,-1,+1,+4} * 2^(s-127) * 2^32 (exponent fields f+2 and f, f = s + 32; 2^32 keeps
// every s <= 220 normal and is undone at the end). Both fields have f's parity, so every
// low byte is the same ((f & 1) << 7): the `lo` byte.
struct Base2Table {
  uint32_t hi, lo;
};
__device__ __forceinline__ Base2Table base2_table(uint32_t s) {
  const uint32_t f = min(s + 32u, 252u), h = f >> 1;
  return {(0x80u | (h + 1)) | ((0x80u | h) << 8) | (h << 16) | ((h + 1) << 24), (f & 1u) << 7};
}

// 2-bit codes c and c+4 of w (code n = bits 2n..2n+1; c in 0..3 or 8..11) -> bf16x2,
// scaled: the codes select high bytes of the table, the low bytes are tb.lo.
__device__ __forceinline__ uint32_t base2_pair_bf16(uint32_t w, int c, const Base2Table& tb) {
  const uint32_t t = c <= 2 ? w << (4 - 2 * c) : w >> (2 * c - 4);
  return __byte_perm(tb.hi, tb.lo, (t & 0x3030u) | 0x0404u);
}

// The codes and scale of one row's block as loaded, and the scale in its decode form.
struct RowBlock {
  uint32_t q[4];
  uint32_t m;        // fp4: bf16x2 multiplier; 2-bit: table high bytes
  uint32_t lo;       // 2-bit: table low byte
};

// Pair p (0..15) of a block -> elements (8i+j, 8i+j+4), i = p/4, j = p%4, scaled bf16x2.
template <int CODEC>
__device__ __forceinline__ uint32_t pair_bf16(const RowBlock& b, int p) {
  if (CODEC == kFp4) return bf16x2_mul(fp4_pair_bf16(b.q[p >> 2], p & 3), b.m);
  return base2_pair_bf16(b.q[p >> 3], 8 * ((p >> 2) & 1) + (p & 3), Base2Table{b.m, b.lo});
}

// Loads block blk of a row (codes at qp, scales at sp); zeros when the lane has no block.
template <int CODEC>
__device__ __forceinline__ RowBlock load_block(const uint8_t* qp, const uint8_t* sp, int blk, bool has) {
  RowBlock b{{0u, 0u, 0u, 0u}, 0u, 0u};
  if (!has) return b;
  if (CODEC == kFp4) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(qp + 16LL * blk));
    b.q[0] = v.x; b.q[1] = v.y; b.q[2] = v.z; b.q[3] = v.w;
  } else {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(qp + 8LL * blk));
    b.q[0] = v.x; b.q[1] = v.y;
  }
  b.m = __ldg(sp + blk);          // raw scale byte; decoded by decode_scale after the wait
  return b;
}

template <int CODEC>
__device__ __forceinline__ void decode_scale(RowBlock& b, bool has) {
  if (!has) return;
  if (CODEC == kFp4) {
    b.m = scale_bf16x2(b.m, 62);    // 2^(s-65): fp4 pairs carry 2^-126, results 2^-64
  } else {
    const Base2Table tb = base2_table(b.m);
    b.m = tb.hi;
    b.lo = tb.lo;
  }
}

// One tile (<= 8*NT8 pairs of one expert) x one row block: w13 -> 16 outputs i (gate rows
// i, up rows I+i: the two row groups), SiLU(gate)*up -> h terms; w2 -> 32 rows n of y.
template <bool W13, int CODEC, int NS, int NT8, int NSO>
__device__ __forceinline__ void mma_body(const MoeDecodeArgs& a, const MmaPlan& pl, const uint8_t* row,
                                         int start, int cnt) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int K = W13 ? a.H : a.I, nb = K / kBlk, nchunks = (nb + 3) / 4;
  constexpr int QB = CODEC == kFp4 ? 16 : 8;            // code bytes per row per block
  const int64_t qrow = static_cast<int64_t>(nb) * QB;
  const uint8_t* q0;
  const uint8_t* s0;
  int64_t first, rg_step;
  if (W13) {
    first = static_cast<int64_t>(blockIdx.x) * 16;
    q0 = row;
    s0 = row + 2LL * a.I * qrow;
    rg_step = a.I;
  } else {
    const uint8_t* w2 = row + 2LL * a.I * (static_cast<int64_t>(a.H / kBlk) * QB + a.H / kBlk);
    first = static_cast<int64_t>(blockIdx.x) * 32;
    q0 = w2;
    s0 = w2 + static_cast<int64_t>(a.H) * qrow;
    rg_step = 16;
  }
  const uint8_t* qp[2][2];
  const uint8_t* sp[2][2];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t ri = first + r * rg_step + g + 8 * h;
      qp[r][h] = q0 + ri * qrow;
      sp[r][h] = s0 + ri * nb;
    }
  const uint16_t* bsrc[NT8];
#pragma unroll
  for (int nt = 0; nt < NT8; ++nt) {
    const int col = nt * 8 + g;
    bsrc[nt] = nullptr;
    if (col < cnt) {
      const int pos = start + col;
      bsrc[nt] = W13 ? pl.xb + static_cast<int64_t>(pl.sorted[pos] / a.k) * NS * K
                     : pl.hb + static_cast<int64_t>(pos) * NS * K;
    }
  }
  float acc[2][NT8][4];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[r][nt][c] = 0.f;
  const int cpw = (nchunks + kWarps - 1) / kWarps, c_lo = warp * cpw, c_hi = min(nchunks, c_lo + cpw);
  // one chunk: 8 k-steps of 2 row groups x NT8 n-tiles x NS terms
  auto chunk = [&](RowBlock (&cur)[2][2], int blk, bool has) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) decode_scale<CODEC>(cur[r][h], has);
#pragma unroll
    for (int s8 = 0; s8 < 8; ++s8) {
      uint32_t af[2][4];
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          af[r][h] = pair_bf16<CODEC>(cur[r][h], 2 * s8);
          af[r][h + 2] = pair_bf16<CODEC>(cur[r][h], 2 * s8 + 1);
        }
#pragma unroll
      for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
        for (int s = 0; s < NS; ++s) {
          uint2 b = make_uint2(0u, 0u);
          if (has && bsrc[nt]) b = __ldg(reinterpret_cast<const uint2*>(bsrc[nt] + s * K + blk * 32 + 4 * s8));
#pragma unroll
          for (int r = 0; r < 2; ++r) mma_bf16(acc[r][nt], af[r], b.x, b.y);
        }
    }
  };
  if (NT8 == 1 && kMmaPreload > 1) {
    // decode tiles (few registers of accumulators): every load of up to kPre chunks is
    // issued before the first use, so a warp waits for memory once per kPre chunks
    constexpr int kPre = kMmaPreload > 1 ? kMmaPreload : 2;
#pragma unroll 1
    for (int c0 = c_lo; c0 < c_hi; c0 += kPre) {
      RowBlock cur[kPre][2][2];
#pragma unroll
      for (int u = 0; u < kPre; ++u)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int blk = 4 * (c0 + u) + t;
            cur[u][r][h] = load_block<CODEC>(qp[r][h], sp[r][h], blk, c0 + u < c_hi && blk < nb);
          }
#pragma unroll
      for (int u = 0; u < kPre; ++u) {
        if (c0 + u >= c_hi) break;                     // warp-uniform
        const int blk = 4 * (c0 + u) + t;
        chunk(cur[u], blk, blk < nb);
      }
    }
  } else {
    RowBlock nxt[2][2];                                // chunk c+1's loads fly while c computes
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        nxt[r][h] = load_block<CODEC>(qp[r][h], sp[r][h], 4 * c_lo + t, c_lo < c_hi && 4 * c_lo + t < nb);
#pragma unroll 1
    for (int c = c_lo; c < c_hi; ++c) {
      const int blk = 4 * c + t;
      RowBlock cur[2][2];
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          cur[r][h] = nxt[r][h];
          nxt[r][h] = load_block<CODEC>(qp[r][h], sp[r][h], blk + 4, c + 1 < c_hi && blk + 4 < nb);
        }
      chunk(cur, blk, blk < nb);
    }
  }
  // sum the 8 warps' K slices (fixed order), then the epilogue per (column, row)
  constexpr int NV = 2 * NT8 * 4;
  float* red = dynamic_smem();
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) red[(warp * NV + (r * NT8 + nt) * 4 + c) * 32 + lane] = acc[r][nt][c];
  __syncthreads();
  const float fix = CODEC == kFp4 ? 18446744073709551616.f : 2.3283064365386963e-10f;   // 2^64, 2^-32
  for (int idx = threadIdx.x; idx < NT8 * 4 * 32; idx += kThreads) {
    const int ln = idx & 31, c = (idx >> 5) & 3, nt = idx >> 7;
    const int col = nt * 8 + 2 * (ln & 3) + (c & 1);
    if (col >= cnt) continue;
    float v0 = 0.f, v1 = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      v0 += red[(w * NV + nt * 4 + c) * 32 + ln];
      v1 += red[(w * NV + (NT8 + nt) * 4 + c) * 32 + ln];
    }
    v0 *= fix;
    v1 *= fix;
    const int64_t ri = first + (ln >> 2) + 8 * (c >> 1), pos = start + col;
    if (W13) {
      uint32_t o[NSO];
      split_terms<NSO>(v0 / (1.f + __expf(-v0)) * v1, o);
      const int64_t qpos = (ri & ~31LL) + pos_of_elem(static_cast<int>(ri & 31));
#pragma unroll
      for (int s = 0; s < NSO; ++s) pl.hb[(pos * NSO + s) * a.I + qpos] = static_cast<uint16_t>(o[s]);
    } else {
      float* yr = pl.y + pos * a.H + ri;
      yr[0] = v0;
      yr[16] = v1;
    }
  }
}

template <bool W13, int NS, int NT8, int NSO>
__global__ void __launch_bounds__(kThreads, 2) moe_mma_kernel(MoeDecodeArgs a, MmaPlan pl) {
  const int tile = blockIdx.y;
  if (tile >= pl.tiles[3 * pl.tmax]) return;            // block-uniform
  const int e = pl.tiles[tile], start = pl.tiles[pl.tmax + tile], cnt = pl.tiles[2 * pl.tmax + tile];
  const ExpertRow er = expert_row(a, e);
  if (er.codec == kFp4) mma_body<W13, kFp4, NS, NT8, NSO>(a, pl, er.row, start, cnt);
  else mma_body<W13, kBase2, NS, NT8, NSO>(a, pl, er.row, start, cnt);
}

}  // namespace
}  // namespace tierstore
