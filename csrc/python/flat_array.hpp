// The one spelling of "a flat, contiguous, CPU numpy array of T" shared by the bindings
// that take the store's state arrays (fold, replay, prefetch), and of a copy handed back.
#pragma once

#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstring>

namespace tierstore::python {

template <typename T>
using Flat = nanobind::ndarray<T, nanobind::ndim<1>, nanobind::c_contig, nanobind::device::cpu>;

// A new numpy array holding a copy of data[0:n] (the results the bindings hand back).
template <typename T>
nanobind::ndarray<nanobind::numpy, T, nanobind::ndim<1>> to_numpy(const T* data, size_t n) {
  T* out = new T[n > 0 ? n : 1];
  if (n) std::memcpy(out, data, n * sizeof(T));
  nanobind::capsule owner(out, [](void* p) noexcept { delete[] static_cast<T*>(p); });
  const size_t shape[1] = {n};
  return nanobind::ndarray<nanobind::numpy, T, nanobind::ndim<1>>(out, 1, shape, owner);
}

}  // namespace tierstore::python
