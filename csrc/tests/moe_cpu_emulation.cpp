// Runs the MoE decode kernels of csrc/src/moe_decode.cu on the CPU, unchanged, to check
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

#include <functional>
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
#define __launch_bounds__(n)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct dim3 { unsigned x = 0, y = 0, z = 0; };
// CUDA's alignments, so the checks below catch a misaligned vector access
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(16) float4 { float x, y, z, w; };
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
dim3 threadIdx, blockIdx, blockDim;   // threadIdx is switched with the fiber

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
  const unsigned tiles_i = (I + kWarps - 1) / kWarps, tiles_h = (H + kWarps - 1) / kWarps;
  const unsigned combine_blocks = (T * H + 255) / 256;
  if (dtype == 1) launch({tiles_i, n_pairs, 1}, kThreads, [&] { moe_w13_silu_kernel<__nv_bfloat16>(a); });
  else launch({tiles_i, n_pairs, 1}, kThreads, [&] { moe_w13_silu_kernel<float>(a); });
  launch({tiles_h, n_pairs, 1}, kThreads, [&] { moe_w2_kernel(a); });
  if (dtype == 1) launch({combine_blocks, 1, 1}, 256, [&] { moe_combine_kernel<__nv_bfloat16>(a); });
  else launch({combine_blocks, 1, 1}, 256, [&] { moe_combine_kernel<float>(a); });

  std::ofstream f(dir + "/out.bin", std::ios::binary);
  f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
  return f ? 0 : 1;
}
