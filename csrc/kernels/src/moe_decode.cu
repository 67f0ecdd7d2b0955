// Host side of the v2 decode kernels (moe_gemv.cuh): argument checks, shared-memory
// opt-in, grid sizing, launches on the caller's stream.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "moe_gemv.cuh"
#include "moe_host.hpp"

namespace tierstore {
namespace {

using namespace moe_host;

constexpr int kMaxDevices = 64;
int g_smem_optin[kMaxDevices] = {};   // > 0 once the kernels' dynamic shared-memory limit is raised

template <typename Kernel>
void raise_smem(Kernel kernel, int bytes, const char* name) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), name);
}

int prepare_device(int device) {
  if (device >= 0 && device < kMaxDevices && g_smem_optin[device] > 0) return g_smem_optin[device];
  int optin = 0;
  check_cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
             "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
  const int bytes = optin - static_cast<int>(sizeof(Group));
  raise_smem(moe_w13_silu_kernel<float, 1>, bytes, "raise smem w13<f32,1>");
  raise_smem(moe_w13_silu_kernel<float, 2>, bytes, "raise smem w13<f32,2>");
  raise_smem(moe_w13_silu_kernel<float, 4>, bytes, "raise smem w13<f32,4>");
  raise_smem(moe_w13_silu_kernel<__nv_bfloat16, 1>, bytes, "raise smem w13<bf16,1>");
  raise_smem(moe_w13_silu_kernel<__nv_bfloat16, 2>, bytes, "raise smem w13<bf16,2>");
  raise_smem(moe_w13_silu_kernel<__nv_bfloat16, 4>, bytes, "raise smem w13<bf16,4>");
  raise_smem(moe_w2_kernel<1>, bytes, "raise smem w2<1>");
  raise_smem(moe_w2_kernel<2>, bytes, "raise smem w2<2>");
  raise_smem(moe_w2_kernel<4>, bytes, "raise smem w2<4>");
  if (device >= 0 && device < kMaxDevices) g_smem_optin[device] = bytes;
  return bytes;
}

// Blocks per routed pair along the rows: enough for about blocks_per_sm(T) blocks per
// multiprocessor over all pairs (each block then loops over several row tiles, so its
// setup -- grouping, slot lookup, staging -- is paid once); 0 = one tile per block.
// 2 at T < 4, 4 from T = 4 (H200 run of 2026-12-02: T=16 750 vs 832 us, T=1 49 vs 55 us;
// repeated ids leave some pairs' blocks idle, so more T wants more blocks).
// TS_MOE_BLOCKS_PER_SM overrides it (read once; for tuning runs).
int blocks_per_sm(int T) {
  static const int forced = [] {
    const char* env = std::getenv("TS_MOE_BLOCKS_PER_SM");
    return env && *env ? std::atoi(env) : -1;
  }();
  return forced >= 0 ? forced : T >= 4 ? 4 : 2;
}

unsigned row_blocks(int tiles, int T, int n_pairs, int n_sm) {
  const int per_sm = blocks_per_sm(T);
  if (per_sm <= 0) return static_cast<unsigned>(tiles);
  const int want = (per_sm * n_sm + n_pairs - 1) / n_pairs;
  return static_cast<unsigned>(std::max(1, std::min(tiles, want)));
}

template <typename XT, int MAXM>
void launch_w13(const MoeDecodeArgs& a, int n_sm, cudaStream_t st) {
  const unsigned gx = row_blocks((a.I + kW13Tile - 1) / kW13Tile, a.T, a.T * a.k, n_sm);
  moe_w13_silu_kernel<XT, MAXM><<<dim3(gx, a.T * a.k), kThreads, smem_bytes(MAXM, a.H), st>>>(a);
}

template <int MAXM>
void launch_w2(const MoeDecodeArgs& a, int n_sm, cudaStream_t st) {
  constexpr int tile = kWarps * kW2Rows<MAXM>;
  const unsigned gx = row_blocks((a.H + tile - 1) / tile, a.T, a.T * a.k, n_sm);
  moe_w2_kernel<MAXM><<<dim3(gx, a.T * a.k), kThreads, smem_bytes(MAXM, a.I), st>>>(a);
}

template <typename XT>
void launch_all(const MoeDecodeArgs& a, int max_match, int n_sm, cudaStream_t st) {
  if (max_match == 1) launch_w13<XT, 1>(a, n_sm, st);
  else if (max_match == 2) launch_w13<XT, 2>(a, n_sm, st);
  else launch_w13<XT, 4>(a, n_sm, st);
  check_launch("moe_w13_silu_kernel");
  if (max_match == 1) launch_w2<1>(a, n_sm, st);
  else if (max_match == 2) launch_w2<2>(a, n_sm, st);
  else launch_w2<4>(a, n_sm, st);
  check_launch("moe_w2_kernel");
  moe_combine_kernel<XT><<<(a.T * a.H + 255) / 256, 256, 0, st>>>(a);
  check_launch("moe_combine_kernel");
}

}  // namespace

void moe_decode(const MoeDecodeArgs& a) {
  // 1. arguments (cheap host checks; nothing is read from the device)
  check_common_args(a);
  expect(a.T <= kMoeDecodeMaxTokens, "T=" + std::to_string(a.T) + ", expected 1..16");
  expect(a.k <= kMoeDecodeMaxTopK, "k=" + std::to_string(a.k) + ", expected 1..16");
  expect(a.h && a.y && aligned(a.h, 16), "h and y scratch must be given, h 16-byte aligned");
  // 2. launch on the caller's stream
  use_device(a.device);
  const int smem_limit = prepare_device(a.device);
  int max_match = max_match_for(a.T);
  while (max_match > 1 && smem_bytes(max_match, std::max(a.H, a.I)) > static_cast<size_t>(smem_limit))
    max_match /= 2;
  expect(smem_bytes(max_match, std::max(a.H, a.I)) <= static_cast<size_t>(smem_limit),
         "H=" + std::to_string(a.H) + " needs " + std::to_string(smem_bytes(1, std::max(a.H, a.I))) +
             " bytes of shared memory per block; the device allows " + std::to_string(smem_limit));
  cudaStream_t st = reinterpret_cast<cudaStream_t>(a.stream);
  const int n_sm = sm_count(a.device);
  if (a.dtype == MoeActDtype::bf16) launch_all<__nv_bfloat16>(a, max_match, n_sm, st);
  else launch_all<float>(a, max_match, n_sm, st);
}

void moe_decode_prepare(int device) {
  use_device(device);
  prepare_device(device);     // also loads the module (attribute calls need the kernels)
  cudaFuncAttributes attr;
  check_cuda(cudaFuncGetAttributes(&attr, moe_combine_kernel<float>), "load moe_combine_kernel<f32>");
  check_cuda(cudaFuncGetAttributes(&attr, moe_combine_kernel<__nv_bfloat16>), "load moe_combine_kernel<bf16>");
}

}  // namespace tierstore
