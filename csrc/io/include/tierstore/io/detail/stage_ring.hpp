// A bounded ring of (pinned) staging buffers for rows read without a caller
// buffer. A buffer is reused only after the H2D copy that read from it has
// completed on the copy stream (its event fired), so a 512-row fire streams
// through a fixed amount of pinned memory.
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "tierstore/io/host_buffer.hpp"

namespace tierstore::detail {

class CopyStream;

struct Stage {
  HostBuffer buffer;
  void* copy_done = nullptr;  // CUDA event recorded after the copy out of this stage
};

class StageRing {
 public:
  // stream may be null (host-only engine): then buffers are plain memory and
  // are free again as soon as they are released. Buffers are allocated lazily.
  StageRing(size_t stage_bytes, int count, CopyStream* stream);
  ~StageRing();

  size_t stage_bytes() const noexcept { return stage_bytes_; }
  // Blocks until a stage is free; nullptr when `stop` becomes true meanwhile.
  Stage* acquire(const std::atomic<bool>& stop);
  // The caller enqueued a copy out of `stage` on the stream: reusable once it completes.
  void release_after_copy(Stage* stage);
  // Nothing reads from `stage` any more (failed or host-only row).
  void release_now(Stage* stage);
  // Wakes acquire() so it can observe `stop`.
  void wake_all();

 private:
  size_t stage_bytes_;
  int count_;
  CopyStream* stream_;
  std::mutex mutex_;
  std::condition_variable freed_;
  std::vector<std::unique_ptr<Stage>> all_;
  std::vector<Stage*> free_;
  std::deque<Stage*> copying_;  // oldest copy first
};

}  // namespace tierstore::detail
