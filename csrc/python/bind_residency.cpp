// Binding of store/residency.hpp (the host decide and page-in) and kernels/residency.hpp
// (the CUDA launches, CUDA builds only). Pointers cross as plain integers (torch's
// data_ptr()), as in bind_moe.cpp: the view is built once by tierstore/store/residency.py
// from tensors it owns and keeps alive. Every call is short and never waits on the
// device, so the GIL is kept.
#include <nanobind/nanobind.h>

#include <cstdint>

#include "tierstore/store/residency.hpp"
#if TIERSTORE_WITH_CUDA
#include "tierstore/kernels/residency.hpp"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace tierstore::python {

namespace {
template <typename T>
T* ptr(uintptr_t p) { return reinterpret_cast<T*>(p); }
}  // namespace

void bind_residency(nb::module_& m) {
  nb::class_<ResidencyView>(m, "ResidencyView")
      .def(
          "__init__",
          [](ResidencyView* self, uintptr_t table, uintptr_t pool, int64_t n_slots,
             int64_t slot_bytes, int32_t n_layers, int32_t n_experts, uintptr_t owner,
             uintptr_t stamp, uintptr_t ref, uintptr_t arena_row, uintptr_t first, uintptr_t heat,
             uintptr_t ctrl, uintptr_t plan, int64_t max_plan, uintptr_t arena, int64_t arena_rows,
             int64_t arena_stride) {
            ResidencyView* v = new (self) ResidencyView();
            v->table = ptr<int32_t>(table);
            v->pool = ptr<uint8_t>(pool);
            v->n_slots = n_slots;
            v->slot_bytes = slot_bytes;
            v->n_layers = n_layers;
            v->n_experts = n_experts;
            v->owner = ptr<int32_t>(owner);
            v->stamp = ptr<uint32_t>(stamp);
            v->ref = ptr<uint8_t>(ref);
            v->arena_row = ptr<const int32_t>(arena_row);
            v->first = ptr<int32_t>(first);
            v->heat = ptr<int32_t>(heat);
            v->ctrl = ptr<int64_t>(ctrl);
            v->plan = ptr<int32_t>(plan);
            v->max_plan = max_plan;
            v->arena = ptr<const uint8_t>(arena);
            v->arena_rows = arena_rows;
            v->arena_stride = arena_stride;
            residency_check(*v, 0, 0);
          },
          "table"_a, "pool"_a, "n_slots"_a, "slot_bytes"_a, "n_layers"_a, "n_experts"_a, "owner"_a,
          "stamp"_a, "ref"_a, "arena_row"_a, "first"_a, "heat"_a, "ctrl"_a, "plan"_a, "max_plan"_a,
          "arena"_a, "arena_rows"_a, "arena_stride"_a,
          "Pointers (ints) of one memory space; ValueError when the view is inconsistent.")
      .def("decide_host", [](const ResidencyView& v, int layer, uintptr_t ids, int64_t n) {
             residency_decide_host(v, layer, ptr<const int32_t>(ids), n);
           }, "layer"_a, "ids"_a, "n_ids"_a,
           "The decide on host memory (ids: int32 [n_ids] at this address).")
      .def("gather_host", &residency_gather_host,
           "The page-in of the last plan on host memory (memcpy, then publish).");
#if TIERSTORE_WITH_CUDA
  m.def("residency_page_in", [](const ResidencyView& v, int layer, uintptr_t ids, int64_t n,
                                bool gather, int blocks, int64_t chunk_bytes, int device,
                                uintptr_t stream) {
          residency_page_in_cuda(v, layer, ptr<const int32_t>(ids), n, gather, blocks, chunk_bytes,
                                 device, stream);
        }, "view"_a, "layer"_a, "ids"_a, "n_ids"_a, "gather"_a, "blocks"_a, "chunk_bytes"_a,
        "device"_a, "stream"_a,
        "Launch the decide (and the page-in) on `stream`; asynchronous, capturable.");
  m.def("residency_gather", &residency_gather_cuda, "view"_a, "blocks"_a, "chunk_bytes"_a,
        "device"_a, "stream"_a, "Launch the page-in of the last plan on `stream`.");
  m.def("residency_copy_plan", [](const ResidencyView& host_view, uintptr_t pool, int device,
                                  uintptr_t stream) {
          residency_copy_plan_cuda(host_view, ptr<uint8_t>(pool), device, stream);
        }, "host_view"_a, "pool"_a, "device"_a, "stream"_a,
        "Copy a host plan's rows into the device pool by the copy engine on `stream`.");
  m.def("host_device_pointer", &host_device_pointer, "host"_a,
        "The device-visible address of pinned, mapped host memory.");
  m.def("residency_prepare", &residency_prepare, "device"_a,
        "Load the residency kernels on `device` (call once outside graph capture).");
  m.attr("RESIDENCY_CHUNK_BYTES") = kResidencyChunkBytes;
#endif
  m.attr("RESIDENCY_CTRL_WORDS") = static_cast<int>(kCtrlWords);
  m.attr("RESIDENCY_LOCKED") = kResidencyLocked;
}

}  // namespace tierstore::python
