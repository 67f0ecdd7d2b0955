// Row checksums: XXH3-64 (seed 0), the hash the pack sidecar stores per row and
// python's xxhash.xxh3_64_intdigest computes. Implemented by the vendored
// single-header xxHash (csrc/third_party/xxhash, BSD-2), compiled in one unit.
#pragma once
#include <cstddef>
#include <cstdint>

namespace tierstore {

uint64_t xxh3_64(const void* data, size_t nbytes) noexcept;

// The same hash fed piece by piece (xxHash's XXH3 streaming state): update()
// with consecutive pieces of a buffer, then digest(), equals xxh3_64() of the
// whole buffer whatever the piece sizes. This is how a row larger than one
// staging buffer is verified segment by segment as it lands. Not thread safe:
// one thread updates at a time (the engine orders the segments, row_hash.cpp).
class Xxh3Stream {
 public:
  Xxh3Stream();  // std::bad_alloc when the state cannot be allocated
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;

  void update(const void* data, size_t nbytes) noexcept;
  uint64_t digest() const noexcept;  // of everything so far; update() may go on

 private:
  void* state_;  // XXH3_state_t (kept out of this header: xxhash.h is private to checksum.cpp)
};

}  // namespace tierstore
