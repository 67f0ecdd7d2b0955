// Binding of fold.hpp: the store's routing fold. Every call is short and never waits, so
// the GIL is kept: that is also what serialises add (forward thread) and take (under
// the store lock). Ids arrive as any C-contiguous integer buffer (a numpy array) of up to
// 64 bits; anything else is a TypeError and the Python side converts.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "tierstore/store/fold.hpp"

#include "flat_array.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace tierstore::python {
namespace {

// The arrays take() writes and reads, bound once (the store allocates them once and
// never rebinds them): converting three ndarray arguments cost ~3 us a take.
struct Bound {
  nb::object seen, pool_slot, arena_slot;  // keep the arrays alive
  uint8_t* seen_ptr = nullptr;
  const int32_t* pool_ptr = nullptr;
  const int32_t* arena_ptr = nullptr;
};

class PyFold : public RoutingFold {
 public:
  using RoutingFold::RoutingFold;
  Bound bound;
};

// The Python buffer protocol, not nb::ndarray: importing a numpy array through the
// ndarray caster costs ~1 us a call, which is most of a record(); GetBuffer is ~0.1 us.
void add_ids(PyFold& fold, int64_t layer, nb::handle ids) {
  if (layer < 0 || layer >= fold.n_layers()) throw nb::index_error("RoutingFold.add: layer out of range");
  Py_buffer view;
  if (PyObject_GetBuffer(ids.ptr(), &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
    PyErr_Clear();
    throw nb::type_error("RoutingFold.add: ids are not a C-contiguous buffer");
  }
  struct Release {
    Py_buffer* v;
    ~Release() { PyBuffer_Release(v); }
  } release{&view};
  const char* f = view.format ? view.format : "B";
  if (*f == '<' || *f == '=' || *f == '@') ++f;  // native byte order only ('>' / '!' rejected)
  const int64_t n = view.itemsize ? static_cast<int64_t>(view.len / view.itemsize) : 0;
  const void* p = view.buf;
  const bool is_signed = *f == 'b' || *f == 'h' || *f == 'i' || *f == 'l' || *f == 'q';
  const bool is_unsigned = *f == 'B' || *f == 'H' || *f == 'I' || *f == 'L' || *f == 'Q';
  if (f[0] != '\0' && f[1] == '\0' && is_signed) {
    switch (view.itemsize) {
      case 8: return fold.add(layer, static_cast<const int64_t*>(p), n);
      case 4: return fold.add(layer, static_cast<const int32_t*>(p), n);
      case 2: return fold.add(layer, static_cast<const int16_t*>(p), n);
      case 1: return fold.add(layer, static_cast<const int8_t*>(p), n);
    }
  } else if (f[0] != '\0' && f[1] == '\0' && is_unsigned) {
    switch (view.itemsize) {
      case 4: return fold.add(layer, static_cast<const uint32_t*>(p), n);
      case 2: return fold.add(layer, static_cast<const uint16_t*>(p), n);
      case 1: return fold.add(layer, static_cast<const uint8_t*>(p), n);
    }
  }
  throw nb::type_error("RoutingFold.add: ids must be signed integers of <= 64 bits or unsigned of <= 32");
}

void bind_arrays(PyFold& fold, Flat<bool> seen, Flat<const int32_t> pool_slot,
                 Flat<const int32_t> arena_slot, nb::object seen_obj, nb::object pool_obj,
                 nb::object arena_obj) {
  const size_t n_keys = static_cast<size_t>(fold.n_keys());
  if (seen.shape(0) != n_keys || pool_slot.shape(0) != n_keys || arena_slot.shape(0) != n_keys)
    throw nb::value_error("RoutingFold.bind: seen / resident-slot arrays must have n_keys entries");
  fold.bound = Bound{seen_obj, pool_obj, arena_obj, reinterpret_cast<uint8_t*>(seen.data()),
                     pool_slot.data(), arena_slot.data()};
}

nb::tuple take(PyFold& fold) {
  const Bound& b = fold.bound;
  if (!b.seen_ptr) throw nb::value_error("RoutingFold.take: bind() the arrays first");
  FoldTally tally;
  const size_t got = static_cast<size_t>(fold.take(b.seen_ptr, b.pool_ptr, b.arena_ptr, &tally));
  int64_t bad_layer = -1, bad_id = -1;
  const int64_t dropped = fold.take_dropped(&bad_layer, &bad_id);
  nb::tuple t = nb::make_tuple(tally.tokens[0], tally.tokens[1], tally.tokens[2], tally.tokens[3],
                               tally.keys[0], tally.keys[1], tally.keys[2], tally.keys[3], dropped,
                               bad_layer, bad_id);
  // Views of the fold's own buffers (no allocation, no copy): valid until the next take.
  nb::handle owner = nb::find(fold);
  size_t shape[1] = {got};
  return nb::make_tuple(
      nb::ndarray<nb::numpy, const int64_t, nb::ndim<1>>(fold.keys(), 1, shape, owner),
      nb::ndarray<nb::numpy, const double, nb::ndim<1>>(fold.counts(), 1, shape, owner), t);
}

// Dense unique keys of an int64 [N, 2] buffer; None when the buffer is not one (the
// caller converts) or a key is bad (the caller raises the pack's error).
nb::object unique_dense(nb::handle pairs, int64_t n_layers, int64_t n_experts,
                        Flat<const bool> written) {
  Py_buffer view;
  if (PyObject_GetBuffer(pairs.ptr(), &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
    PyErr_Clear();
    return nb::none();
  }
  struct Release {
    Py_buffer* v;
    ~Release() { PyBuffer_Release(v); }
  } release{&view};
  const char* f = view.format ? view.format : "B";
  if (*f == '<' || *f == '=' || *f == '@') ++f;
  if (view.itemsize != 8 || !(f[0] == 'l' || f[0] == 'q') || f[1] != '\0' || view.ndim != 2 ||
      view.shape[1] != 2 || static_cast<int64_t>(written.shape(0)) != n_layers)
    return nb::none();
  const int64_t n = view.shape[0];
  std::vector<uint8_t> mark(static_cast<size_t>(n_layers * n_experts), 0);
  int64_t* out = new int64_t[n ? n : 1];
  const int64_t m = unique_dense_keys(static_cast<const int64_t*>(view.buf), n, n_layers, n_experts,
                                      reinterpret_cast<const uint8_t*>(written.data()),
                                      mark.data(), out);
  if (m < 0) {
    delete[] out;
    return nb::none();
  }
  nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<int64_t*>(p); });
  size_t shape[1] = {static_cast<size_t>(m)};
  return nb::cast(nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>(out, 1, shape, owner));
}

}  // namespace

void bind_fold(nb::module_& m) {
  nb::class_<PyFold>(m, "RoutingFold",
                     "Token counts per dense key, added per MoE layer, taken once per step.")
      .def(nb::init<int64_t, int64_t>(), "n_layers"_a, "n_experts"_a)
      .def_prop_ro("n_keys", [](const PyFold& f) { return f.n_keys(); })
      .def_prop_ro("n_pending", [](const PyFold& f) { return f.n_pending(); },
                   "keys with a count since the last take")
      .def("add", &add_ids, "layer"_a, "ids"_a,
           "Count one layer's expert ids (< 0 padding, >= n_experts dropped and counted).")
      .def(
          "bind",
          [](PyFold& f, nb::object seen, nb::object pool_slot, nb::object arena_slot) {
            try {
              bind_arrays(f, nb::cast<Flat<bool>>(seen, false),
                          nb::cast<Flat<const int32_t>>(pool_slot, false),
                          nb::cast<Flat<const int32_t>>(arena_slot, false), seen, pool_slot,
                          arena_slot);
            } catch (const nb::cast_error&) {
              throw nb::type_error("RoutingFold.bind: seen must be a contiguous bool array and "
                                   "the slot maps contiguous int32 arrays");
            }
          },
          "seen"_a, "pool_slot"_a, "arena_slot"_a,
          "The arrays every take uses: seen (bool [n_keys], set for taken keys) and the two "
          "tiers' resident_slot maps (int32 [n_keys]); kept alive, never copied.")
      .def("add_counts",
           [](PyFold& f, Flat<const int64_t> counts) {
             if (static_cast<int64_t>(counts.shape(0)) != f.n_keys())
               throw nb::value_error("RoutingFold.add_counts: counts must have n_keys entries");
             f.add_counts(counts.data());
           },
           "counts"_a, "Add dense int64 counts per key (a device counter's snapshot).")
      .def("take", &take,
           "(keys int64, counts float64 (read-only views, valid until the next take), 11 "
           "ints: tokens then keys per residency category 0 none / 1 arena / 2 pool / 3 "
           "both, then dropped ids and the first one's layer and id); sets seen[keys]; resets.")
      .def(
          "take_dropped",
          [](PyFold& f) {
            int64_t layer = -1, id = -1;
            const int64_t n = f.take_dropped(&layer, &id);
            return nb::make_tuple(n, layer, id);
          },
          "(dropped ids, first one's layer, first one's id) since the last call; resets.");
  m.def("unique_dense_keys", &unique_dense, "pairs"_a, "n_layers"_a, "n_experts"_a,
        "written"_a.noconvert(),
        "int64 [N, 2] (layer, expert) -> unique dense ids in first-seen order; None when "
        "pairs is not such a buffer or a key is out of range / in an unwritten layer.");
}

}  // namespace tierstore::python
