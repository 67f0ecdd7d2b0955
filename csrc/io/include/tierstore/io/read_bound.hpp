// The physical bound of a read path, measured in C++ with nothing else in the
// way: N plain threads pread rows of one file into pinned host memory (each
// row its own destination, like a fire). Benchmarks report fires against it in
// the same run (`tierstore bench fire`). No engine, no Python in the loop.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace tierstore {

struct ReadBoundResult {
  double best_s = 0;     // fastest pass, seconds
  double median_s = 0;   // median pass
  uint64_t bytes = 0;    // bytes read per pass
  bool pinned = false;   // destination registered with CUDA
  bool direct = false;   // O_DIRECT was used
};

// Reads rows [offsets[i], offsets[i] + row_bytes) in pieces of chunk_bytes,
// `threads` threads taking pieces from one counter, `passes` times. direct:
// O_DIRECT (row_bytes and chunk_bytes rounded up to 4 KiB; offsets must be
// 4 KiB aligned). Throws IoError on open/read failure.
ReadBoundResult measure_read_bound(const std::string& path, const int64_t* offsets, size_t n,
                                   uint64_t row_bytes, int threads, bool direct,
                                   uint64_t chunk_bytes, int passes);

}  // namespace tierstore
