// tierstore._C: the native core. Each public header has one thin bind_*.cpp
// file; this file only assembles them.
#include <nanobind/nanobind.h>

#include "gil.hpp"
#include "tierstore/io/runtime.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace tierstore::python {
void bind_engine(nb::module_& m);  // bind_engine.cpp: readers, host buffers, copy pipeline
void bind_moe(nb::module_& m);     // bind_moe.cpp: slot-aware MoE decode kernel
void bind_fold(nb::module_& m);    // bind_fold.cpp: the store's routing fold
void bind_bounds(nb::module_& m);  // bind_bounds.cpp: read ceilings measured in C++
void bind_policy(nb::module_& m);         // bind_policy.cpp: the policies' rules (PolicyCore)
void bind_policy_replay(nb::module_& m);  // bind_policy_replay.cpp: native demand replay
void bind_policy_auto(nb::module_& m);    // bind_policy_auto.cpp: auto's core and replay
void bind_prefetch(nb::module_& m);       // bind_prefetch.cpp: the prefetcher and its model
void bind_residency(nb::module_& m);      // bind_residency.cpp: device-side residency
}  // namespace tierstore::python

NB_MODULE(_C, m) {
  m.doc() = "tierstore native core (I/O engine, pinned memory, CUDA copy pipeline, kernels)";
  m.def("built_with_cuda", &tierstore::built_with_cuda,
        "True when the extension was compiled with CUDA support.");
  m.def("cuda_device_count", &tierstore::cuda_device_count,
        "CUDA devices visible to the driver (0 without a driver or device).");
  m.def("cuda_runtime_version", &tierstore::cuda_runtime_version,
        "CUDA runtime version compiled in (e.g. 13000), 0 when built without CUDA.");
  // A fork()ed child inherits a store or engine without the threads that drive it:
  // freeing it there would join threads that do not exist and destroy condition
  // variables their waiters never left (both block forever). tierstore/process.py
  // keeps such objects alive for the child's lifetime with one reference never given back.
  m.def("keep_forever", [](nb::handle obj) { obj.inc_ref(); }, "obj"_a,
        "Take one reference to obj that is never released (fork()ed children only).");
  m.def("mark_exit_thread", &tierstore::python::mark_exit_thread,
        "Record the calling thread as the one running interpreter exit (gil.hpp).");
  tierstore::python::bind_engine(m);
  tierstore::python::bind_moe(m);
  tierstore::python::bind_fold(m);
  tierstore::python::bind_bounds(m);
  tierstore::python::bind_policy(m);
  tierstore::python::bind_policy_replay(m);
  tierstore::python::bind_policy_auto(m);
  tierstore::python::bind_prefetch(m);
  tierstore::python::bind_residency(m);
}
