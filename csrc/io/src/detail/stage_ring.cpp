#include "tierstore/io/detail/stage_ring.hpp"

#include "tierstore/io/detail/cuda_copy.hpp"

namespace tierstore::detail {

StageRing::StageRing(size_t stage_bytes, int count, CopyStream* stream)
    : stage_bytes_(stage_bytes), count_(count), stream_(stream) {}

StageRing::~StageRing() {
  for (auto& s : all_) CopyStream::destroy_event(s->copy_done);
}

Stage* StageRing::acquire(const std::atomic<bool>& stop) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (stop.load()) return nullptr;
    if (!free_.empty()) {
      Stage* s = free_.back();
      free_.pop_back();
      return s;
    }
    // A stage whose copy already completed beats a new allocation (pinning
    // 12 MiB costs milliseconds): the ring stays as small as the load needs.
    if (!copying_.empty() && CopyStream::event_query(copying_.front()->copy_done) != 0) {
      Stage* s = copying_.front();
      copying_.pop_front();
      return s;
    }
    if (int(all_.size()) < count_) {  // grow lazily up to count_
      auto s = std::make_unique<Stage>(Stage{HostBuffer(stage_bytes_, stream_ != nullptr)});
      if (stream_) s->copy_done = CopyStream::create_event();
      all_.push_back(std::move(s));
      return all_.back().get();
    }
    if (!copying_.empty()) {
      // Oldest copy first: it is the one most likely done already.
      Stage* s = copying_.front();
      copying_.pop_front();
      lock.unlock();
      (void)CopyStream::event_synchronize(s->copy_done);
      return s;
    }
    freed_.wait(lock);
  }
}

void StageRing::release_after_copy(Stage* stage) {
  if (!stream_) return release_now(stage);
  (void)stream_->record(stage->copy_done);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    copying_.push_back(stage);
  }
  freed_.notify_one();
}

void StageRing::release_now(Stage* stage) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(stage);
  }
  freed_.notify_one();
}

void StageRing::wake_all() {
  { std::lock_guard<std::mutex> lock(mutex_); }
  freed_.notify_all();
}

}  // namespace tierstore::detail
