// Batch (completion) methods; the row bookkeeping shared with engine.cpp is in
// detail/batch_row.hpp.
#include <algorithm>
#include <cerrno>
#include <chrono>

#include "tierstore/io/detail/batch_row.hpp"
#include "tierstore/io/detail/cuda_copy.hpp"
#include "tierstore/io/detail/row_hash.hpp"
#include "tierstore/io/engine.hpp"

namespace tierstore {

using detail::CopyStream;

Batch::~Batch() { CopyStream::destroy_event(event_); }

bool Batch::wait(double timeout_s) {
  if (!done()) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto ready = [&] { return done_.load(std::memory_order_acquire); };
    if (timeout_s < 0) {
      done_cv_.wait(lock, ready);
    } else if (!done_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), ready)) {
      return false;
    }
  }
  // Chunks of the failed row and of its siblings may still be on the copy
  // stream: drain them (host sync on the failure path only) before the caller
  // hears of the failure and reuses or frees its slots.
  if (err_ != 0 && has_h2d_) (void)CopyStream::event_synchronize(event_);
  return true;
}

std::vector<int64_t> Batch::failed_rows() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failed_;
}

int Batch::stream_wait(uintptr_t stream) {
  wait(-1);
  if (!has_h2d_) return 0;
  return CopyStream::stream_wait_event(stream, event_);
}

int Batch::synchronize() {
  wait(-1);
  if (!has_h2d_) return 0;
  return CopyStream::event_synchronize(event_);
}

void Batch::fail_row(Row& row, int err, int64_t at, const std::string& why) {
  int expected = 0;
  if (!row.err.compare_exchange_strong(expected, err)) return;  // first error of the row wins
  std::lock_guard<std::mutex> lock(mutex_);
  failed_.push_back(row.index);
  // Report a real failure over a cancellation caused by it or by close().
  if (err_ == 0 || (err_ == ECANCELED && err != ECANCELED)) {
    err_ = err;
    err_row_ = row.index;
    err_row_offset_ = row.row_offset;
    err_offset_ = at;
    err_message_ = why;
  }
}

void Batch::finish(CopyStream* stream) {
  std::shared_ptr<Batch> keep = std::move(self_);  // may be the last owner: release at return
  if (has_h2d_ && stream) (void)stream->record(event_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::sort(failed_.begin(), failed_.end());
    failed_.erase(std::unique(failed_.begin(), failed_.end()), failed_.end());
    done_.store(true, std::memory_order_release);
  }
  done_cv_.notify_all();
}

}  // namespace tierstore
