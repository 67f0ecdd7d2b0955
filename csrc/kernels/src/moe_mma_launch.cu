// Host side of the tensor-core grouped path (moe_mma.cuh): checks, module load, and the
// four launches on the caller's stream. Every grid is fixed by (T, k, E, H, I, dtype);
// the data-dependent part (which tiles exist) is read by the kernels on the device.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "moe_host.hpp"
#include "moe_mma.cuh"
#include "moe_route.cuh"

namespace tierstore {
namespace {

using namespace moe_host;

template <int NT8>
constexpr size_t red_bytes() { return static_cast<size_t>(kWarps) * 8 * NT8 * 32 * sizeof(float); }

template <int NS1, int NS2, int NT8>
void launch_gemms(const MoeDecodeArgs& a, const MmaPlan& pl, cudaStream_t st) {
  moe_mma_kernel<true, NS1, NT8, NS2><<<dim3(a.I / 16, pl.tmax), kThreads, red_bytes<NT8>(), st>>>(a, pl);
  check_launch("moe_mma_kernel<w13>");
  moe_mma_kernel<false, NS2, NT8, 1><<<dim3(a.H / 32, pl.tmax), kThreads, red_bytes<NT8>(), st>>>(a, pl);
  check_launch("moe_mma_kernel<w2>");
}

template <typename XT, int NS1, int NS2>
void launch_all(const MoeDecodeArgs& a, const MmaPlan& pl, int nt8, cudaStream_t st) {
  const int64_t work = static_cast<int64_t>(a.T) * a.H;
  const unsigned prep = static_cast<unsigned>(std::clamp<int64_t>((work + 4 * kThreads - 1) / (4 * kThreads), 1, 1024));
  const size_t route_smem = (2 * static_cast<size_t>(a.E) + 2 * kThreads) * sizeof(int);
  moe_mma_route_kernel<XT, NS1><<<1 + prep, kThreads, route_smem, st>>>(a, pl);
  check_launch("moe_mma_route_kernel");
  if (nt8 == 1) launch_gemms<NS1, NS2, 1>(a, pl, st);
  else if (nt8 == 2) launch_gemms<NS1, NS2, 2>(a, pl, st);
  else launch_gemms<NS1, NS2, 4>(a, pl, st);
  moe_mma_combine_kernel<XT><<<static_cast<unsigned>((work + 255) / 256), 256, 0, st>>>(a, pl);
  check_launch("moe_mma_combine_kernel");
}

template <typename Kernel>
void load(Kernel kernel, const char* name) {
  cudaFuncAttributes attr;
  check_cuda(cudaFuncGetAttributes(&attr, kernel), name);
}

template <int NS1, int NS2, int NT8>
void load_gemms() {
  load(moe_mma_kernel<true, NS1, NT8, NS2>, "load moe_mma_kernel<w13>");
  load(moe_mma_kernel<false, NS2, NT8, 1>, "load moe_mma_kernel<w2>");
}

}  // namespace

void moe_mma(const MoeDecodeArgs& a) {
  check_common_args(a);
  expect(a.E <= kMoeMmaMaxExperts, "E=" + std::to_string(a.E) + ", the grouped kernel takes E <= " +
                                       std::to_string(kMoeMmaMaxExperts));
  expect(static_cast<int64_t>(a.T) * a.k <= (1 << 20), "T*k=" + std::to_string(int64_t{a.T} * a.k) + " > 2^20 pairs");
  const MoeMmaLayout l = moe_mma_layout(a.T, a.k, a.E, a.H, a.I, a.dtype);
  expect(l.tmax <= 65535, "T*k=" + std::to_string(int64_t{a.T} * a.k) + " needs " + std::to_string(l.tmax) +
                              " tiles, more than a grid column holds (65535)");
  expect(a.workspace && aligned(a.workspace, 256) && a.workspace_bytes >= l.total,
         "workspace must be 256-byte aligned and >= " + std::to_string(l.total) + " bytes, got " +
             std::to_string(a.workspace_bytes));
  use_device(a.device);
  const MmaPlan pl = make_plan(a, l);
  cudaStream_t st = reinterpret_cast<cudaStream_t>(a.stream);
  if (a.dtype == MoeActDtype::bf16) launch_all<__nv_bfloat16, 1, 2>(a, pl, l.nt8, st);
  else launch_all<float, 3, 3>(a, pl, l.nt8, st);
}

void moe_mma_prepare(int device) {
  use_device(device);
  load(moe_mma_route_kernel<float, 3>, "load moe_mma_route_kernel<f32>");
  load(moe_mma_route_kernel<__nv_bfloat16, 1>, "load moe_mma_route_kernel<bf16>");
  load_gemms<1, 2, 1>(); load_gemms<1, 2, 2>(); load_gemms<1, 2, 4>();
  load_gemms<3, 3, 1>(); load_gemms<3, 3, 2>(); load_gemms<3, 3, 4>();
  load(moe_mma_combine_kernel<float>, "load moe_mma_combine_kernel<f32>");
  load(moe_mma_combine_kernel<__nv_bfloat16>, "load moe_mma_combine_kernel<bf16>");
}

}  // namespace tierstore
