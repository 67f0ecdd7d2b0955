// Binding of moe.hpp: the slot-aware MoE kernels (v2 decode GEMV, tensor-core grouped path). Pointers and the stream cross
// as plain integers (torch's data_ptr() / cuda_stream), so the extension needs no torch
// headers. Bound only in CUDA builds; tierstore/moe.py checks hasattr(_C, "moe_decode").
// The launch is asynchronous and cheap, so the GIL is kept (no waiting happens here).
#include <nanobind/nanobind.h>

#include <cstdint>

#include "tierstore/kernels/moe.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace tierstore::python {

// The arguments both launches share (device pointers arrive from Python as ints).
static MoeDecodeArgs common_args(uintptr_t x, uintptr_t out, int dtype, uintptr_t topk_ids,
                          uintptr_t topk_w, int T, int k, uintptr_t slot_row, int E,
                          int64_t n_slots, uintptr_t pool, int64_t pool_slot_bytes,
                          uintptr_t base_rows, int64_t base_slot_bytes, int H, int I) {
  MoeDecodeArgs a;
  a.x = reinterpret_cast<const void*>(x);
  a.out = reinterpret_cast<void*>(out);
  a.dtype = static_cast<MoeActDtype>(dtype);
  a.topk_ids = reinterpret_cast<const int32_t*>(topk_ids);
  a.topk_w = reinterpret_cast<const float*>(topk_w);
  a.T = T;
  a.k = k;
  a.slot_row = reinterpret_cast<const int32_t*>(slot_row);
  a.E = E;
  a.n_slots = n_slots;
  a.pool = reinterpret_cast<const uint8_t*>(pool);
  a.pool_slot_bytes = pool_slot_bytes;
  a.base_rows = reinterpret_cast<const uint8_t*>(base_rows);
  a.base_slot_bytes = base_slot_bytes;
  a.H = H;
  a.I = I;
  return a;
}

void bind_moe(nb::module_& m) {
#if TIERSTORE_WITH_CUDA
  m.def(
      "moe_decode",
      [](uintptr_t x, uintptr_t out, int dtype, uintptr_t topk_ids, uintptr_t topk_w, int T, int k,
         uintptr_t slot_row, int E, int64_t n_slots, uintptr_t pool, int64_t pool_slot_bytes,
         uintptr_t base_rows, int64_t base_slot_bytes, int H, int I, uintptr_t h, uintptr_t y,
         int device, uintptr_t stream) {
        MoeDecodeArgs a = common_args(x, out, dtype, topk_ids, topk_w, T, k, slot_row, E, n_slots,
                                      pool, pool_slot_bytes, base_rows, base_slot_bytes, H, I);
        a.h = reinterpret_cast<float*>(h);
        a.y = reinterpret_cast<float*>(y);
        a.device = device;
        a.stream = stream;
        moe_decode(a);
      },
      "x"_a, "out"_a, "dtype"_a, "topk_ids"_a, "topk_w"_a, "T"_a, "k"_a, "slot_row"_a, "E"_a,
      "n_slots"_a, "pool"_a, "pool_slot_bytes"_a, "base_rows"_a, "base_slot_bytes"_a, "H"_a, "I"_a,
      "h"_a, "y"_a, "device"_a, "stream"_a,
      "Launch the slot-aware MoE decode kernels on `stream` (device pointers as ints; "
      "dtype 0 = f32, 1 = bf16). Asynchronous; ValueError on bad arguments, RuntimeError "
      "on a failed launch.");
  m.def("moe_decode_prepare", &moe_decode_prepare, "device"_a,
        "Load the MoE decode kernels on `device` (call once outside CUDA-graph capture).");
  m.def(
      "moe_mma",
      [](uintptr_t x, uintptr_t out, int dtype, uintptr_t topk_ids, uintptr_t topk_w, int T, int k,
         uintptr_t slot_row, int E, int64_t n_slots, uintptr_t pool, int64_t pool_slot_bytes,
         uintptr_t base_rows, int64_t base_slot_bytes, int H, int I, uintptr_t workspace,
         int64_t workspace_bytes, int device, uintptr_t stream) {
        MoeDecodeArgs a = common_args(x, out, dtype, topk_ids, topk_w, T, k, slot_row, E, n_slots,
                                      pool, pool_slot_bytes, base_rows, base_slot_bytes, H, I);
        a.workspace = reinterpret_cast<void*>(workspace);
        a.workspace_bytes = workspace_bytes;
        a.device = device;
        a.stream = stream;
        moe_mma(a);
      },
      "x"_a, "out"_a, "dtype"_a, "topk_ids"_a, "topk_w"_a, "T"_a, "k"_a, "slot_row"_a, "E"_a,
      "n_slots"_a, "pool"_a, "pool_slot_bytes"_a, "base_rows"_a, "base_slot_bytes"_a, "H"_a, "I"_a,
      "workspace"_a, "workspace_bytes"_a, "device"_a, "stream"_a,
      "Launch the tensor-core grouped MoE kernels (any T) on `stream`; asynchronous, no host "
      "sync, capturable. ValueError on bad arguments, RuntimeError on a failed launch.");
  m.def(
      "moe_mma_workspace_bytes",
      [](int T, int k, int E, int H, int I, int dtype) {
        return moe_mma_layout(T, k, E, H, I, static_cast<MoeActDtype>(dtype)).total;
      },
      "T"_a, "k"_a, "E"_a, "H"_a, "I"_a, "dtype"_a,
      "Bytes of scratch one moe_mma call needs (fixed by the shapes, so capturable).");
  m.def("moe_mma_prepare", &moe_mma_prepare, "device"_a,
        "Load the grouped MoE kernels on `device` (call once outside CUDA-graph capture).");
#endif
}

}  // namespace tierstore::python
