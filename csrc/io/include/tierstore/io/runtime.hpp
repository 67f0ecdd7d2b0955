// Build and device facts the Python layer asks about. No policy, no Python.
#pragma once
#include <string>

namespace tierstore {

// True when the module was compiled with CUDA support.
bool built_with_cuda() noexcept;

// Number of CUDA devices the driver reports; 0 when built without CUDA, when
// no driver is installed or when no device is visible. Never throws.
int cuda_device_count() noexcept;

// The CUDA runtime version the module was built against (e.g. 13000), or 0.
int cuda_runtime_version() noexcept;

}  // namespace tierstore
