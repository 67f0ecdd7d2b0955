// CUDA surface for running the MoE kernels on the CPU (moe_cpu_emulation.cpp): each CUDA
// thread of a block is a fiber (ucontext) on one OS thread, switched only at barriers;
// warp operations (shuffle, ballot, mma) exchange through memory between warp barriers.
#pragma once
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
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
std::vector<uint32_t> mma_slots;               // 10 words per thread: a[4], b[2], d[4]

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


inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 v) { return v.bits; }
inline int atomicAdd(int* p, int v) { const int old = *p; *p = old + v; return old; }   // fibers switch only at barriers

inline float emu_bf16_value(uint32_t b) { uint32_t u = b << 16; float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t emu_bf16x2_mul(uint32_t a, uint32_t b) {     // fma.rn.bf16x2 a, b, -0: exact RN product
  auto one = [](uint32_t x, uint32_t y) {
    const double p = static_cast<double>(emu_bf16_value(x & 0xffffu)) * emu_bf16_value(y & 0xffffu);
    return static_cast<uint32_t>(__float2bfloat16_rn(static_cast<float>(p)).bits);
  };
  return one(a, b) | (one(a >> 16, b >> 16) << 16);
}

// mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32, d += A * B, with the PTX fragment layout:
// A reg r of lane (g, t): row g + 8*(r&1), k 2t + 8*(r>>1) (+1 in the high half);
// B reg r: k 2t + 8r (+1), column g; D c: row g + 8*(c>>1), column 2t + (c&1).
inline void emu_mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  uint32_t* my = &emu::mma_slots[static_cast<size_t>(tid) * 10];
  for (int i = 0; i < 4; ++i) my[i] = a[i];
  my[4] = b0; my[5] = b1;
  emu::warp_barriers[warp].arrive_and_wait();
  auto A = [&](int row, int k) {
    const uint32_t* s = &emu::mma_slots[static_cast<size_t>(warp * 32 + (row % 8) * 4 + (k % 8) / 2) * 10];
    const uint32_t w = s[(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)];
    return emu_bf16_value(k % 2 ? w >> 16 : w & 0xffffu);
  };
  auto B = [&](int k, int col) {
    const uint32_t* s = &emu::mma_slots[static_cast<size_t>(warp * 32 + col * 4 + (k % 8) / 2) * 10];
    const uint32_t w = s[4 + (k >= 8 ? 1 : 0)];
    return emu_bf16_value(k % 2 ? w >> 16 : w & 0xffffu);
  };
  float out[4];
  for (int c = 0; c < 4; ++c) {
    const int row = g + 8 * (c >> 1), col = 2 * t + (c & 1);
    double s = d[c];
    for (int k = 0; k < 16; ++k) s += static_cast<double>(A(row, k)) * B(k, col);
    out[c] = static_cast<float>(s);
  }
  emu::warp_barriers[warp].arrive_and_wait();
  for (int c = 0; c < 4; ++c) d[c] = out[c];
}

// ---- launcher ---------------------------------------------------------------------
template <typename Kernel>
void launch(dim3 grid, int threads, Kernel kernel) {
  using namespace emu;
  block_barrier = Barrier{threads, 0, 0};
  warp_barriers.assign((threads + 31) / 32, Barrier{32, 0, 0});
  shuffle_slots.assign(threads, 0.f);
  mma_slots.assign(static_cast<size_t>(threads) * 10, 0u);
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

