// Slot-aware fused-MoE decode kernels v2, the FFMA grouped GEMV (T <= 16; contract in
// include/tierstore/kernels/moe.hpp). Device code only: host launch in moe_decode.cu; the
// CPU emulator (csrc/kernels/tests) includes this file too.
//
// Shape of the work: Hopper has no FP4 tensor cores and decode has <= 16 tokens, so
// this is a memory-bound grouped GEMV whose cost is (a) streaming the routed experts'
// bytes once and (b) the per-element decode + FMA, which at T=1 is as large as (a).
// Grid = (output-row tiles, routed pairs); the block of the FIRST pair routed to an
// expert (its "leader") does that expert's tile for every pair routed to it (found in
// parallel: one pair per thread, a block-wide OR and a ballot compaction), the other
// pairs' blocks exit at once, so each expert's bytes are read once.
//
// Inside a block: the activations of up to MAXM pairs are staged once in shared memory
// as fp32 (padded per 32-element block so the float4 reads of a quarter-warp hit
// distinct banks). Each warp owns R weight rows that share the activations (gate+up of
// one output for w13, R rows of w2); a lane owns whole 32-element scale blocks
// (16 bytes of e2m1 or 8 bytes of 2-bit codes, one e8m0 byte) and issues the loads of
// U blocks x R rows (8 independent 16-byte loads) before the first use. Codes are
// decoded in registers to fp16 pairs (bit tricks, no lookup table in memory), widened
// to fp32, and dotted in fp32; per-row sums are reduced with warp shuffles.
#pragma once
#include "moe_device.cuh"

namespace tierstore {
namespace {

constexpr int kBlkPitch = kBlk + 4;                 // +4 floats: conflict-free float4 reads
constexpr int kMaxPairs = kMoeDecodeMaxTokens * kMoeDecodeMaxTopK;
static_assert(kMaxPairs <= kThreads, "one pair per thread in collect_group");
constexpr int kW13OutsPerWarp = 2;                  // outputs i (gate + up row each) per warp
constexpr int kW13Tile = kWarps * kW13OutsPerWarp;  // outputs per block
// w2 rows per warp (they share the staged activations); 2 at MAXM = 4 to stay in 128 registers
template <int MAXM> constexpr int kW2Rows = MAXM >= 4 ? 2 : 4;

struct Group {                 // what the block's leader pair resolved (shared memory)
  int n_match;                 // pairs routed to this expert
  int codec;
  const uint8_t* row;          // start of the expert's row (pool slot or base row)
  int warp_count[kWarps];
  int match[kMaxPairs];        // the pair indices, ascending
};

// Two fp16 values packed in a word (low half first) -> fp32, exactly.
__device__ __forceinline__ float2 half2_bits_to_float2(uint32_t h) {
#ifdef TS_MOE_CPU_EMULATION
  return emu_half2_bits_to_float2(h);
#else
  float lo, hi;
  asm("{\n\t.reg .f16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
      : "=f"(lo), "=f"(hi) : "r"(h));
  return make_float2(lo, hi);
#endif
}

// e2m1 elements j and j+4 of the 8 nibbles in w (element n = bits 4n..4n+3), times 2^-14:
// nibble s|e1 e0 m placed as fp16 sign | exponent 000 e1 e0 | mantissa m00.. is
// 2^-14 * e2m1 for every code (e = 0 lands on fp16's subnormals, as e2m1's does).
__device__ __forceinline__ float2 fp4_pair(uint32_t w, int j) {
  const uint32_t u = w << (12 - 4 * j);             // nibble j -> bits 15:12, j+4 -> 31:28
  return half2_bits_to_float2((u & 0x80008000u) | ((u & 0x70007000u) >> 3));
}

// 2-bit codes a and a+4 of the 16 in w (code n = bits 2n..2n+1), a in 0..3 or 8..11:
// a byte permute picks each code's fp16 high byte from {-4, -1, +1, +4}; low bytes 0.
__device__ __forceinline__ float2 base2_pair(uint32_t w, int a) {
  const uint32_t t = a >= 2 ? w >> (2 * a - 4) : w << (4 - 2 * a);   // code a -> bits 5:4, a+4 -> 13:12
  const uint32_t sel = (t & 0x3030u) | 0x0404u;                     // selector 4 = a zero byte
  return half2_bits_to_float2(__byte_perm(0x443CBCC4u, 0u, sel));
}

__device__ __forceinline__ uint32_t word_of(const uint4& q, int i) {
  return i == 0 ? q.x : i == 1 ? q.y : i == 2 ? q.z : q.w;
}

// Block pair p: returns false (for the whole block) unless p leads its expert; else
// fills g (pairs routed to the expert, ascending; row pointer via the slot table).
__device__ bool collect_group(const MoeDecodeArgs& a, int p, Group& g) {
  const int n_pairs = a.T * a.k;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int e = a.topk_ids[p];
  if (e < 0 || e >= a.E) return false;                       // same value in every thread
  const int id = tid < n_pairs ? a.topk_ids[tid] : -1;
  if (__syncthreads_or(tid < p && id == e)) return false;     // an earlier pair leads
  const bool match = tid >= p && id == e;
  const unsigned bal = __ballot_sync(0xffffffffu, match);
  if (lane == 0) g.warp_count[warp] = __popc(bal);
  if (tid == 0) {
    const ExpertRow r = expert_row(a, e);
    g.codec = r.codec;
    g.row = r.row;
  }
  __syncthreads();
  int before = 0, total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    before += w < warp ? g.warp_count[w] : 0;
    total += g.warp_count[w];
  }
  if (match) g.match[before + __popc(bal & ((1u << lane) - 1u))] = tid;
  if (tid == 0) g.n_match = total;
  __syncthreads();
  return true;
}

__device__ __forceinline__ int64_t q_bytes_per_row(int codec, int K) {
  return codec == kFp4 ? K / 2 : K / 4;
}

// Stage nm activation rows [K] (load4(m, c) -> elements c..c+3 of row m) into the
// padded layout s_x[m][block][kBlkPitch]. Caller brackets it with barriers.
template <typename Load4>
__device__ __forceinline__ void stage(float* s_x, int nm, int K, Load4 load4) {
  const int per = K / 4, nb = K / kBlk;
  for (int idx = threadIdx.x; idx < nm * per; idx += kThreads) {
    const int m = idx / per, c = (idx - m * per) * 4;
    *reinterpret_cast<float4*>(s_x + (m * nb + c / kBlk) * kBlkPitch + c % kBlk) = load4(m, c);
  }
}

// One 32-element block of R rows (codes q, scale bytes s) against nm staged activations.
template <int CODEC, int R, int MAXM>
__device__ __forceinline__ void block_dots(const uint4 (&q)[R], const uint32_t (&s)[R],
                                           const float* xblk, int mstride, int nm,
                                           float (&acc)[R][MAXM]) {
  float dot[R][MAXM];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MAXM; ++m) dot[r][m] = 0.f;
#pragma unroll
  for (int g8 = 0; g8 < 4; ++g8) {                  // elements 8*g8 .. 8*g8+7
    float2 v[R][4];                                 // v[r][j] = (element j, element j+4)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < 4; ++j)
        v[r][j] = CODEC == kFp4 ? fp4_pair(word_of(q[r], g8), j)
                                : base2_pair(word_of(q[r], g8 >> 1), (g8 & 1) * 8 + j);
#pragma unroll
    for (int m = 0; m < MAXM; ++m) {
      if (m < nm) {
        const float4 xa = *reinterpret_cast<const float4*>(xblk + m * mstride + 8 * g8);
        const float4 xb = *reinterpret_cast<const float4*>(xblk + m * mstride + 8 * g8 + 4);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float d = dot[r][m];
          d = fmaf(v[r][0].x, xa.x, d); d = fmaf(v[r][0].y, xb.x, d);
          d = fmaf(v[r][1].x, xa.y, d); d = fmaf(v[r][1].y, xb.y, d);
          d = fmaf(v[r][2].x, xa.z, d); d = fmaf(v[r][2].y, xb.z, d);
          d = fmaf(v[r][3].x, xa.w, d); d = fmaf(v[r][3].y, xb.w, d);
          dot[r][m] = d;
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float sc = e8m0_to_float(s[r]);
#pragma unroll
    for (int m = 0; m < MAXM; ++m)                   // fp4 pairs carry 2^-14: undo before scaling
      acc[r][m] = fmaf(CODEC == kFp4 ? dot[r][m] * 16384.f : dot[r][m], sc, acc[r][m]);
  }
}

// acc[r][m] = row r of W . activation m, summed over the warp (every lane gets it).
// Row r's codes start at q0 + r * q_rstride, its scales at s0 + r * s_rstride.
template <int CODEC, int R, int U, int MAXM>
__device__ __forceinline__ void rows_dot(const uint8_t* q0, int64_t q_rstride, const uint8_t* s0,
                                         int64_t s_rstride, int nb, const float* s_x, int nm,
                                         int lane, float (&acc)[R][MAXM]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MAXM; ++m) acc[r][m] = 0.f;
  const int mstride = nb * kBlkPitch;
  for (int c0 = 0; c0 * 32 < nb; c0 += U) {
    uint4 q[U][R];
    uint32_t s[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {                    // all loads first: U*R in flight per lane
      const int blk = lane + 32 * (c0 + u);
      if (blk < nb) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const uint8_t* qr = q0 + r * q_rstride;
          if (CODEC == kFp4) {
            q[u][r] = __ldg(reinterpret_cast<const uint4*>(qr + 16LL * blk));
          } else {
            const uint2 c = __ldg(reinterpret_cast<const uint2*>(qr + 8LL * blk));
            q[u][r] = make_uint4(c.x, c.y, 0u, 0u);
          }
          s[u][r] = __ldg(s0 + r * s_rstride + blk);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int blk = lane + 32 * (c0 + u);
      if (blk < nb) block_dots<CODEC, R, MAXM>(q[u], s[u], s_x + blk * kBlkPitch, mstride, nm, acc);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MAXM; ++m)
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], off);
}

template <typename XT>
__device__ __forceinline__ float4 load4_act(const XT* row, int c);
template <> __device__ __forceinline__ float4 load4_act<float>(const float* row, int c) {
  return *reinterpret_cast<const float4*>(row + c);
}
template <> __device__ __forceinline__ float4 load4_act<__nv_bfloat16>(const __nv_bfloat16* row, int c) {
  const uint2 u = *reinterpret_cast<const uint2*>(row + c);
  return make_float4(__int_as_float(static_cast<int>(u.x << 16)), __int_as_float(static_cast<int>(u.x & 0xffff0000u)),
                     __int_as_float(static_cast<int>(u.y << 16)), __int_as_float(static_cast<int>(u.y & 0xffff0000u)));
}

template <int CODEC, typename XT, int MAXM>
__device__ __forceinline__ void w13_body(const MoeDecodeArgs& a, const Group& g, float* s_x) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int K = a.H, nb = K / kBlk;
  const int64_t qb = q_bytes_per_row(CODEC, K);
  const uint8_t* q_base = g.row;
  const uint8_t* s_base = g.row + 2LL * a.I * qb;
  const XT* x = static_cast<const XT*>(a.x);
  for (int mb = 0; mb < g.n_match; mb += MAXM) {
    const int nm = min(MAXM, g.n_match - mb);
    __syncthreads();                                   // s_x free (previous batch used)
    stage(s_x, nm, K, [&](int m, int c) {
      return load4_act<XT>(x + static_cast<int64_t>(g.match[mb + m] / a.k) * a.H, c);
    });
    __syncthreads();
#pragma unroll 1
    for (int t = blockIdx.x * kW13Tile + warp; t < a.I; t += gridDim.x * kW13Tile) {
     for (int o = 0; o < kW13OutsPerWarp; ++o) {
      const int i = t + o * kWarps;
      if (i >= a.I) break;                             // warp-uniform; no barriers below
      float acc[2][MAXM];                              // [gate, up] rows i and I + i
      rows_dot<CODEC, 2, 4, MAXM>(q_base + i * qb, static_cast<int64_t>(a.I) * qb,
                                  s_base + static_cast<int64_t>(i) * (K / 32),
                                  static_cast<int64_t>(a.I) * (K / 32), nb, s_x, nm, lane, acc);
      if (lane == 0) {
#pragma unroll
        for (int m = 0; m < MAXM; ++m) {
          if (m < nm) {
            const float gate = acc[0][m], up = acc[1][m];
            a.h[static_cast<int64_t>(g.match[mb + m]) * a.I + i] = gate / (1.f + __expf(-gate)) * up;
          }
        }
      }
     }
    }
  }
}

// h[p, i] = silu(gate_i . x_t) * (up_i . x_t) for every pair p of the block's expert.
template <typename XT, int MAXM>
__global__ void __launch_bounds__(kThreads, 2) moe_w13_silu_kernel(MoeDecodeArgs a) {
  __shared__ Group g;
  if (!collect_group(a, blockIdx.y, g)) return;       // block-uniform
  float* s_x = dynamic_smem();
  if (g.codec == kFp4) w13_body<kFp4, XT, MAXM>(a, g, s_x);
  else w13_body<kBase2, XT, MAXM>(a, g, s_x);
}

template <int CODEC, int MAXM>
__device__ __forceinline__ void w2_body(const MoeDecodeArgs& a, const Group& g, float* s_x) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int K = a.I, nb = K / kBlk;
  const int64_t w13_bytes = 2LL * a.I * (q_bytes_per_row(CODEC, a.H) + a.H / 32);
  const int64_t qb = q_bytes_per_row(CODEC, K);
  const uint8_t* q_base = g.row + w13_bytes;
  const uint8_t* s_base = q_base + static_cast<int64_t>(a.H) * qb;
  constexpr int kRows = kW2Rows<MAXM>, kTile = kWarps * kRows;
  for (int mb = 0; mb < g.n_match; mb += MAXM) {
    const int nm = min(MAXM, g.n_match - mb);
    __syncthreads();
    stage(s_x, nm, K, [&](int m, int c) {
      return *reinterpret_cast<const float4*>(a.h + static_cast<int64_t>(g.match[mb + m]) * a.I + c);
    });
    __syncthreads();
#pragma unroll 1
    for (int n0 = (blockIdx.x * kWarps + warp) * kRows; n0 < a.H; n0 += gridDim.x * kTile) {
      // H % 32 == 0 and kRows divides 32: all the warp's rows are valid
      float acc[kRows][MAXM];
      rows_dot<CODEC, kRows, 8 / kRows, MAXM>(q_base + n0 * qb, qb, s_base + static_cast<int64_t>(n0) * (K / 32),
                                               K / 32, nb, s_x, nm, lane, acc);
      if (lane < kRows) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          if (r == lane) {
#pragma unroll
            for (int m = 0; m < MAXM; ++m)
              if (m < nm) a.y[static_cast<int64_t>(g.match[mb + m]) * a.H + n0 + r] = acc[r][m];
          }
        }
      }
    }
  }
}

// y[p, n] = w2_n . h[p] for every pair p of the block's expert.
template <int MAXM>
__global__ void __launch_bounds__(kThreads, 2) moe_w2_kernel(MoeDecodeArgs a) {
  __shared__ Group g;
  if (!collect_group(a, blockIdx.y, g)) return;
  float* s_x = dynamic_smem();
  if (g.codec == kFp4) w2_body<kFp4, MAXM>(a, g, s_x);
  else w2_body<kBase2, MAXM>(a, g, s_x);
}

// out[t, n] = sum_k w[t,k] * y[t*k+k, n] over pairs with a valid expert id (fixed order).
template <typename XT>
__global__ void moe_combine_kernel(MoeDecodeArgs a) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= a.T * a.H) return;
  const int t = idx / a.H, n = idx - t * a.H;
  float sum = 0.f;
  for (int kk = 0; kk < a.k; ++kk) {
    const int p = t * a.k + kk;
    const int e = a.topk_ids[p];
    if (e >= 0 && e < a.E) sum = fmaf(a.topk_w[p], a.y[static_cast<int64_t>(p) * a.H + n], sum);
  }
  static_cast<XT*>(a.out)[idx] = from_float<XT>(sum);
}

// Pairs staged per pass (the kernels' MAXM): a pass re-reads the expert (mostly from L2),
// so size it to the usual pairs per expert, which is at most T for distinct ids per token.
inline int max_match_for(int T) { return T <= 1 ? 1 : T == 2 ? 2 : 4; }
inline size_t smem_bytes(int max_match, int K) {
  return static_cast<size_t>(max_match) * (K / kBlk) * kBlkPitch * sizeof(float);
}

}  // namespace
}  // namespace tierstore
