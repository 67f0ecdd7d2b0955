// Device helpers shared by the MoE kernel families (moe_gemv.cuh: v2 FFMA decode,
// moe_mma.cuh: tensor-core grouped path). Compiled by nvcc, and by g++ in the CPU
// emulator (csrc/kernels/tests), which defines TS_MOE_CPU_EMULATION and shims the CUDA
// intrinsics used here.
#pragma once
#ifndef TS_MOE_CPU_EMULATION
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#endif

#include <cstdint>

#include "tierstore/kernels/moe.hpp"

namespace tierstore {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kBlk = 32;                            // K elements per e8m0 scale block

enum Codec : int { kFp4 = 0, kBase2 = 1 };

__device__ __forceinline__ float e8m0_to_float(uint32_t s) {
  // 2^(s-127); s = 0 is the subnormal 2^-127. s = 255 (NaN) is never written.
  return s == 0 ? __int_as_float(0x00400000) : __int_as_float(static_cast<int>(s << 23));
}

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

__device__ __forceinline__ float* dynamic_smem() {
#ifdef TS_MOE_CPU_EMULATION
  return emu_dynamic_smem();
#else
  extern __shared__ float4 ts_moe_dyn_smem[];
  return reinterpret_cast<float*>(ts_moe_dyn_smem);
#endif
}

// One expert's row and codec, resolved through the slot table (pool slot -> fp4 row,
// else the 2-bit base row).
struct ExpertRow {
  const uint8_t* row;
  int codec;
};

__device__ __forceinline__ ExpertRow expert_row(const MoeDecodeArgs& a, int e) {
  const int slot = a.slot_row[e];
  if (slot >= 0 && slot < a.n_slots)
    return {a.pool + static_cast<int64_t>(slot) * a.pool_slot_bytes, kFp4};
  return {a.base_rows + static_cast<int64_t>(e) * a.base_slot_bytes, kBase2};
}

}  // namespace
}  // namespace tierstore
