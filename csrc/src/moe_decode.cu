// Slot-aware fused-MoE decode kernels (see include/tierstore/moe.hpp for the contract).
//
// Shape of the work: Hopper has no FP4 tensor cores and decode has <= 16 tokens, so
// this is a memory-bound grouped GEMV. Grid = (output-row tiles, routed pairs). The
// block of the FIRST pair routed to an expert (its "leader") does that expert's work
// for every pair routed to it; the other pairs' blocks exit at once, so each expert's
// bytes are read once. Inside a block each warp owns output rows; a lane reads 32
// consecutive K elements per row per chunk (16 bytes of e2m1, or 8 bytes of 2-bit codes,
// and their e8m0 block-32 scale byte), dequantises them in registers and dots them
// with the activations staged in shared memory (float, padded so the float4 reads of
// a quarter-warp hit distinct banks). The next chunk's weights are fetched before the
// current one is used, to keep two loads per row in flight.
#ifndef TS_MOE_CPU_EMULATION   // csrc/tests/moe_cpu_emulation.cpp runs the kernels on threads
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#endif

#include <stdexcept>
#include <string>

#include "tierstore/moe.hpp"

namespace tierstore {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kLaneElems = 32;                      // K elements per lane per chunk (one scale block)
constexpr int kChunk = 32 * kLaneElems;             // K elements staged per pass: 1024
constexpr int kLanePitch = kLaneElems + 4;          // +4 pad: conflict-free float4 reads
constexpr int kMatchPitch = 32 * kLanePitch;        // floats per staged activation row
constexpr int kMaxMatch = 8;                        // pairs served per read of an expert
constexpr int kMaxPairs = kMoeDecodeMaxTokens * kMoeDecodeMaxTopK;

enum Codec : int { kFp4 = 0, kBase2 = 1 };

struct Group {                 // what the block's leader pair resolved (shared memory)
  int n_match;                 // pairs routed to this expert; 0 = not a leader, no work
  int codec;
  const uint8_t* row;          // start of the expert's row (pool slot or base row)
  int match[kMaxPairs];        // the pair indices, ascending
};

struct Luts {
  float e2m1[16];
  float base2[4];
};

__device__ __forceinline__ float e8m0_to_float(uint32_t s) {
  // 2^(s-127); s = 0 is the subnormal 2^-127. s = 255 (NaN) is never written.
  return s == 0 ? __int_as_float(0x00400000) : __int_as_float(static_cast<int>(s << 23));
}

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

__device__ void init_luts(Luts& l) {
  const float mags[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  if (threadIdx.x < 16) l.e2m1[threadIdx.x] = threadIdx.x < 8 ? mags[threadIdx.x] : -mags[threadIdx.x - 8];
  if (threadIdx.x < 4) l.base2[threadIdx.x] = (threadIdx.x == 0 ? -4.f : threadIdx.x == 1 ? -1.f
                                               : threadIdx.x == 2 ? 1.f : 4.f);
}

// Thread 0 decides whether pair p leads its expert and, if so, gathers every pair of
// that expert and resolves the row pointer through the slot table. Ends in a barrier.
__device__ void collect_group(const MoeDecodeArgs& a, int p, Group& g) {
  if (threadIdx.x == 0) {
    const int n_pairs = a.T * a.k;
    const int e = a.topk_ids[p];
    bool leader = e >= 0 && e < a.E;
    for (int q = 0; leader && q < p; ++q) leader = a.topk_ids[q] != e;
    int n = 0;
    if (leader) {
      for (int q = p; q < n_pairs; ++q)
        if (a.topk_ids[q] == e) g.match[n++] = q;
      const int slot = a.slot_row[e];
      if (slot >= 0 && slot < a.n_slots) {
        g.codec = kFp4;
        g.row = a.pool + static_cast<int64_t>(slot) * a.pool_slot_bytes;
      } else {
        g.codec = kBase2;
        g.row = a.base_rows + static_cast<int64_t>(e) * a.base_slot_bytes;
      }
    }
    g.n_match = n;
  }
  __syncthreads();
}

// Section geometry of one matrix [N, K] inside an expert row.
__device__ __forceinline__ int64_t q_bytes_per_row(int codec, int K) {
  return codec == kFp4 ? K / 2 : K / 4;
}

template <int R>
__device__ __forceinline__ void fetch(int codec, const uint8_t* const (&qrow)[R],
                                      const uint8_t* const (&srow)[R], int k0, int lane,
                                      uint4 (&q)[R], uint32_t (&s)[R]) {
  const int e0 = k0 + lane * kLaneElems;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (codec == kFp4) {                  // 32 e2m1 = 16 bytes, 16-byte aligned
      q[r] = __ldg(reinterpret_cast<const uint4*>(qrow[r] + e0 / 2));
    } else {                              // 32 2-bit codes = 8 bytes, 8-byte aligned
      const uint2 c = __ldg(reinterpret_cast<const uint2*>(qrow[r] + e0 / 4));
      q[r] = make_uint4(c.x, c.y, 0u, 0u);
    }
    s[r] = __ldg(srow[r] + e0 / 32);
  }
}

template <int R>
__device__ __forceinline__ void accumulate(int codec, const float* s_x, int nm, int lane,
                                           const uint4 (&q)[R], const uint32_t (&s)[R],
                                           const Luts& luts, float (&acc)[R][kMaxMatch]) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float v[kLaneElems];
    if (codec == kFp4) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {       // element j of word w is nibble j (low first)
        v[j] = luts.e2m1[(q[r].x >> (4 * j)) & 15u];
        v[8 + j] = luts.e2m1[(q[r].y >> (4 * j)) & 15u];
        v[16 + j] = luts.e2m1[(q[r].z >> (4 * j)) & 15u];
        v[24 + j] = luts.e2m1[(q[r].w >> (4 * j)) & 15u];
      }
    } else {
#pragma unroll
      for (int j = 0; j < 16; ++j) {      // element j of word w is bits 2j..2j+1
        v[j] = luts.base2[(q[r].x >> (2 * j)) & 3u];
        v[16 + j] = luts.base2[(q[r].y >> (2 * j)) & 3u];
      }
    }
    const float scale = e8m0_to_float(s[r]);
#pragma unroll
    for (int m = 0; m < kMaxMatch; ++m) {
      if (m < nm) {
        const float4* xs = reinterpret_cast<const float4*>(s_x + m * kMatchPitch + lane * kLanePitch);
        float dot = 0.f;
#pragma unroll
        for (int c = 0; c < kLaneElems / 4; ++c) {
          const float4 xv = xs[c];
          dot = fmaf(v[4 * c + 0], xv.x, dot);
          dot = fmaf(v[4 * c + 1], xv.y, dot);
          dot = fmaf(v[4 * c + 2], xv.z, dot);
          dot = fmaf(v[4 * c + 3], xv.w, dot);
        }
        acc[r][m] = fmaf(dot, scale, acc[r][m]);
      }
    }
  }
}

// Stage activation rows (nm of them, elements [k0, k0+kc)) into the padded layout.
template <typename Load>
__device__ __forceinline__ void stage(float* s_x, int nm, int kc, Load load) {
  for (int idx = threadIdx.x; idx < nm * kc; idx += kThreads) {
    const int m = idx / kc, c = idx - m * kc;
    s_x[m * kMatchPitch + (c / kLaneElems) * kLanePitch + (c % kLaneElems)] = load(m, c);
  }
}

// acc[r][m] = row r of W ([*, K], starting at qrow/srow) . activation(m), over all K.
// Every thread of the block must call it (it holds barriers).
template <int R, typename Load>
__device__ void gemv_rows(int codec, const uint8_t* const (&qrow)[R], const uint8_t* const (&srow)[R],
                          int K, int nm, float* s_x, const Luts& luts, Load load,
                          float (&acc)[R][kMaxMatch]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < kMaxMatch; ++m) acc[r][m] = 0.f;
  uint4 q[R], qn[R];
  uint32_t s[R], sn[R];
  if (lane * kLaneElems < K) fetch<R>(codec, qrow, srow, 0, lane, q, s);
  for (int k0 = 0; k0 < K; k0 += kChunk) {
    const int kc = min(kChunk, K - k0);
    __syncthreads();                                   // s_x free (previous chunk used)
    stage(s_x, nm, kc, [&](int m, int c) { return load(m, k0 + c); });
    __syncthreads();
    const int k1 = k0 + kChunk;
    const bool next_on = k1 < K && lane * kLaneElems < K - k1;
    if (next_on) fetch<R>(codec, qrow, srow, k1, lane, qn, sn);   // in flight during the math
    if (lane * kLaneElems < kc) accumulate<R>(codec, s_x, nm, lane, q, s, luts, acc);
    if (next_on) {
#pragma unroll
      for (int r = 0; r < R; ++r) { q[r] = qn[r]; s[r] = sn[r]; }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < kMaxMatch; ++m)
      if (m < nm)
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], off);
}

// h[p, i] = silu(gate_i . x_t) * (up_i . x_t) for every pair p of the block's expert.
template <typename XT>
__global__ void __launch_bounds__(kThreads) moe_w13_silu_kernel(MoeDecodeArgs a) {
  __shared__ __align__(16) float s_x[kMaxMatch * kMatchPitch];
  __shared__ Group g;
  __shared__ Luts luts;
  init_luts(luts);
  collect_group(a, blockIdx.y, g);
  if (g.n_match == 0) return;                         // block-uniform
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int i = blockIdx.x * kWarps + warp;
  const int ic = i < a.I ? i : 0;                     // idle warps still join the barriers
  const int K = a.H;
  const int64_t qb = q_bytes_per_row(g.codec, K);
  const uint8_t* q0 = g.row;
  const uint8_t* s0 = g.row + 2LL * a.I * qb;
  const uint8_t* const qrow[2] = {q0 + ic * qb, q0 + (static_cast<int64_t>(a.I) + ic) * qb};
  const uint8_t* const srow[2] = {s0 + static_cast<int64_t>(ic) * (K / 32),
                                  s0 + (static_cast<int64_t>(a.I) + ic) * (K / 32)};
  const XT* x = static_cast<const XT*>(a.x);
  for (int mb = 0; mb < g.n_match; mb += kMaxMatch) {
    const int nm = min(kMaxMatch, g.n_match - mb);
    float acc[2][kMaxMatch];
    gemv_rows<2>(g.codec, qrow, srow, K, nm, s_x, luts,
                 [&](int m, int c) {
                   const int t = g.match[mb + m] / a.k;
                   return to_float(x[static_cast<int64_t>(t) * a.H + c]);
                 }, acc);
    if (lane == 0 && i < a.I) {
#pragma unroll
      for (int m = 0; m < kMaxMatch; ++m) {
        if (m < nm) {
          const float gate = acc[0][m], up = acc[1][m];
          a.h[static_cast<int64_t>(g.match[mb + m]) * a.I + i] = gate / (1.f + __expf(-gate)) * up;
        }
      }
    }
  }
}

// y[p, n] = w2_n . h[p] for every pair p of the block's expert.
__global__ void __launch_bounds__(kThreads) moe_w2_kernel(MoeDecodeArgs a) {
  __shared__ __align__(16) float s_x[kMaxMatch * kMatchPitch];
  __shared__ Group g;
  __shared__ Luts luts;
  init_luts(luts);
  collect_group(a, blockIdx.y, g);
  if (g.n_match == 0) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n = blockIdx.x * kWarps + warp;
  const int nc = n < a.H ? n : 0;
  const int K = a.I;
  const int64_t w13_bytes = 2LL * a.I * (q_bytes_per_row(g.codec, a.H) + a.H / 32);
  const int64_t qb = q_bytes_per_row(g.codec, K);
  const uint8_t* q0 = g.row + w13_bytes;
  const uint8_t* s0 = q0 + static_cast<int64_t>(a.H) * qb;
  const uint8_t* const qrow[1] = {q0 + nc * qb};
  const uint8_t* const srow[1] = {s0 + static_cast<int64_t>(nc) * (K / 32)};
  for (int mb = 0; mb < g.n_match; mb += kMaxMatch) {
    const int nm = min(kMaxMatch, g.n_match - mb);
    float acc[1][kMaxMatch];
    gemv_rows<1>(g.codec, qrow, srow, K, nm, s_x, luts,
                 [&](int m, int c) { return a.h[static_cast<int64_t>(g.match[mb + m]) * a.I + c]; },
                 acc);
    if (lane == 0 && n < a.H) {
#pragma unroll
      for (int m = 0; m < kMaxMatch; ++m)
        if (m < nm) a.y[static_cast<int64_t>(g.match[mb + m]) * a.H + n] = acc[0][m];
    }
  }
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

#ifndef TS_MOE_CPU_EMULATION
void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("moe_decode: launch of ") + kernel + " failed: " +
                             cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(std::string("moe_decode: ") + what + ": " + cudaGetErrorName(err) +
                             " (" + cudaGetErrorString(err) + ")");
  }
}

void expect(bool ok, const std::string& msg) {
  if (!ok) throw std::invalid_argument("moe_decode: " + msg);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

void use_device(int device) {
  int cur = -1;
  check_cuda(cudaGetDevice(&cur), "cudaGetDevice");
  if (cur != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
}

template <typename XT>
void launch_all(const MoeDecodeArgs& a, cudaStream_t st) {
  const int n_pairs = a.T * a.k;
  moe_w13_silu_kernel<XT><<<dim3((a.I + kWarps - 1) / kWarps, n_pairs), kThreads, 0, st>>>(a);
  check_launch("moe_w13_silu_kernel");
  moe_w2_kernel<<<dim3((a.H + kWarps - 1) / kWarps, n_pairs), kThreads, 0, st>>>(a);
  check_launch("moe_w2_kernel");
  moe_combine_kernel<XT><<<(a.T * a.H + 255) / 256, 256, 0, st>>>(a);
  check_launch("moe_combine_kernel");
}

#endif  // TS_MOE_CPU_EMULATION

}  // namespace

#ifndef TS_MOE_CPU_EMULATION
void moe_decode(const MoeDecodeArgs& a) {
  // 1. arguments (cheap host checks; nothing is read from the device)
  expect(a.T >= 1 && a.T <= kMoeDecodeMaxTokens, "T=" + std::to_string(a.T) + ", expected 1..16");
  expect(a.k >= 1 && a.k <= kMoeDecodeMaxTopK, "k=" + std::to_string(a.k) + ", expected 1..16");
  expect(a.E >= 1, "E=" + std::to_string(a.E) + ", expected >= 1");
  expect(a.H > 0 && a.I > 0 && a.H % 32 == 0 && a.I % 32 == 0,
         "H=" + std::to_string(a.H) + ", I=" + std::to_string(a.I) + ": both must be positive multiples of 32");
  expect(a.dtype == MoeActDtype::f32 || a.dtype == MoeActDtype::bf16, "x dtype must be f32 or bf16");
  expect(a.x && a.out && a.topk_ids && a.topk_w && a.slot_row && a.base_rows && a.h && a.y,
         "a required pointer is null");
  const int64_t fp4_row = 2LL * a.I * (a.H / 2 + a.H / 32) + static_cast<int64_t>(a.H) * (a.I / 2 + a.I / 32);
  const int64_t base_row = 2LL * a.I * (a.H / 4 + a.H / 32) + static_cast<int64_t>(a.H) * (a.I / 4 + a.I / 32);
  expect(a.n_slots >= 0 && (a.n_slots == 0 || a.pool), "pool is null with n_slots > 0");
  expect(a.n_slots == 0 || (a.pool_slot_bytes >= fp4_row && a.pool_slot_bytes % 16 == 0 && aligned16(a.pool)),
         "pool slot_bytes " + std::to_string(a.pool_slot_bytes) + " must be >= " + std::to_string(fp4_row) +
             " (fp4 row) and a multiple of 16, with a 16-byte aligned base");
  expect(a.base_slot_bytes >= base_row && a.base_slot_bytes % 16 == 0 && aligned16(a.base_rows),
         "base slot_bytes " + std::to_string(a.base_slot_bytes) + " must be >= " + std::to_string(base_row) +
             " (base row) and a multiple of 16, with a 16-byte aligned base");
  // 2. launch on the caller's stream
  use_device(a.device);
  cudaStream_t st = reinterpret_cast<cudaStream_t>(a.stream);
  if (a.dtype == MoeActDtype::bf16) launch_all<__nv_bfloat16>(a, st);
  else launch_all<float>(a, st);
}

void moe_decode_prepare(int device) {
  use_device(device);
  cudaFuncAttributes attr;
  check_cuda(cudaFuncGetAttributes(&attr, moe_w13_silu_kernel<float>), "load moe_w13_silu_kernel<f32>");
  check_cuda(cudaFuncGetAttributes(&attr, moe_w13_silu_kernel<__nv_bfloat16>), "load moe_w13_silu_kernel<bf16>");
  check_cuda(cudaFuncGetAttributes(&attr, moe_w2_kernel), "load moe_w2_kernel");
  check_cuda(cudaFuncGetAttributes(&attr, moe_combine_kernel<float>), "load moe_combine_kernel<f32>");
  check_cuda(cudaFuncGetAttributes(&attr, moe_combine_kernel<__nv_bfloat16>), "load moe_combine_kernel<bf16>");
}

#endif  // TS_MOE_CPU_EMULATION

}  // namespace tierstore
