// Pieces of the tensor-core grouped path shared by its kernels (moe_mma.cuh: the
// GEMMs; moe_route.cuh: grouping, staging, combine): the workspace views, the K order
// of the mma fragments, bf16 terms.
#pragma once
#include "moe_device.cuh"

namespace tierstore {
namespace {

// Device views of the workspace (moe_mma_layout).
struct MmaPlan {
  int nt = 8, tmax = 0;
  int32_t* tiles = nullptr;    // expert [tmax], first sorted position [tmax], count [tmax], n_tiles
  int32_t* sorted = nullptr;   // [P] pair ids grouped by expert
  int32_t* pos = nullptr;      // [P] sorted position of each pair, -1 for an invalid id
  uint16_t* xb = nullptr;      // bf16 [T][ns1][H], fragment K order
  uint16_t* hb = nullptr;      // bf16 [P][ns2][I], fragment K order, by sorted position
  float* y = nullptr;          // [P][H] by sorted position
};

inline MmaPlan make_plan(const MoeDecodeArgs& a, const MoeMmaLayout& l) {
  auto* base = static_cast<uint8_t*>(a.workspace);
  MmaPlan p;
  p.nt = 8 * l.nt8;
  p.tmax = l.tmax;
  p.tiles = reinterpret_cast<int32_t*>(base + l.off_tiles);
  p.sorted = reinterpret_cast<int32_t*>(base + l.off_sorted);
  p.pos = reinterpret_cast<int32_t*>(base + l.off_pos);
  p.xb = reinterpret_cast<uint16_t*>(base + l.off_xb);
  p.hb = reinterpret_cast<uint16_t*>(base + l.off_hb);
  p.y = reinterpret_cast<float*>(base + l.off_y);
  return p;
}

__device__ __forceinline__ int elem_of_pos(int q) {
  const int p = q >> 1;
  return 8 * (p >> 2) + (p & 3) + 4 * (q & 1);
}
__device__ __forceinline__ int pos_of_elem(int e) {
  const int r = e & 7;
  return 2 * (4 * (e >> 3) + (r & 3)) + (r >> 2);
}

__device__ __forceinline__ uint32_t bf16_bits(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}
__device__ __forceinline__ float bf16_value(uint32_t b) { return __int_as_float(static_cast<int>(b << 16)); }

// v as NS bf16 terms, largest first (1: bf16 rounding; 2: ~16 bits; 3: all 24 bits of f32).
template <int NS>
__device__ __forceinline__ void split_terms(float v, uint32_t (&o)[NS]) {
#pragma unroll
  for (int s = 0; s < NS; ++s) {
    o[s] = bf16_bits(v);
    v -= bf16_value(o[s]);
  }
}

__device__ __forceinline__ float act_value(const float* p) { return *p; }
__device__ __forceinline__ float act_value(const __nv_bfloat16* p) { return __bfloat162float(*p); }

}  // namespace
}  // namespace tierstore
