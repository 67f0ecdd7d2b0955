// Positional reads of one file: buffered pread, O_DIRECT for the page-aligned
// middle of a range, short-read loops, page-cache classification, fault hooks.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

namespace tierstore::detail {

enum class DirectMode { off, on, automatic };

constexpr size_t kDirectAlign = 4096;  // O_DIRECT offset / length / buffer alignment we use

// Test-only faults, applied to each read syscall. All zero/false: no faults.
struct FaultPlan {
  int64_t every_nth = 0;    // the nth, 2nth, ... syscall fails with `err`
  int err = 5;              // EIO
  int64_t fail_offset = -1; // a syscall whose range covers this offset fails with `err`
  bool short_reads = false; // every syscall returns at most half of what it was asked
  int64_t delay_us = 0;     // sleep before each syscall (keeps reads in flight for cancel tests)
  bool any() const { return every_nth > 0 || fail_offset >= 0 || short_reads || delay_us > 0; }
};

// Thread safe: every method may be called from many threads at once.
class FileReader {
 public:
  // Opens `path` read-only. mode on: O_DIRECT must open and read, else IoError
  // naming the path and errno; automatic: probe O_DIRECT, fall back to
  // buffered (fallback_reason() says why); off: buffered only.
  // probe_cache (O_DIRECT in use): a range the page cache holds entirely
  // (cachestat, no I/O) is read buffered; everything else goes to O_DIRECT.
  // The page cache then stays an opportunistic tier. Without cachestat
  // (kernel < 6.5) every O_DIRECT-eligible range goes to O_DIRECT.
  FileReader(std::string path, DirectMode mode, bool probe_cache = true);
  ~FileReader();
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  const std::string& path() const noexcept { return path_; }
  bool direct_active() const noexcept { return fd_direct_ >= 0; }
  const std::string& fallback_reason() const noexcept { return fallback_reason_; }
  int64_t size_at_open() const noexcept { return size_at_open_; }

  // Reads exactly [offset, offset+len) into buf. Returns 0, or an errno with
  // *err_offset set to where the failing syscall started (ENODATA: end of file
  // inside the range). *from_cache: true when every byte came from the page
  // cache without blocking (RWF_NOWAIT), false for disk or O_DIRECT reads.
  int read_exact(uint8_t* buf, size_t len, int64_t offset, int64_t* err_offset,
                 bool* from_cache) noexcept;

  void set_faults(const FaultPlan& plan);

 private:
  // Loops until [buf, buf+len) is filled from fd; nowait tries RWF_NOWAIT first.
  int read_loop(int fd, bool direct, bool try_nowait, uint8_t* buf, size_t len, int64_t offset,
                int64_t* err_offset, bool* from_cache) noexcept;
  bool range_cached(int64_t offset, size_t len) noexcept;
  // The O_DIRECT path: unaligned head/tail buffered, aligned middle direct.
  int read_direct(uint8_t* buf, size_t len, int64_t offset, int64_t* err_offset,
                  bool* from_cache) noexcept;
  // One syscall, faults applied. Returns bytes read or -errno.
  ssize_t sys_read(int fd, bool direct, uint8_t* buf, size_t len, int64_t offset,
                   bool nowait) noexcept;

  std::string path_;
  int fd_buffered_ = -1;
  int fd_direct_ = -1;
  int64_t size_at_open_ = 0;
  std::string fallback_reason_;
  bool probe_cache_ = true;
  std::atomic<bool> nowait_supported_{true};
  std::atomic<bool> cachestat_supported_{true};

  std::atomic<bool> faults_on_{false};
  std::mutex faults_mutex_;  // guards faults_ when it is replaced
  FaultPlan faults_;
  std::atomic<int64_t> syscalls_{0};
};

}  // namespace tierstore::detail
