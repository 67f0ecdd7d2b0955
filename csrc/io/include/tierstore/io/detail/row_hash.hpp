// The streaming checksum of one caller row (internal to the engine).
//
// A checksummed row is cut into segments of at most stage_bytes (one staging
// buffer each when it has no caller memory), every segment read in parallel
// chunks like any row. A segment "lands" when its last chunk has landed; the
// segments of a row may land in any order, but XXH3 must see the bytes in
// order, so a segment is hashed only once every segment before it was: the
// thread that lands the next segment to hash feeds it to the row's state, then
// every later segment that landed meanwhile (their stages are held until
// then), and completes each one after hashing it. Hashing runs outside the
// mutex, so other readers only mark their segment landed and go on reading.
// The last segment's completion compares the digest with the sidecar's value:
// a mismatch fails the row (EBADMSG at the row's offset) before the batch can
// finish, so the caller never sees it succeed.
//
// No deadlock from held stages: the dispatcher hands out stages in FIFO order,
// so every segment before a held one already has its stage and will land.
#pragma once
#include <cstdint>
#include <mutex>

#include "tierstore/io/checksum.hpp"

namespace tierstore::detail {

struct RowHash {
  Xxh3Stream state;
  uint64_t expected = 0;   // the sidecar's XXH3-64 of the whole row
  uint64_t length = 0;     // the whole row's bytes
  uint32_t first = 0;      // internal row index of segment 0
  uint32_t count = 0;      // segments
  // Guarded by mutex (and Batch::Row::landed of this row's segments):
  std::mutex mutex;
  uint32_t hashed = 0;     // segments [first, first + hashed) are hashed and completed
  bool draining = false;   // a thread is hashing the landed prefix
  bool failed = false;     // a segment failed: hash no further, only complete the rest
};

}  // namespace tierstore::detail
