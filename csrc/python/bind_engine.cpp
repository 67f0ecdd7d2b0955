// Binding of engine.hpp / host_buffer.hpp: releases the GIL around every call
// that reads, waits or joins (gil.hpp: a wait that ends while the interpreter exits
// parks its thread instead of aborting the process); turns IoError into tierstore._C.NativeIOError
// (an OSError: errno, strerror = message, filename = path, offset) that tierstore/engine.py
// maps onto tierstore.errors.TierIOError, and BoundsError into NativeBoundsError (a
// ValueError) that it maps onto BufferBoundsError. No logic lives here.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "tierstore/io/checksum.hpp"
#include "tierstore/io/engine.hpp"
#include "tierstore/io/error.hpp"
#include "tierstore/io/host_buffer.hpp"
#include "gil.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace tierstore::python {

namespace {

template <typename T>
using Column = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

detail::DirectMode parse_direct(const std::string& mode) {
  if (mode == "on") return detail::DirectMode::on;
  if (mode == "off") return detail::DirectMode::off;
  if (mode == "auto") return detail::DirectMode::automatic;
  throw std::invalid_argument("direct must be \"on\", \"off\" or \"auto\", got \"" + mode + "\"");
}

nb::dict stats_dict(const EngineStats& s) {
  static const char* names[kSourceCount] = {"arena", "pagecache", "disk"};
  nb::dict out;
  for (int i = 0; i < kSourceCount; ++i) {
    nb::list hist;
    for (int b = 0; b < kLatencyBuckets; ++b) hist.append(s.source[i].latency_hist[b]);
    nb::dict d;
    d["rows"] = s.source[i].rows;
    d["bytes"] = s.source[i].bytes;
    d["latency_hist_us_log2"] = hist;
    out[names[i]] = d;
  }
  out["batches"] = s.batches;
  out["failed_rows"] = s.failed_rows;
  out["h2d_bytes"] = s.h2d_bytes;
  out["host_copy_bytes"] = s.host_copy_bytes;
  out["verified_rows"] = s.verified_rows;
  out["verified_bytes"] = s.verified_bytes;
  out["checksum_failures"] = s.checksum_failures;
  return out;
}

}  // namespace

void bind_engine(nb::module_& m) {
  static PyObject* native_io_error =
      PyErr_NewException("tierstore._C.NativeIOError", PyExc_OSError, nullptr);
  m.attr("NativeIOError") = nb::handle(native_io_error);
  nb::register_exception_translator(
      [](const std::exception_ptr& p, void*) {
        try {
          std::rethrow_exception(p);
        } catch (const IoError& e) {
          // OSError keeps (errno, strerror, filename); the offset rides as an attribute.
          nb::object args = nb::make_tuple(e.err(), e.what(), e.path());
          PyObject* exc = PyObject_CallObject(native_io_error, args.ptr());
          if (!exc) return;
          nb::object offset = nb::int_(e.offset());
          PyObject_SetAttrString(exc, "offset", offset.ptr());
          PyErr_SetObject(native_io_error, exc);
          Py_DECREF(exc);
        }
      });
  static PyObject* native_bounds_error =
      PyErr_NewException("tierstore._C.NativeBoundsError", PyExc_ValueError, nullptr);
  m.attr("NativeBoundsError") = nb::handle(native_bounds_error);
  nb::register_exception_translator(
      [](const std::exception_ptr& p, void*) {
        try {
          std::rethrow_exception(p);
        } catch (const BoundsError& e) {
          PyErr_SetString(native_bounds_error, e.what());
        }
      });

  m.def("xxh3_64",
        [](nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> data) {
          return xxh3_64(data.data(), data.shape(0));
        },
        "data"_a, "XXH3-64 (seed 0) of a contiguous uint8 array: the hash the engine verifies.");

  m.def("alloc_host",
        [](size_t nbytes, bool pin) {
          auto* buffer = new HostBuffer(nbytes, pin);
          const bool pinned = buffer->pinned();
          nb::capsule owner(buffer, [](void* p) noexcept { delete static_cast<HostBuffer*>(p); });
          size_t shape[1] = {nbytes};
          auto array = nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>(buffer->data(), 1, shape, owner);
          return nb::make_tuple(array, pinned);
        },
        "nbytes"_a, "pin"_a = true,
        "Page-aligned host buffer -> (numpy uint8 array owning it, pinned: bool).");

  nb::class_<Batch>(m, "NativeBatch")
      .def("wait", &Batch::wait, "timeout_s"_a, nb::call_guard<GilRelease>())
      .def("done", &Batch::done)
      .def("cancel", &Batch::cancel)
      .def_prop_ro("err", &Batch::err)
      .def_prop_ro("err_row", &Batch::err_row)
      .def_prop_ro("err_row_offset", &Batch::err_row_offset)
      .def_prop_ro("err_offset", &Batch::err_offset)
      .def_prop_ro("err_message", &Batch::err_message)
      .def_prop_ro("path", &Batch::path)
      .def("failed_rows", &Batch::failed_rows)
      .def("stream_wait", &Batch::stream_wait, "stream"_a, nb::call_guard<GilRelease>())
      .def("synchronize", &Batch::synchronize, nb::call_guard<GilRelease>());

  nb::class_<Engine>(m, "NativeEngine")
      .def("__init__",
           [](Engine* self, const std::string& path, int threads, const std::string& direct,
              int device, size_t chunk_bytes, size_t stage_bytes, int stage_count,
              bool probe_cache, bool chunk_ramp) {
             EngineOptions o;
             o.threads = threads;
             o.direct = parse_direct(direct);
             o.device = device;
             o.chunk_bytes = chunk_bytes;
             o.stage_bytes = stage_bytes;
             o.stage_count = stage_count;
             o.probe_cache = probe_cache;
             o.chunk_ramp = chunk_ramp;
             nb::gil_scoped_release release;
             new (self) Engine(path, o);
           },
           "path"_a, "threads"_a, "direct"_a, "device"_a, "chunk_bytes"_a, "stage_bytes"_a,
           "stage_count"_a, "probe_cache"_a = true, "chunk_ramp"_a = true)
      .def("submit",
           [](Engine& e, Column<int64_t> offsets, Column<uint64_t> lengths, Column<uint64_t> src,
              Column<uint64_t> dst, bool dst_device, std::optional<Column<uint64_t>> checksums) {
             const size_t n = offsets.shape(0);
             if (lengths.shape(0) != n || src.shape(0) != n || dst.shape(0) != n ||
                 (checksums && checksums->shape(0) != n))
               throw std::invalid_argument("submit: file_offsets, lengths, src_ptrs, dst_ptrs "
                                           "(and checksums) must have the same length");
             const uint64_t* sums = checksums ? checksums->data() : nullptr;
             GilRelease release;
             return e.submit(offsets.data(), lengths.data(), src.data(), dst.data(), n, dst_device,
                             sums);
           },
           "file_offsets"_a, "lengths"_a, "src_ptrs"_a, "dst_ptrs"_a, "dst_device"_a,
           "checksums"_a = nb::none())
      .def("register_buffer",
           [](Engine& e, uint64_t ptr, uint64_t nbytes, bool device) {
             return e.buffers().add(ptr, nbytes, device);
           },
           "ptr"_a, "nbytes"_a, "device"_a, "Registers memory submit() may use; returns a token.")
      .def("unregister_buffer", [](Engine& e, uint64_t token) { return e.buffers().remove(token); },
           "token"_a)
      .def_prop_ro("buffer_count", [](Engine& e) { return e.buffers().size(); })
      .def("time_row_checks",
           [](Engine& e, Column<int64_t> offsets, Column<uint64_t> lengths, Column<uint64_t> src,
              Column<uint64_t> dst, bool dst_device, int reps) {
             const size_t n = offsets.shape(0);
             if (lengths.shape(0) != n || src.shape(0) != n || dst.shape(0) != n)
               throw std::invalid_argument("time_row_checks: columns must have the same length");
             nb::gil_scoped_release release;
             return e.time_row_checks(offsets.data(), lengths.data(), src.data(), dst.data(), n,
                                      dst_device, reps);
           },
           "file_offsets"_a, "lengths"_a, "src_ptrs"_a, "dst_ptrs"_a, "dst_device"_a, "reps"_a)
      .def("close", &Engine::close, nb::call_guard<GilRelease>())
      .def_prop_ro("closed", &Engine::closed)
      .def_prop_ro("direct_active", &Engine::direct_active)
      .def_prop_ro("fallback_reason", &Engine::fallback_reason)
      .def_prop_ro("path", &Engine::path)
      .def_prop_ro("device", &Engine::device)
      .def_prop_ro("copy_stream", &Engine::copy_stream_handle)
      .def("stats", [](const Engine& e) { return stats_dict(e.stats()); })
      .def("set_faults",
           [](Engine& e, int64_t every_nth, int err, int64_t fail_offset, bool short_reads,
              int64_t delay_us) {
             FaultPlan plan;
             plan.every_nth = every_nth;
             plan.err = err;
             plan.fail_offset = fail_offset;
             plan.short_reads = short_reads;
             plan.delay_us = delay_us;
             e.set_faults(plan);
           },
           "every_nth"_a = 0, "err"_a = 5, "fail_offset"_a = -1, "short_reads"_a = false,
           "delay_us"_a = 0);
}

}  // namespace tierstore::python
