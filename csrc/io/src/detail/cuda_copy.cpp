#include "tierstore/io/detail/cuda_copy.hpp"

#include <cerrno>
#include <stdexcept>

#include "tierstore/io/error.hpp"

#if TIERSTORE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tierstore::detail {

#if TIERSTORE_WITH_CUDA

namespace {
[[noreturn]] void throw_cuda(cudaError_t code, const char* what) {
  (void)cudaGetLastError();  // clear the sticky error so later calls start clean
  throw IoError("<cuda>", -1, EIO, std::string(what) + ": " + cudaGetErrorName(code) + " (" +
                                       cudaGetErrorString(code) + ")");
}
#define TS_CUDA_CHECK(expr, what)                  \
  do {                                             \
    cudaError_t ts_code_ = (expr);                 \
    if (ts_code_ != cudaSuccess) throw_cuda(ts_code_, what); \
  } while (0)
}  // namespace

void cuda_host_register(void* ptr, size_t nbytes) {
  // Mapped: kernels may read the buffer over UVA (device-side residency's page-in of
  // arena rows, csrc/kernels/src/residency.cu); it costs nothing for the copy engine.
  TS_CUDA_CHECK(cudaHostRegister(ptr, nbytes, cudaHostRegisterPortable | cudaHostRegisterMapped),
                "cudaHostRegister");
}

void cuda_host_unregister(void* ptr) noexcept { (void)cudaHostUnregister(ptr); }

int cuda_get_device() noexcept {
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return d;
}

void cuda_set_device(int device) noexcept {
  if (device >= 0) (void)cudaSetDevice(device);
}

CopyStream::CopyStream(int device) : device_(device) {
  TS_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice");
  TS_CUDA_CHECK(cudaFree(nullptr), "cudaFree(0) (context init)");
  cudaStream_t s = nullptr;
  TS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_ = s;
}

CopyStream::~CopyStream() {
  if (stream_) {
    (void)cudaSetDevice(device_);
    (void)cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
}

void CopyStream::bind_thread() const { TS_CUDA_CHECK(cudaSetDevice(device_), "cudaSetDevice"); }

int CopyStream::memcpy_h2d(void* dst, const void* src, size_t nbytes) noexcept {
  return int(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice,
                             static_cast<cudaStream_t>(stream_)));
}

void* CopyStream::create_event() {
  cudaEvent_t e = nullptr;
  TS_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  return e;
}

void CopyStream::destroy_event(void* event) noexcept {
  if (event) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

int CopyStream::record(void* event) noexcept {
  return int(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream_)));
}

int CopyStream::event_query(void* event) noexcept {
  cudaError_t c = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (c == cudaSuccess) return 1;
  if (c == cudaErrorNotReady) return 0;
  return -int(c);
}

int CopyStream::event_synchronize(void* event) noexcept {
  return int(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}

int CopyStream::stream_wait_event(uintptr_t stream, void* event) noexcept {
  return int(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(stream),
                                 static_cast<cudaEvent_t>(event), 0));
}

void CopyStream::synchronize() noexcept {
  (void)cudaSetDevice(device_);
  (void)cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
}

std::string CopyStream::error_string(int code) {
  auto c = static_cast<cudaError_t>(code);
  return std::string(cudaGetErrorName(c)) + " (" + cudaGetErrorString(c) + ")";
}

#else  // built without CUDA

namespace {
[[noreturn]] void no_cuda() { throw std::runtime_error("tierstore was built without CUDA"); }
}  // namespace

void cuda_host_register(void*, size_t) { no_cuda(); }
void cuda_host_unregister(void*) noexcept {}
int cuda_get_device() noexcept { return -1; }
void cuda_set_device(int) noexcept {}
CopyStream::CopyStream(int device) : device_(device) { no_cuda(); }
CopyStream::~CopyStream() = default;
void CopyStream::bind_thread() const {}
int CopyStream::memcpy_h2d(void*, const void*, size_t) noexcept { return 1; }
void* CopyStream::create_event() { no_cuda(); }
void CopyStream::destroy_event(void*) noexcept {}
int CopyStream::record(void*) noexcept { return 1; }
int CopyStream::event_query(void*) noexcept { return 1; }
int CopyStream::event_synchronize(void*) noexcept { return 0; }
int CopyStream::stream_wait_event(uintptr_t, void*) noexcept { return 1; }
void CopyStream::synchronize() noexcept {}
std::string CopyStream::error_string(int code) { return "CUDA error " + std::to_string(code); }

#endif

}  // namespace tierstore::detail
