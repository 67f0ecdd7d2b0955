// Runs the MoE decode kernels of csrc/kernels/src/moe_decode.cu on the CPU, unchanged, to check
// their indexing and synchronisation on a machine with no GPU. Each CUDA thread of a
// block is a fiber (ucontext) on one OS thread, switched only at barriers (cheap, and
// deterministic); __syncthreads is a barrier over the block's fibers, a warp shuffle is
// an exchange through memory between two warp barriers. Blocks run one after another,
// so `__shared__` can be a function-local static. Not part of the build:
// tests/test_moe_emulation.py compiles it with g++ -std=c++20 and compares the result
// with the fp64 torch reference.
//
// usage: moe_cpu_emulation DIR   (DIR holds meta.txt and the .bin inputs; writes out.bin)
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

// ---- CUDA surface used by the kernels --------------------------------------------
#define TS_MOE_CPU_EMULATION 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct dim3 { unsigned x = 0, y = 0, z = 0; };
// CUDA's alignments, so the checks below catch a misaligned vector access
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(16) float4 { float x, y, z, w; };
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
struct alignas(8) float2 { float x, y; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {   // PTX prmt, default mode
  const uint64_t src = (static_cast<uint64_t>(y) << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) {
    const unsigned sel = (s >> (4 * i)) & 7u;
    r |= static_cast<unsigned>((src >> (8 * sel)) & 0xffu) << (8 * i);
  }
  return r;
}
inline float emu_half_to_float(uint16_t h) {          // exact IEEE binary16 -> binary32
  const int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
  float v = exp == 0 ? std::ldexp(static_cast<float>(man), -24)
                     : std::ldexp(static_cast<float>(man | 1024), exp - 25);
  if (exp == 31) v = man ? NAN : INFINITY;
  return sign ? -v : v;
}
inline float2 emu_half2_bits_to_float2(unsigned h) {
  return {emu_half_to_float(static_cast<uint16_t>(h & 0xffffu)), emu_half_to_float(static_cast<uint16_t>(h >> 16))};
}
std::vector<float> emu_smem;                            // the launch's dynamic shared memory
inline float* emu_dynamic_smem() { return emu_smem.data(); }
dim3 threadIdx, blockIdx, blockDim, gridDim;   // threadIdx is switched with the fiber

template <typename T> inline T __ldg(const T* p) {
  if (reinterpret_cast<uintptr_t>(p) % alignof(T) != 0) {   // the GPU would fault here
    std::fprintf(stderr, "misaligned __ldg of %zu bytes at %p\n", sizeof(T), static_cast<const void*>(p));
    std::abort();
  }
  return *p;
}
template <typename T> inline T min(T a, T b) { return a < b ? a : b; }
inline float __int_as_float(int v) { float f; std::memcpy(&f, &v, 4); return f; }
inline float __expf(float v) { return std::exp(v); }
using std::fmaf;

struct __nv_bfloat16 { uint16_t bits; };
inline float __bfloat162float(__nv_bfloat16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f; std::memcpy(&f, &u, 4); return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u; std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);            // round to nearest even (finite inputs)
  return {static_cast<uint16_t>(u >> 16)};
}

namespace emu {
struct Fiber {
  ucontext_t ctx;
  std::vector<char> stack;
  bool done = false;
};
std::vector<Fiber> fibers;
ucontext_t scheduler;
int current = 0;
std::function<void()> body;

void yield() { swapcontext(&fibers[current].ctx, &scheduler); }

struct Barrier {            // all `expected` fibers arrive, then all continue
  int expected = 0, count = 0;
  unsigned generation = 0;
  void arrive_and_wait() {
    const unsigned gen = generation;
    if (++count == expected) {
      count = 0;
      ++generation;
      return;
    }
    while (generation == gen) yield();
  }
};
Barrier block_barrier;
std::vector<Barrier> warp_barriers;
std::vector<float> shuffle_slots;              // one per thread

void trampoline(int tid) {
  body();
  fibers[tid].done = true;                      // then uc_link returns to the scheduler
}
}  // namespace emu

inline void __syncthreads() { emu::block_barrier.arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int off) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  emu::shuffle_slots[tid] = v;
  emu::warp_barriers[warp].arrive_and_wait();
  const float r = emu::shuffle_slots[warp * 32 + (lane ^ off)];
  emu::warp_barriers[warp].arrive_and_wait();
  return r;
}

inline bool __syncthreads_or(bool pred) {
  const int tid = threadIdx.x;
  emu::shuffle_slots[tid] = pred ? 1.f : 0.f;
  emu::block_barrier.arrive_and_wait();
  bool any = false;
  for (float v : emu::shuffle_slots) any = any || v != 0.f;
  emu::block_barrier.arrive_and_wait();
  return any;
}
inline unsigned __ballot_sync(unsigned, bool pred) {
  const int tid = threadIdx.x, warp = tid / 32;
  emu::shuffle_slots[tid] = pred ? 1.f : 0.f;
  emu::warp_barriers[warp].arrive_and_wait();
  unsigned r = 0;
  for (int l = 0; l < 32; ++l) r |= (emu::shuffle_slots[warp * 32 + l] != 0.f ? 1u : 0u) << l;
  emu::warp_barriers[warp].arrive_and_wait();
  return r;
}

#include "../src/moe_decode.cu"

// ---- launcher ---------------------------------------------------------------------
template <typename Kernel>
void launch(dim3 grid, int threads, Kernel kernel) {
  using namespace emu;
  block_barrier = Barrier{threads, 0, 0};
  warp_barriers.assign((threads + 31) / 32, Barrier{32, 0, 0});
  shuffle_slots.assign(threads, 0.f);
  fibers.resize(threads);
  body = kernel;
  blockDim = {static_cast<unsigned>(threads), 1, 1};
  gridDim = grid;
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      blockIdx = {bx, by, 0};
      for (int t = 0; t < threads; ++t) {
        Fiber& f = fibers[t];
        f.stack.resize(256 << 10);
        f.done = false;
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack.data();
        f.ctx.uc_stack.ss_size = f.stack.size();
        f.ctx.uc_link = &scheduler;
        makecontext(&f.ctx, reinterpret_cast<void (*)()>(&trampoline), 1, t);
      }
      for (int alive = threads; alive > 0;) {   // round-robin until every fiber returned
        for (int t = 0; t < threads; ++t) {
          if (fibers[t].done) continue;
          current = t;
          threadIdx = {static_cast<unsigned>(t), 0, 0};
          swapcontext(&scheduler, &fibers[t].ctx);
          if (fibers[t].done) --alive;
        }
      }
    }
}

template <typename T>
std::vector<T> read_bin(const std::string& path, size_t count) {
  std::ifstream f(path, std::ios::binary);
  std::vector<T> v(count);
  if (!f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(count * sizeof(T))))
    throw std::runtime_error(path + ": short read, expected " + std::to_string(count * sizeof(T)) + " bytes");
  return v;
}

int main(int argc, char** argv) {
  using namespace tierstore;
  if (argc != 2) { std::fprintf(stderr, "usage: %s DIR\n", argv[0]); return 2; }
  const std::string dir = argv[1];
  std::ifstream meta(dir + "/meta.txt");
  long long T, k, E, n_slots, H, I, dtype, pool_sb, base_sb;
  if (!(meta >> T >> k >> E >> n_slots >> H >> I >> dtype >> pool_sb >> base_sb)) {
    std::fprintf(stderr, "%s/meta.txt: expected 9 integers\n", dir.c_str());
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

  const unsigned n_pairs = static_cast<unsigned>(T * k);
  // half the row tiles' blocks: each block loops over up to two tiles, as on the GPU
  const int mm = max_match_for(int(T));
  const int w2_tile = kWarps * (mm >= 4 ? kW2Rows<4> : kW2Rows<1>);
  const unsigned tiles_i = (I + 2 * kW13Tile - 1) / (2 * kW13Tile), tiles_h = (H + 2 * w2_tile - 1) / (2 * w2_tile);
  const unsigned combine_blocks = (T * H + 255) / 256;
  // NaN-poisoned like uninitialised shared memory could be; sized as the launcher does
  emu_smem.assign(smem_bytes(mm, int(std::max(H, I))) / sizeof(float), NAN);
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
  if (dtype == 1) run(__nv_bfloat16{});
  else run(float{});
  if (dtype == 1) launch({combine_blocks, 1, 1}, 256, [&] { moe_combine_kernel<__nv_bfloat16>(a); });
  else launch({combine_blocks, 1, 1}, 256, [&] { moe_combine_kernel<float>(a); });

  std::ofstream f(dir + "/out.bin", std::ios::binary);
  f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
  return f ? 0 : 1;
}
