// Row checksums: XXH3-64 (seed 0), the hash the pack sidecar stores per row and
// python's xxhash.xxh3_64_intdigest computes. Implemented by the vendored
// single-header xxHash (csrc/third_party/xxhash, BSD-2), compiled in one unit.
#pragma once
#include <cstddef>
#include <cstdint>

namespace tierstore {

uint64_t xxh3_64(const void* data, size_t nbytes) noexcept;

}  // namespace tierstore
