// Device-side residency on the GPU: the decide (one warp: CLOCK victims, no host sync)
// and the page-in (every SM block copies planned rows from the pinned arena over UVA,
// the last block to finish publishes them in the slot table). The rule and the state are
// csrc/store/include/tierstore/store/residency.hpp; these launches run it on `stream`
// with no host sync and no allocation, so they can be captured in a CUDA graph: every
// pointer of the view is fixed, and the data-dependent parts (which rows, how many) are
// read on the device at run time. Why an SM gather: a graph's copy-engine node has its
// source address fixed at capture, and the rows to copy are known only on the device.
//
// Also here: the host-planned baseline's page-in by the copy engine (one
// cudaMemcpyAsync per planned row of a host plan) and the UVA address of a pinned buffer.
// CUDA builds only (bind_residency.cpp binds them only then).
#pragma once
#include <cstdint>

#include "tierstore/store/residency.hpp"

namespace tierstore {

// Bytes one block copies per work item of the page-in (a multiple of 4096).
constexpr int64_t kResidencyChunkBytes = 64 << 10;

// The decide of residency.hpp on `stream` (one warp), then, with `gather`, the page-in
// (`blocks` blocks; 0 = 2 per multiprocessor). All pointers in `v` are device-visible.
// std::invalid_argument for a bad view, std::runtime_error for a failed launch.
void residency_page_in_cuda(const ResidencyView& v, int layer, const int32_t* ids, int64_t n_ids,
                            bool gather, int blocks, int64_t chunk_bytes, int device,
                            uintptr_t stream);

// The page-in of the last plan alone (after a decide launched with gather = false).
void residency_gather_cuda(const ResidencyView& v, int blocks, int64_t chunk_bytes, int device,
                           uintptr_t stream);

// The host-planned baseline: copy each planned row of the HOST view `plan_view` (its
// `arena` a host address) into `pool` (device) by the copy engine on `stream`.
void residency_copy_plan_cuda(const ResidencyView& plan_view, uint8_t* pool, int device,
                              uintptr_t stream);

// The device-visible address of pinned host memory at `host` (cudaHostGetDevicePointer).
uintptr_t host_device_pointer(uintptr_t host);

// Loads the kernels' module on `device` (call once outside graph capture).
void residency_prepare(int device);

}  // namespace tierstore
