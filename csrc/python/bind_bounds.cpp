// Binding of read_bound.hpp (benchmark ceilings measured in C++). Releases the
// GIL while the threads read. No logic lives here.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include "tierstore/io/read_bound.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace tierstore::python {

void bind_bounds(nb::module_& m) {
  m.def(
      "measure_read_bound",
      [](const std::string& path, nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> offsets,
         uint64_t row_bytes, int threads, bool direct, uint64_t chunk_bytes, int passes) {
        ReadBoundResult r;
        {
          nb::gil_scoped_release release;
          r = measure_read_bound(path, offsets.data(), offsets.shape(0), row_bytes, threads, direct,
                                 chunk_bytes, passes);
        }
        nb::dict d;
        d["best_s"] = r.best_s;
        d["median_s"] = r.median_s;
        d["bytes"] = r.bytes;
        d["pinned"] = r.pinned;
        d["direct"] = r.direct;
        return d;
      },
      "path"_a, "offsets"_a, "row_bytes"_a, "threads"_a, "direct"_a, "chunk_bytes"_a, "passes"_a,
      "N threads pread rows into pinned host memory (the page-cache / O_DIRECT bound) -> dict.");
}

}  // namespace tierstore::python
