#include "tierstore/io/runtime.hpp"

#if TIERSTORE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tierstore {

bool built_with_cuda() noexcept { return TIERSTORE_WITH_CUDA != 0; }

int cuda_device_count() noexcept {
#if TIERSTORE_WITH_CUDA
  int n = 0;
  // No driver or no device is a normal state on CPU machines: report 0 and
  // clear the sticky error so later calls start clean.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

int cuda_runtime_version() noexcept {
#if TIERSTORE_WITH_CUDA
  return CUDART_VERSION;
#else
  return 0;
#endif
}

}  // namespace tierstore
