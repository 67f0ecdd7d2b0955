// The one spelling of "a flat, contiguous, CPU numpy array of T" shared by the bindings
// that take the store's state arrays (fold, replay).
#pragma once

#include <nanobind/ndarray.h>

namespace tierstore::python {

template <typename T>
using Flat = nanobind::ndarray<T, nanobind::ndim<1>, nanobind::c_contig, nanobind::device::cpu>;

}  // namespace tierstore::python
