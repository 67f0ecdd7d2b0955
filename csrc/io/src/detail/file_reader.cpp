#include "tierstore/io/detail/file_reader.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "tierstore/io/error.hpp"
#include "tierstore/io/host_buffer.hpp"

namespace tierstore::detail {

namespace {
inline int64_t round_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }
inline int64_t round_down(int64_t v, int64_t a) { return v / a * a; }
}  // namespace

FileReader::FileReader(std::string path, DirectMode mode, bool probe_cache)
    : path_(std::move(path)), probe_cache_(probe_cache) {
  fd_buffered_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  TS_CHECK_ERRNO(fd_buffered_ >= 0, path_, -1, "open");
  struct stat st {};
  if (fstat(fd_buffered_, &st) == 0) size_at_open_ = st.st_size;
  if (mode == DirectMode::off) return;

  // Probe: the open (tmpfs before 6.6, procfs: EINVAL) and one aligned read
  // (some filesystems accept the flag and refuse the read).
  int err = 0;
  int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  if (fd < 0) {
    err = errno;
  } else if (size_at_open_ >= int64_t(kDirectAlign)) {
    HostBuffer probe(kDirectAlign, /*pin=*/false);
    if (::pread(fd, probe.data(), kDirectAlign, 0) < 0) err = errno;
  }
  if (err == 0) {
    fd_direct_ = fd;
    return;
  }
  if (fd >= 0) ::close(fd);
  if (mode == DirectMode::on) {
    ::close(fd_buffered_);
    fd_buffered_ = -1;
    errno = err;
    TS_CHECK_ERRNO(false, path_, -1,
                   "O_DIRECT refused by the filesystem (direct=\"on\"; use direct=\"auto\" "
                   "to fall back to buffered reads, or \"off\")");
  }
  fallback_reason_ = path_ + ": O_DIRECT refused (" + errno_text(err) + "); using buffered reads";
}

FileReader::~FileReader() {
  if (fd_direct_ >= 0) ::close(fd_direct_);
  if (fd_buffered_ >= 0) ::close(fd_buffered_);
}

void FileReader::set_faults(const FaultPlan& plan) {
  std::lock_guard<std::mutex> lock(faults_mutex_);
  faults_ = plan;
  syscalls_.store(0);
  faults_on_.store(plan.any());
}

ssize_t FileReader::sys_read(int fd, bool direct, uint8_t* buf, size_t len, int64_t offset,
                             bool nowait) noexcept {
  if (faults_on_.load(std::memory_order_relaxed)) {
    FaultPlan plan;
    {
      std::lock_guard<std::mutex> lock(faults_mutex_);
      plan = faults_;
    }
    const int64_t nth = syscalls_.fetch_add(1) + 1;
    if (plan.delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(plan.delay_us));
    if (plan.every_nth > 0 && nth % plan.every_nth == 0) return -plan.err;
    if (plan.fail_offset >= offset && plan.fail_offset < offset + int64_t(len)) return -plan.err;
    if (plan.short_reads && len > 1) {
      size_t shorter = len / 2;
      if (direct) shorter = shorter / kDirectAlign * kDirectAlign;
      if (shorter > 0) len = shorter;
    }
  }
  struct iovec iov {buf, len};
  ssize_t n = nowait ? ::preadv2(fd, &iov, 1, offset, RWF_NOWAIT) : ::pread(fd, buf, len, offset);
  return n < 0 ? -errno : n;
}

int FileReader::read_loop(int fd, bool direct, bool try_nowait, uint8_t* buf, size_t len,
                          int64_t offset, int64_t* err_offset, bool* from_cache) noexcept {
  size_t done = 0;
  // Try the page cache without blocking first: a full answer means "cached".
  bool nowait = try_nowait && !direct && nowait_supported_.load(std::memory_order_relaxed);
  while (done < len) {
    const int64_t at = offset + int64_t(done);
    ssize_t n = sys_read(fd, direct, buf + done, len - done, at, nowait);
    if (nowait) {
      if (n == -EAGAIN || n == -EWOULDBLOCK) { *from_cache = false; nowait = false; continue; }
      if (n == -EOPNOTSUPP || n == -EINVAL) {
        nowait_supported_.store(false);
        nowait = false;
        continue;
      }
    }
    if (n == -EINTR) continue;
    if (n < 0) { *err_offset = at; return int(-n); }
    if (n == 0) { *err_offset = at; return ENODATA; }
    done += size_t(n);
    if (done < len) {
      if (nowait) *from_cache = false;  // partly cached: the rest blocks
      nowait = false;
      // An O_DIRECT read that stopped off-alignment cannot continue with O_DIRECT.
      if (direct && (done % kDirectAlign) != 0) {
        return read_loop(fd_buffered_, false, false, buf + done, len - done, at + n, err_offset,
                         from_cache);
      }
    }
  }
  return 0;
}

int FileReader::read_exact(uint8_t* buf, size_t len, int64_t offset, int64_t* err_offset,
                           bool* from_cache) noexcept {
  *from_cache = true;
  if (len == 0) return 0;
  if (fd_direct_ < 0) return read_loop(fd_buffered_, false, true, buf, len, offset, err_offset, from_cache);
  // 1. Fully cached ranges are read from the page cache. The check is
  //    cachestat (Linux 6.5+), which does no I/O: an RWF_NOWAIT probe would
  //    start buffered readahead on a miss and double the disk traffic.
  size_t done = 0;
  if (probe_cache_ && cachestat_supported_.load(std::memory_order_relaxed)) {
    if (range_cached(offset, len))
      return read_loop(fd_buffered_, false, false, buf, len, offset, err_offset, from_cache);
  }
  if (probe_cache_ && !cachestat_supported_.load(std::memory_order_relaxed) &&
      nowait_supported_.load(std::memory_order_relaxed)) {
    // Kernel without cachestat: take what the cache holds with RWF_NOWAIT (a
    // miss may start some readahead; better than sending cached rows to disk).
    ssize_t n = sys_read(fd_buffered_, false, buf, len, offset, /*nowait=*/true);
    if (n == ssize_t(len)) return 0;
    if (n == -EOPNOTSUPP || n == -EINVAL) nowait_supported_.store(false);
    else if (n == 0) { *err_offset = offset; return ENODATA; }
    else if (n > 0) done = size_t(n);
    else if (n != -EAGAIN && n != -EWOULDBLOCK && n != -EINTR) { *err_offset = offset; return int(-n); }
  }
  // 2. Otherwise from disk.
  *from_cache = false;
  return read_direct(buf + done, len - done, offset + int64_t(done), err_offset, from_cache);
}

bool FileReader::range_cached(int64_t offset, size_t len) noexcept {
  struct { uint64_t off, len; } range{uint64_t(round_down(offset, kDirectAlign)), 0};
  range.len = uint64_t(round_up(offset + int64_t(len), kDirectAlign)) - range.off;
  struct { uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted; } cs{};
  constexpr long kSysCachestat = 451;  // same number on every architecture
  if (::syscall(kSysCachestat, fd_buffered_, &range, &cs, 0) != 0) {
    cachestat_supported_.store(false);  // ENOSYS (kernel < 6.5) or refused: stop asking
    return false;
  }
  return cs.nr_cache * kDirectAlign >= range.len;
}

int FileReader::read_direct(uint8_t* buf, size_t len, int64_t offset, int64_t* err_offset,
                            bool* from_cache) noexcept {
  const int64_t end = offset + int64_t(len);
  const int64_t a = round_up(offset, kDirectAlign);
  const int64_t b = round_down(end, kDirectAlign);
  const bool buffer_lines_up =
      ((reinterpret_cast<uintptr_t>(buf) + uintptr_t(a - offset)) % kDirectAlign) == 0;
  if (b <= a || !buffer_lines_up)
    return read_loop(fd_buffered_, false, false, buf, len, offset, err_offset, from_cache);
  // Unaligned head and tail buffered, aligned middle O_DIRECT.
  int rc = 0;
  if (a > offset)
    rc = read_loop(fd_buffered_, false, false, buf, size_t(a - offset), offset, err_offset, from_cache);
  if (rc == 0)
    rc = read_loop(fd_direct_, true, false, buf + (a - offset), size_t(b - a), a, err_offset, from_cache);
  if (rc == 0 && end > b)
    rc = read_loop(fd_buffered_, false, false, buf + (b - offset), size_t(end - b), b, err_offset,
                   from_cache);
  *from_cache = false;  // O_DIRECT bypasses the page cache: count the row as disk
  return rc;
}

}  // namespace tierstore::detail
