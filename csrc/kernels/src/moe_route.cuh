// Grouping, staging and combine kernels of the tensor-core grouped path (contract:
// moe.hpp; the GEMMs are in moe_mma.cuh). Block 0 of the route kernel sorts the routed
// pairs by expert with shared-memory counters (two passes of atomics: counts, then
// positions) and writes the tile table; the other blocks stage x.
#pragma once
#include "moe_mma_common.cuh"

namespace tierstore {
namespace {

// Block 0: group the pairs by expert and write the tile table. Blocks >= 1: stage x.
__device__ void route_pairs(const MoeDecodeArgs& a, const MmaPlan& pl) {
  int* cnt = reinterpret_cast<int*>(dynamic_smem());
  int* off = cnt + a.E;
  int* part = off + a.E;                                 // [2 * kThreads]
  const int tid = threadIdx.x, P = a.T * a.k, E = a.E, nt = pl.nt;
  for (int e = tid; e < E; e += kThreads) cnt[e] = 0;
  __syncthreads();
  for (int p = tid; p < P; p += kThreads) {
    const int e = a.topk_ids[p];
    if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  // exclusive scans of pairs and tiles per expert: a segment per thread, then the partials
  const int seg = (E + kThreads - 1) / kThreads, lo = min(E, tid * seg), hi = min(E, lo + seg);
  int np = 0, ntl = 0;
  for (int e = lo; e < hi; ++e) {
    np += cnt[e];
    ntl += (cnt[e] + nt - 1) / nt;
  }
  part[tid] = np;
  part[kThreads + tid] = ntl;
  __syncthreads();
  for (int d = 1; d < kThreads; d <<= 1) {
    const int vp = tid >= d ? part[tid - d] : 0, vt = tid >= d ? part[kThreads + tid - d] : 0;
    __syncthreads();
    part[tid] += vp;
    part[kThreads + tid] += vt;
    __syncthreads();
  }
  int bp = part[tid] - np, bt = part[kThreads + tid] - ntl;
  int32_t* tile_e = pl.tiles;
  int32_t* tile_s = pl.tiles + pl.tmax;
  int32_t* tile_c = pl.tiles + 2 * pl.tmax;
  if (tid == kThreads - 1) pl.tiles[3 * pl.tmax] = part[2 * kThreads - 1];
  for (int e = lo; e < hi; ++e) {
    const int c = cnt[e];
    off[e] = bp;
    for (int j = 0; j * nt < c; ++j, ++bt) {
      tile_e[bt] = e;
      tile_s[bt] = bp + j * nt;
      tile_c[bt] = min(nt, c - j * nt);
    }
    bp += c;
  }
  __syncthreads();
  for (int e = tid; e < E; e += kThreads) cnt[e] = 0;
  __syncthreads();
  for (int p = tid; p < P; p += kThreads) {   // order inside a group is free: columns are independent
    const int e = a.topk_ids[p];
    int pos = -1;
    if (e >= 0 && e < E) {
      pos = off[e] + atomicAdd(&cnt[e], 1);
      pl.sorted[pos] = p;
    }
    pl.pos[p] = pos;
  }
}

template <typename XT, int NS>
__device__ void stage_x(const MoeDecodeArgs& a, const MmaPlan& pl) {
  const XT* x = static_cast<const XT*>(a.x);
  const int64_t total = static_cast<int64_t>(a.T) * a.H, step = static_cast<int64_t>(gridDim.x - 1) * kThreads;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x - 1) * kThreads + threadIdx.x; idx < total; idx += step) {
    const int64_t t = idx / a.H;
    const int q = static_cast<int>(idx - t * a.H);
    uint32_t o[NS];
    split_terms<NS>(act_value(x + t * a.H + (q & ~31) + elem_of_pos(q & 31)), o);
#pragma unroll
    for (int s = 0; s < NS; ++s) pl.xb[(t * NS + s) * a.H + q] = static_cast<uint16_t>(o[s]);
  }
}

template <typename XT, int NS>
__global__ void __launch_bounds__(kThreads) moe_mma_route_kernel(MoeDecodeArgs a, MmaPlan pl) {
  if (blockIdx.x == 0) route_pairs(a, pl);
  else stage_x<XT, NS>(a, pl);
}

// out[t, n] = sum_k w[t,k] * y[pos(t,k), n] over valid pairs, in k order.
template <typename XT>
__global__ void moe_mma_combine_kernel(MoeDecodeArgs a, MmaPlan pl) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(a.T) * a.H) return;
  const int t = static_cast<int>(idx / a.H), n = static_cast<int>(idx - static_cast<int64_t>(t) * a.H);
  float sum = 0.f;
  for (int kk = 0; kk < a.k; ++kk) {
    const int p = t * a.k + kk, pos = pl.pos[p];
    if (pos >= 0) sum = fmaf(a.topk_w[p], pl.y[static_cast<int64_t>(pos) * a.H + n], sum);
  }
  static_cast<XT*>(a.out)[idx] = from_float<XT>(sum);
}

}  // namespace
}  // namespace tierstore
