// The production Reader: buffered pread, O_DIRECT for the page-aligned middle
// of a range, page-cache classification. One attempt is one syscall (two when
// an RWF_NOWAIT probe misses); the loop around attempts is Reader::read_exact.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "tierstore/io/reader.hpp"

namespace tierstore::detail {

enum class DirectMode { off, on, automatic };

constexpr size_t kDirectAlign = 4096;  // O_DIRECT offset / length / buffer alignment we use

class FileReader final : public Reader {
 public:
  // Opens `path` read-only. mode on: O_DIRECT must open and read, else IoError
  // naming the path and errno; automatic: probe O_DIRECT, fall back to
  // buffered (fallback_reason() says why); off: buffered only.
  // probe_cache (O_DIRECT in use): a range the page cache holds entirely
  // (cachestat, no I/O) is read buffered; everything else goes to O_DIRECT.
  // The page cache then stays an opportunistic tier. Without cachestat
  // (kernel < 6.5) an RWF_NOWAIT probe takes what the cache holds first.
  FileReader(std::string path, DirectMode mode, bool probe_cache = true);
  ~FileReader() override;

 protected:
  ssize_t read_some_impl(uint8_t* buf, size_t len, int64_t offset,
                         ReadAttempt& state) noexcept override;
  void release_files_impl() noexcept override;

 private:
  // ReadAttempt::mode values: how the rest of one read_exact() call reads.
  enum Mode : uint8_t { kUndecided = 0, kBuffered, kNowaitThenBuffered, kNowaitThenDirect, kDirect };
  Mode decide(int64_t offset, size_t len, ReadAttempt& state) noexcept;
  // The O_DIRECT path, one syscall: an unaligned head or tail (or a buffer
  // that does not line up) buffered, the aligned middle O_DIRECT.
  ssize_t direct_attempt(uint8_t* buf, size_t len, int64_t offset) noexcept;
  bool range_cached(int64_t offset, size_t len) noexcept;

  int fd_buffered_ = -1;
  int fd_direct_ = -1;
  bool probe_cache_ = true;
  std::atomic<bool> nowait_supported_{true};
  std::atomic<bool> cachestat_supported_{true};
};

}  // namespace tierstore::detail
