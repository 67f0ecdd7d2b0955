// Runs the MoE kernels of csrc/kernels/src (moe_gemv.cuh: v2 decode GEMV; moe_mma.cuh:
// tensor-core grouped path) on the CPU, unchanged, to check their indexing, grouping and
// synchronisation on a machine with no GPU (shims: cuda_emu.hpp). Blocks run one after
// another, so `__shared__` can be a function-local static. Not part of the build:
// tests/test_moe_emulation.py compiles it with g++ -std=c++20 and compares the result
// with the fp64 torch reference.
//
// usage: moe_cpu_emulation DIR   (DIR holds meta.txt and the .bin inputs; writes out.bin)
//   meta.txt: T k E n_slots H I dtype pool_slot_bytes base_slot_bytes kernel (0 v2, 1 mma)
#include <ucontext.h>

#include <algorithm>
#include <functional>
#include <type_traits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_emu.hpp"
#include "../src/moe_gemv.cuh"
#include "../src/moe_mma.cuh"
#include "../src/moe_route.cuh"

template <typename T>
std::vector<T> read_bin(const std::string& path, size_t count) {
  std::ifstream f(path, std::ios::binary);
  std::vector<T> v(count);
  if (!f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(count * sizeof(T))))
    throw std::runtime_error(path + ": short read, expected " + std::to_string(count * sizeof(T)) + " bytes");
  return v;
}

// The v2 decode kernels, launched as moe_decode.cu does but with half the row blocks
// (each block loops over up to two tiles, as on the GPU).
void run_gemv(tierstore::MoeDecodeArgs& a) {
  using namespace tierstore;
  const unsigned n_pairs = static_cast<unsigned>(a.T * a.k);
  const int mm = max_match_for(a.T);
  const int w2_tile = kWarps * (mm >= 4 ? kW2Rows<4> : kW2Rows<1>);
  const unsigned tiles_i = (a.I + 2 * kW13Tile - 1) / (2 * kW13Tile), tiles_h = (a.H + 2 * w2_tile - 1) / (2 * w2_tile);
  const unsigned combine_blocks = (a.T * a.H + 255) / 256;
  // NaN-poisoned like uninitialised shared memory could be; sized as the launcher does
  emu_smem.assign(smem_bytes(mm, std::max(a.H, a.I)) / sizeof(float), NAN);
  auto w13 = [&](auto xt, auto mtag) {
    using XT = decltype(xt);
    constexpr int M = decltype(mtag)::value;
    launch({tiles_i, n_pairs, 1}, kThreads, [&] { moe_w13_silu_kernel<XT, M>(a); });
    launch({tiles_h, n_pairs, 1}, kThreads, [&] { moe_w2_kernel<M>(a); });
  };
  auto run = [&](auto xt) {
    if (mm == 1) w13(xt, std::integral_constant<int, 1>{});
    else if (mm == 2) w13(xt, std::integral_constant<int, 2>{});
    else w13(xt, std::integral_constant<int, 4>{});
  };
  if (a.dtype == MoeActDtype::bf16) run(__nv_bfloat16{});
  else run(float{});
  if (a.dtype == MoeActDtype::bf16) launch({combine_blocks, 1, 1}, 256, [&] { moe_combine_kernel<__nv_bfloat16>(a); });
  else launch({combine_blocks, 1, 1}, 256, [&] { moe_combine_kernel<float>(a); });

}

// The grouped tensor-core kernels, launched as moe_mma_launch.cu does (2 staging blocks:
// the grid-stride loop still covers x); the workspace is poisoned with 0xff (NaN).
void run_mma(tierstore::MoeDecodeArgs& a) {
  using namespace tierstore;
  const MoeMmaLayout l = moe_mma_layout(a.T, a.k, a.E, a.H, a.I, a.dtype);
  std::vector<uint8_t> ws(static_cast<size_t>(l.total) + 256, 0xff);
  a.workspace = ws.data() + (256 - reinterpret_cast<uintptr_t>(ws.data()) % 256) % 256;
  a.workspace_bytes = l.total;
  const MmaPlan pl = make_plan(a, l);
  const size_t red = static_cast<size_t>(kWarps) * 8 * l.nt8 * 32;
  emu_smem.assign(std::max<size_t>(red, 2 * a.E + 2 * kThreads), NAN);
  const unsigned tm = static_cast<unsigned>(l.tmax);
  auto gemms = [&](auto ns1, auto ns2, auto nt8) {
    constexpr int NS1 = decltype(ns1)::value, NS2 = decltype(ns2)::value, NT8 = decltype(nt8)::value;
    launch({static_cast<unsigned>(a.I / 16), tm, 1}, kThreads, [&] { moe_mma_kernel<true, NS1, NT8, NS2>(a, pl); });
    launch({static_cast<unsigned>(a.H / 32), tm, 1}, kThreads, [&] { moe_mma_kernel<false, NS2, NT8, 1>(a, pl); });
  };
  auto all = [&](auto xt, auto ns1, auto ns2) {
    using XT = decltype(xt);
    launch({3, 1, 1}, kThreads, [&] { moe_mma_route_kernel<XT, decltype(ns1)::value>(a, pl); });
    if (l.nt8 == 1) gemms(ns1, ns2, std::integral_constant<int, 1>{});
    else if (l.nt8 == 2) gemms(ns1, ns2, std::integral_constant<int, 2>{});
    else gemms(ns1, ns2, std::integral_constant<int, 4>{});
    launch({static_cast<unsigned>((a.T * a.H + 255) / 256), 1, 1}, 256, [&] { moe_mma_combine_kernel<XT>(a, pl); });
  };
  if (a.dtype == MoeActDtype::bf16)
    all(__nv_bfloat16{}, std::integral_constant<int, 1>{}, std::integral_constant<int, 2>{});
  else
    all(float{}, std::integral_constant<int, 3>{}, std::integral_constant<int, 3>{});
}

int main(int argc, char** argv) {
  using namespace tierstore;
  if (argc != 2) { std::fprintf(stderr, "usage: %s DIR\n", argv[0]); return 2; }
  const std::string dir = argv[1];
  std::ifstream meta(dir + "/meta.txt");
  long long T, k, E, n_slots, H, I, dtype, pool_sb, base_sb, kernel;
  if (!(meta >> T >> k >> E >> n_slots >> H >> I >> dtype >> pool_sb >> base_sb >> kernel)) {
    std::fprintf(stderr, "%s/meta.txt: expected 10 integers\n", dir.c_str());
    return 2;
  }
  const size_t xs = dtype == 1 ? 2 : 4;
  auto x = read_bin<uint8_t>(dir + "/x.bin", T * H * xs);
  auto ids = read_bin<int32_t>(dir + "/ids.bin", T * k);
  auto w = read_bin<float>(dir + "/w.bin", T * k);
  auto slots = read_bin<int32_t>(dir + "/slot.bin", E);
  auto pool = read_bin<uint8_t>(dir + "/pool.bin", n_slots * pool_sb);
  auto base = read_bin<uint8_t>(dir + "/base.bin", E * base_sb);
  std::vector<float> h(T * k * I, NAN), y(T * k * H, NAN);
  std::vector<uint8_t> out(T * H * xs, 0xff);  // poison (NaN in both dtypes)

  MoeDecodeArgs a;
  a.x = x.data(); a.out = out.data(); a.dtype = static_cast<MoeActDtype>(dtype);
  a.topk_ids = ids.data(); a.topk_w = w.data(); a.T = int(T); a.k = int(k);
  a.slot_row = slots.data(); a.E = int(E); a.n_slots = n_slots;
  a.pool = pool.data(); a.pool_slot_bytes = pool_sb;
  a.base_rows = base.data(); a.base_slot_bytes = base_sb;
  a.H = int(H); a.I = int(I); a.h = h.data(); a.y = y.data();

  if (kernel == 1) {
    run_mma(a);
  } else {
    run_gemv(a);
  }
  std::ofstream f(dir + "/out.bin", std::ios::binary);
  f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
  return f ? 0 : 1;
}

