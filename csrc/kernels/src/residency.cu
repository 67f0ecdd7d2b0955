// Device-side residency kernels (the rule: tierstore/store/residency.hpp; the host spelling
// csrc/store/src/residency.cpp, which these must match decision for decision).
#include <cuda_runtime.h>

#include <climits>
#include <stdexcept>
#include <string>

#include "tierstore/kernels/residency.hpp"

namespace tierstore {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kGatherThreads = 256;

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(std::string("residency: ") + what + ": " + cudaGetErrorName(err) +
                             " (" + cudaGetErrorString(err) + ")");
  }
}

void use_device(int device) {
  int cur = -1;
  check_cuda(cudaGetDevice(&cur), "cudaGetDevice");
  if (cur != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
}

// One warp: residency.hpp steps 1-3. Every branch below is warp-uniform except the
// per-lane loads and stores, so the sweep's decisions equal the host's position by
// position: a window of w slots is the host's next w positions, its first candidate
// lane the host's first victim, and the ref bits cleared before it the host's.
__global__ void __launch_bounds__(32) decide_kernel(ResidencyView v, int layer, const int32_t* ids,
                                                    int64_t n) {
  const int lane = threadIdx.x;
  int64_t* c = v.ctrl;
  const int64_t e64 = residency_next_epoch(c[kCtrlEpoch]);
  const uint32_t epoch = static_cast<uint32_t>(e64);
  const int E = v.n_experts;
  const int64_t key0 = static_cast<int64_t>(layer) * E;
  int32_t* row = v.table + key0;
  for (int64_t i = lane; i < n; i += 32) {          // 1. first position of each id
    const int32_t e = ids[i];
    if (e >= 0 && e < E) v.first[e] = INT_MAX;
  }
  __syncwarp();
  for (int64_t i = lane; i < n; i += 32) {
    const int32_t e = ids[i];
    if (e >= 0 && e < E) atomicMin(&v.first[e], static_cast<int>(i));
  }
  __syncwarp();
  ResidencyTally t;   // warp-uniform: every lane counts the same
  int64_t& plan_len = t.plan_len;
  for (int64_t base = 0; base < n; base += 32) {    // 2. hits stamped, misses listed in order
    const int64_t i = base + lane;
    const int32_t e = i < n ? ids[i] : -1;
    const bool valid = e >= 0 && e < E;
    if (valid && v.heat) atomicAdd(&v.heat[key0 + e], 1);
    const bool is_first = valid && v.first[e] == i;
    const int32_t slot = is_first ? row[e] : -1;
    const bool hit = is_first && slot >= 0 && slot < v.n_slots;
    if (hit) {
      v.stamp[slot] = epoch;
      v.ref[slot] = 1;
    }
    const bool miss = is_first && !hit;
    const unsigned mm = __ballot_sync(kFull, miss);
    if (miss) {
      const int64_t pos = plan_len + __popc(mm & ((1u << lane) - 1u));
      v.plan[2 * pos] = static_cast<int32_t>(key0 + e);
      v.plan[2 * pos + 1] = -1;
    }
    plan_len += __popc(mm);
    t.routed += __popc(__ballot_sync(kFull, valid));
    t.hits += __popc(__ballot_sync(kFull, hit));
  }
  __syncwarp();
  const int64_t ns = v.n_slots;
  const int w = ns < 32 ? static_cast<int>(ns) : 32;
  const int64_t limit = 2 * ns + 32;
  int64_t hand = c[kCtrlHand];
  for (int64_t j = 0; j < plan_len; ++j) {          // 3. a victim per miss
    const int32_t key = v.plan[2 * j];
    if (v.arena_row[key] < 0) {
      ++t.no_arena;
      continue;
    }
    int64_t chosen = -1;
    for (int64_t scanned = 0; ns > 0 && scanned < limit; scanned += w) {
      const bool act = lane < w;
      const int64_t s = (hand + scanned + lane) % ns;
      const uint32_t st = act ? v.stamp[s] : kResidencyLocked;
      const uint8_t r = act ? v.ref[s] : 0;
      const bool prot = st == epoch || st == kResidencyLocked;
      const bool cand = act && !prot && r == 0;
      const bool clear = act && !prot && r != 0;
      const unsigned m = __ballot_sync(kFull, cand);
      if (m) {
        const int first_lane = __ffs(m) - 1;
        if (clear && lane < first_lane) v.ref[s] = 0;
        chosen = (hand + scanned + first_lane) % ns;
        __syncwarp();
        break;
      }
      if (clear) v.ref[s] = 0;
      __syncwarp();
    }
    if (chosen < 0) {
      ++t.no_slot;
      continue;
    }
    hand = (chosen + 1) % ns;
    const int32_t victim = v.owner[chosen];
    __syncwarp();
    if (lane == 0) {
      if (victim >= 0) v.table[victim] = -1;   // unpublished now; overwritten by the page-in
      v.owner[chosen] = key;
      v.stamp[chosen] = epoch;
      v.ref[chosen] = 1;
      v.plan[2 * j + 1] = static_cast<int32_t>(chosen);
    }
    __syncwarp();
    if (victim >= 0) ++t.evicted;
    ++t.placed;
  }
  if (lane == 0) {
    c[kCtrlHand] = hand;
    c[kCtrlEpoch] = e64;
    c[kCtrlTicket] = 0;
    residency_count(c, t, v.slot_bytes);
  }
}

// Step 4: blocks take (row, chunk) work items round-robin and copy them with 16-byte
// loads, all of a thread's loads issued before its stores (the PCIe round trip is long:
// bytes in flight are what the bandwidth needs). The last block to finish publishes.
__global__ void __launch_bounds__(kGatherThreads) gather_kernel(ResidencyView v, int64_t chunk) {
  const int64_t n = v.ctrl[kCtrlPlanLen];
  if (n == 0) return;   // uniform for every block: no ticket taken either
  const int64_t sb = v.slot_bytes;
  const int64_t per_row = (sb + chunk - 1) / chunk;
  const int64_t items = n * per_row;
  const bool vec = sb % 16 == 0 && v.arena_stride % 16 == 0 &&
                   (reinterpret_cast<uintptr_t>(v.arena) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(v.pool) & 15) == 0;
  for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
    const int64_t j = it / per_row;
    const int32_t slot = v.plan[2 * j + 1];
    if (slot < 0) continue;
    const int64_t off = (it - j * per_row) * chunk;
    const int64_t len = sb - off < chunk ? sb - off : chunk;
    const uint8_t* src = v.arena + static_cast<int64_t>(v.arena_row[v.plan[2 * j]]) * v.arena_stride + off;
    uint8_t* dst = v.pool + static_cast<int64_t>(slot) * sb + off;
    if (vec) {
      const uint4* s4 = reinterpret_cast<const uint4*>(src);
      uint4* d4 = reinterpret_cast<uint4*>(dst);
      const int64_t n4 = len / 16;
      constexpr int kUnroll = 8;
      int64_t k = threadIdx.x;
      for (; k + (kUnroll - 1) * kGatherThreads < n4; k += kUnroll * kGatherThreads) {
        uint4 r[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) r[u] = s4[k + u * kGatherThreads];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) d4[k + u * kGatherThreads] = r[u];
      }
      for (; k < n4; k += kGatherThreads) d4[k] = s4[k];
    } else {
      for (int64_t k = threadIdx.x; k < len; k += kGatherThreads) dst[k] = src[k];
    }
  }
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();   // this block's copies before its ticket
    const unsigned long long t =
        atomicAdd(reinterpret_cast<unsigned long long*>(&v.ctrl[kCtrlTicket]), 1ULL);
    last = t == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int64_t j = threadIdx.x; j < n; j += kGatherThreads)   // the publish
    if (v.plan[2 * j + 1] >= 0) v.table[v.plan[2 * j]] = v.plan[2 * j + 1];
  if (threadIdx.x == 0) v.ctrl[kCtrlTicket] = 0;
}

int gather_blocks(int blocks, int device) {
  if (blocks > 0) return blocks;
  int n_sm = 0;
  check_cuda(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute(MultiProcessorCount)");
  return 2 * n_sm;
}

void check_chunk(int64_t chunk) {
  if (chunk < 4096 || chunk % 4096 != 0 || chunk > (int64_t(1) << 30))
    throw std::invalid_argument("residency: chunk_bytes " + std::to_string(chunk) +
                                " must be a multiple of 4096 in [4096, 1 GiB]");
}

}  // namespace

void residency_page_in_cuda(const ResidencyView& v, int layer, const int32_t* ids, int64_t n_ids,
                            bool gather, int blocks, int64_t chunk_bytes, int device,
                            uintptr_t stream) {
  residency_check(v, layer, n_ids);
  check_chunk(chunk_bytes);
  if (n_ids > 0 && !ids) throw std::invalid_argument("residency: ids is null");
  use_device(device);
  auto s = reinterpret_cast<cudaStream_t>(stream);
  decide_kernel<<<1, 32, 0, s>>>(v, layer, ids, n_ids);
  check_cuda(cudaGetLastError(), "launch of the decide kernel");
  if (gather) residency_gather_cuda(v, blocks, chunk_bytes, device, stream);
}

void residency_gather_cuda(const ResidencyView& v, int blocks, int64_t chunk_bytes, int device,
                           uintptr_t stream) {
  check_chunk(chunk_bytes);
  use_device(device);
  const int g = gather_blocks(blocks, device);
  gather_kernel<<<g, kGatherThreads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(v, chunk_bytes);
  check_cuda(cudaGetLastError(), "launch of the page-in kernel");
}

void residency_copy_plan_cuda(const ResidencyView& pv, uint8_t* pool, int device, uintptr_t stream) {
  use_device(device);
  auto s = reinterpret_cast<cudaStream_t>(stream);
  const int64_t n = pv.ctrl[kCtrlPlanLen];
  for (int64_t j = 0; j < n; ++j) {
    const int32_t slot = pv.plan[2 * j + 1];
    if (slot < 0) continue;
    const uint8_t* src = pv.arena + static_cast<int64_t>(pv.arena_row[pv.plan[2 * j]]) * pv.arena_stride;
    check_cuda(cudaMemcpyAsync(pool + static_cast<int64_t>(slot) * pv.slot_bytes, src,
                               static_cast<size_t>(pv.slot_bytes), cudaMemcpyHostToDevice, s),
               "cudaMemcpyAsync (host-planned page-in)");
  }
}

uintptr_t host_device_pointer(uintptr_t host) {
  void* dev = nullptr;
  check_cuda(cudaHostGetDevicePointer(&dev, reinterpret_cast<void*>(host), 0),
             "cudaHostGetDevicePointer (is the buffer pinned and mapped?)");
  return reinterpret_cast<uintptr_t>(dev);
}

void residency_prepare(int device) {
  use_device(device);
  cudaFuncAttributes attr;
  check_cuda(cudaFuncGetAttributes(&attr, decide_kernel), "load of the decide kernel");
  check_cuda(cudaFuncGetAttributes(&attr, gather_kernel), "load of the page-in kernel");
}

}  // namespace tierstore
