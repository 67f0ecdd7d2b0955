// Thin CUDA runtime wrappers used by the engine and host buffers.
//
// Compiled in every build: without CUDA the functions that need a device throw
// std::runtime_error ("built without CUDA") and the no-op ones do nothing, so
// the engine code carries no #if. Handles are opaque (void*) so this header
// does not pull in cuda_runtime_api.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace tierstore::detail {

// Page-locks [ptr, ptr+n) for DMA (cudaHostRegister, portable). IoError on failure.
void cuda_host_register(void* ptr, size_t nbytes);
void cuda_host_unregister(void* ptr) noexcept;

// The calling thread's current device (-1 without CUDA) and a setter, so a
// call made on a caller's thread can restore what it found.
int cuda_get_device() noexcept;
void cuda_set_device(int device) noexcept;

// One non-blocking copy stream on one device. Methods are thread safe (the
// CUDA runtime serialises submissions to a stream). Every thread that calls
// into it must call bind_thread() first: the current device is per thread.
class CopyStream {
 public:
  explicit CopyStream(int device);  // sets the device, creates its primary context
  ~CopyStream();
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  void bind_thread() const;
  // Enqueue an H2D copy; returns 0 or the cudaError_t code (never throws).
  int memcpy_h2d(void* dst, const void* src, size_t nbytes) noexcept;
  // Events are created without timing. record() enqueues `event` on this stream.
  static void* create_event();
  static void destroy_event(void* event) noexcept;
  int record(void* event) noexcept;
  // 1 done, 0 pending, -code on error.
  static int event_query(void* event) noexcept;
  static int event_synchronize(void* event) noexcept;
  // The raw cudaStream_t of a consumer (e.g. torch's .cuda_stream) waits on event.
  static int stream_wait_event(uintptr_t stream, void* event) noexcept;
  void synchronize() noexcept;
  int device() const noexcept { return device_; }
  uintptr_t handle() const noexcept { return reinterpret_cast<uintptr_t>(stream_); }
  static std::string error_string(int code);

 private:
  int device_;
  void* stream_ = nullptr;
};

}  // namespace tierstore::detail
