// Host helpers shared by the two launchers (moe_decode.cu: v2 GEMV, moe_mma_launch.cu:
// tensor-core grouped path): CUDA error checks, argument checks, device attributes.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "tierstore/kernels/moe.hpp"

namespace tierstore::moe_host {

inline void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("moe: launch of ") + kernel + " failed: " +
                             cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(std::string("moe: ") + what + ": " + cudaGetErrorName(err) +
                             " (" + cudaGetErrorString(err) + ")");
  }
}

inline void expect(bool ok, const std::string& msg) {
  if (!ok) throw std::invalid_argument("moe: " + msg);
}

inline bool aligned(const void* p, uintptr_t n) { return (reinterpret_cast<uintptr_t>(p) & (n - 1)) == 0; }

inline void use_device(int device) {
  int cur = -1;
  check_cuda(cudaGetDevice(&cur), "cudaGetDevice");
  if (cur != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
}

inline int sm_count(int device) {
  constexpr int kMaxDevices = 64;
  static int cache[kMaxDevices] = {};
  if (device >= 0 && device < kMaxDevices && cache[device] > 0) return cache[device];
  int n = 0;
  check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute(MultiProcessorCount)");
  if (device >= 0 && device < kMaxDevices) cache[device] = n;
  return n;
}

// Checks every kernel family needs (shapes, dtype, pointers, row sizes, alignment).
inline void check_common_args(const MoeDecodeArgs& a) {
  expect(a.T >= 1 && a.k >= 1, "T=" + std::to_string(a.T) + ", k=" + std::to_string(a.k) + ": both must be >= 1");
  expect(a.E >= 1, "E=" + std::to_string(a.E) + ", expected >= 1");
  expect(a.H > 0 && a.I > 0 && a.H % 32 == 0 && a.I % 32 == 0,
         "H=" + std::to_string(a.H) + ", I=" + std::to_string(a.I) + ": both must be positive multiples of 32");
  expect(a.dtype == MoeActDtype::f32 || a.dtype == MoeActDtype::bf16, "x dtype must be f32 or bf16");
  expect(a.x && a.out && a.topk_ids && a.topk_w && a.slot_row && a.base_rows, "a required pointer is null");
  expect(aligned(a.x, a.dtype == MoeActDtype::f32 ? 16 : 8),
         "x must be 16-byte (f32) / 8-byte (bf16) aligned");
  const int64_t fp4_row = 2LL * a.I * (a.H / 2 + a.H / 32) + static_cast<int64_t>(a.H) * (a.I / 2 + a.I / 32);
  const int64_t base_row = 2LL * a.I * (a.H / 4 + a.H / 32) + static_cast<int64_t>(a.H) * (a.I / 4 + a.I / 32);
  expect(a.n_slots >= 0 && (a.n_slots == 0 || a.pool), "pool is null with n_slots > 0");
  expect(a.n_slots == 0 || (a.pool_slot_bytes >= fp4_row && a.pool_slot_bytes % 16 == 0 && aligned(a.pool, 16)),
         "pool slot_bytes " + std::to_string(a.pool_slot_bytes) + " must be >= " + std::to_string(fp4_row) +
             " (fp4 row) and a multiple of 16, with a 16-byte aligned base");
  expect(a.base_slot_bytes >= base_row && a.base_slot_bytes % 16 == 0 && aligned(a.base_rows, 16),
         "base slot_bytes " + std::to_string(a.base_slot_bytes) + " must be >= " + std::to_string(base_row) +
             " (base row) and a multiple of 16, with a 16-byte aligned base");
}

}  // namespace tierstore::moe_host
