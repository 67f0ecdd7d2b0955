// Positional reads of one file, split the CacheLib Device way: the public
// non-virtual read_exact() owns the loop every backend needs (short reads,
// bounded EINTR retries, end of file inside a range, the failing offset) and
// backends implement one protected hook, read_some_impl(): a single attempt
// that may return fewer bytes than asked. A test backend (FaultyReader) wraps a
// real one and injects faults at that seam, so the production reader carries
// no fault hooks and the loop under test is the production loop.
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace tierstore {

// State of one read_exact() call, carried across its attempts. Backends may
// keep a private decision for the rest of the call in `mode` (e.g. "this range
// is cached: read it buffered") and clear `from_cache` when a byte came from disk.
struct ReadAttempt {
  bool first = true;       // the call's first attempt (the whole range is still ahead)
  bool from_cache = true;  // out: every byte so far came from the page cache
  uint8_t mode = 0;        // backend-private, 0 on the first attempt
};

// Consecutive EINTRs one read_exact() tolerates before it reports EINTR: a
// signal storm (or an injected EINTR that repeats) surfaces instead of spinning.
constexpr int kMaxInterruptedRetries = 16;

// Thread safe: every method may be called from many threads at once.
class Reader {
 public:
  virtual ~Reader() = default;
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  // Reads exactly [offset, offset+len) into buf. Returns 0, or an errno with
  // *err_offset set to where the failing attempt started: ENODATA for an end
  // of file inside the range, EINTR after kMaxInterruptedRetries interrupted
  // attempts in a row, EINVAL for a negative or overflowing range. *from_cache
  // (on success): true when every byte came from the page cache.
  int read_exact(uint8_t* buf, size_t len, int64_t offset, int64_t* err_offset,
                 bool* from_cache) noexcept;
  // One attempt at a prefix of [offset, offset+len): bytes read (> 0, maybe
  // fewer than len), 0 at end of file, or -errno. Public so a wrapping backend
  // can forward to the reader it wraps.
  ssize_t read_some(uint8_t* buf, size_t len, int64_t offset, ReadAttempt& state) noexcept {
    return read_some_impl(buf, len, offset, state);
  }

  // Closes the backend's file descriptors. Only after the last read has
  // returned (the engine calls it from close(), once its workers are joined);
  // path() and the other accessors stay valid.
  void release_files() noexcept { release_files_impl(); }

  const std::string& path() const noexcept { return path_; }
  bool direct_active() const noexcept { return direct_active_; }
  // Why O_DIRECT is not in use although it was asked for ("" otherwise).
  const std::string& fallback_reason() const noexcept { return fallback_reason_; }
  int64_t size_at_open() const noexcept { return size_at_open_; }

 protected:
  Reader() = default;
  virtual ssize_t read_some_impl(uint8_t* buf, size_t len, int64_t offset,
                                 ReadAttempt& state) noexcept = 0;
  virtual void release_files_impl() noexcept {}

  std::string path_;
  bool direct_active_ = false;
  std::string fallback_reason_;
  int64_t size_at_open_ = 0;
};

}  // namespace tierstore
