// Placeholder until the MoE decode kernel lands (issue: slot-aware fused MoE).
#include <nanobind/nanobind.h>
namespace nb = nanobind;
namespace tierstore::python {
void bind_moe(nb::module_& m) {}
}  // namespace tierstore::python
