#include "tierstore/io/faulty_reader.hpp"

#include <chrono>
#include <thread>

#include "tierstore/io/detail/file_reader.hpp"

namespace tierstore {

FaultyReader::FaultyReader(Reader& inner) : inner_(inner) {
  path_ = inner.path();
  direct_active_ = inner.direct_active();
  fallback_reason_ = inner.fallback_reason();
  size_at_open_ = inner.size_at_open();
}

void FaultyReader::set_plan(const FaultPlan& plan) {
  std::lock_guard<std::mutex> lock(mutex_);
  plan_ = plan;
  attempts_.store(0);
}

FaultPlan FaultyReader::plan() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return plan_;
}

ssize_t FaultyReader::read_some_impl(uint8_t* buf, size_t len, int64_t offset,
                                     ReadAttempt& state) noexcept {
  const FaultPlan plan = this->plan();  // a copy: set_plan may run meanwhile
  const int64_t nth = attempts_.fetch_add(1) + 1;
  if (plan.delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(plan.delay_us));
  if (plan.every_nth > 0 && nth % plan.every_nth == 0) return -plan.err;
  if (plan.fail_offset >= offset && plan.fail_offset < offset + int64_t(len)) return -plan.err;
  if (plan.short_reads && len > 1) {
    // Half, kept page-sized when it can be so the O_DIRECT middle is exercised too.
    size_t shorter = len / 2;
    if (shorter >= detail::kDirectAlign) shorter = shorter / detail::kDirectAlign * detail::kDirectAlign;
    len = shorter;
  }
  return inner_.read_some(buf, len, offset, state);
}

}  // namespace tierstore
