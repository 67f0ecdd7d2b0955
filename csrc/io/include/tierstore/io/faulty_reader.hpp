// A Reader that wraps another and injects faults into its attempts (tests
// only; the Python face reaches it through Engine::set_faults). Faults act on
// each attempt (one syscall of the wrapped FileReader), so the read loop that
// recovers from them is the production one (Reader::read_exact).
#pragma once
#include <atomic>
#include <cstdint>
#include <mutex>

#include "tierstore/io/reader.hpp"

namespace tierstore {

// All zero/false: no faults.
struct FaultPlan {
  int64_t every_nth = 0;    // the nth, 2nth, ... attempt fails with `err`
  int err = 5;              // EIO
  int64_t fail_offset = -1; // an attempt whose range covers this offset fails with `err`
  bool short_reads = false; // every attempt asks the wrapped reader for at most half
  int64_t delay_us = 0;     // sleep before each attempt (keeps reads in flight for cancel tests)
  bool any() const { return every_nth > 0 || fail_offset >= 0 || short_reads || delay_us > 0; }
};

// Thread safe. `inner` must outlive this reader.
class FaultyReader final : public Reader {
 public:
  explicit FaultyReader(Reader& inner);
  // Replaces the plan and restarts the attempt count (every_nth counts from here).
  void set_plan(const FaultPlan& plan);
  FaultPlan plan() const;
  int64_t attempts() const noexcept { return attempts_.load(); }

 protected:
  ssize_t read_some_impl(uint8_t* buf, size_t len, int64_t offset,
                         ReadAttempt& state) noexcept override;

 private:
  Reader& inner_;
  mutable std::mutex mutex_;  // guards plan_ when it is replaced
  FaultPlan plan_;
  std::atomic<int64_t> attempts_{0};
};

}  // namespace tierstore
