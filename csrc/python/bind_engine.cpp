// Placeholder until the I/O engine lands (issue: C++ I/O engine).
#include <nanobind/nanobind.h>
namespace nb = nanobind;
namespace tierstore::python {
void bind_engine(nb::module_& m) {}
}  // namespace tierstore::python
