// A blocking FIFO of small read / copy tasks shared by the reader threads.
// FIFO order makes the rows of a batch finish roughly in submission order, so
// the copy of row i overlaps the reads of rows i+1...
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>

namespace tierstore {
class Batch;
}

namespace tierstore::detail {

struct Task {
  Batch* batch;
  uint32_t row;     // index into the batch's internal rows
  uint64_t begin;   // byte offset inside the row
  uint64_t length;  // bytes
};

class TaskQueue {
 public:
  // False (nothing queued) once close() was called: the caller runs them itself.
  bool push(const Task* tasks, size_t n) {
    if (n == 0) return true;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closed_) return false;
      queue_.insert(queue_.end(), tasks, tasks + n);
    }
    if (n == 1) ready_.notify_one(); else ready_.notify_all();
    return true;
  }
  // Blocks for a task; false once close() was called and the queue is empty.
  bool pop(Task& out) {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [&] { return !queue_.empty() || closed_; });
    if (queue_.empty()) return false;
    out = queue_.front();
    queue_.pop_front();
    return true;
  }
  void close() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
    }
    ready_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Task> queue_;
  bool closed_ = false;
};

}  // namespace tierstore::detail
