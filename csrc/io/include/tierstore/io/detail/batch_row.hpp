// One row of a batch as the engine tracks it (internal to engine.cpp / batch.cpp).
#pragma once
#include <atomic>
#include <cstdint>

#include "tierstore/io/engine.hpp"

namespace tierstore {

struct Batch::Row {
  int64_t index = 0;         // the caller's row number (segments of a split row share it)
  int64_t row_offset = -1;   // the caller's file offset of the whole row
  int64_t file_offset = -1;  // this segment's file offset; -1: arena row, no read
  uint64_t length = 0;
  uint8_t* read_buf = nullptr;  // where the read lands (caller src, host dst or a stage)
  uint8_t* dst = nullptr;       // copy destination; nullptr: no copy
  bool dst_device = false;
  // A checksummed file row: the row's streaming hash (detail/row_hash.hpp), shared by
  // its segments; `landed` (guarded by hash->mutex): every chunk of this segment landed.
  detail::RowHash* hash = nullptr;
  bool landed = false;
  detail::Stage* stage = nullptr;
  std::atomic<int> chunks_left{0};
  std::atomic<int> err{0};
  std::atomic<bool> all_cached{true};
  std::atomic<bool> copy_issued{false};  // some H2D copy reads read_buf (stage: recycle after it)
};

}  // namespace tierstore
