#include "tierstore/io/detail/file_reader.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "tierstore/io/error.hpp"
#include "tierstore/io/host_buffer.hpp"

namespace tierstore::detail {

namespace {
inline int64_t round_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }
inline int64_t round_down(int64_t v, int64_t a) { return v / a * a; }
inline ssize_t pread_or_errno(int fd, uint8_t* buf, size_t len, int64_t offset) {
  const ssize_t n = ::pread(fd, buf, len, offset);
  return n < 0 ? -errno : n;
}
}  // namespace

FileReader::FileReader(std::string path, DirectMode mode, bool probe_cache)
    : probe_cache_(probe_cache) {
  path_ = std::move(path);
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
    direct_active_ = true;
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

FileReader::~FileReader() { release_files_impl(); }

void FileReader::release_files_impl() noexcept {
  if (fd_direct_ >= 0) ::close(fd_direct_);
  if (fd_buffered_ >= 0) ::close(fd_buffered_);
  fd_direct_ = fd_buffered_ = -1;
}

// How a whole read_exact() call reads, decided on its first attempt.
FileReader::Mode FileReader::decide(int64_t offset, size_t len, ReadAttempt& state) noexcept {
  const bool nowait = nowait_supported_.load(std::memory_order_relaxed);
  if (fd_direct_ < 0) return nowait ? kNowaitThenBuffered : kBuffered;
  if (probe_cache_ && cachestat_supported_.load(std::memory_order_relaxed)) {
    // cachestat (Linux 6.5+) does no I/O: an RWF_NOWAIT probe would start
    // buffered readahead on a miss and double the disk traffic.
    if (range_cached(offset, len)) return kBuffered;
  }
  if (probe_cache_ && !cachestat_supported_.load(std::memory_order_relaxed) && nowait) {
    // Kernel without cachestat: take what the cache holds with RWF_NOWAIT (a
    // miss may start some readahead; better than sending cached rows to disk).
    return kNowaitThenDirect;
  }
  state.from_cache = false;
  return kDirect;
}

ssize_t FileReader::read_some_impl(uint8_t* buf, size_t len, int64_t offset,
                                   ReadAttempt& state) noexcept {
  if (state.mode == kUndecided) state.mode = decide(offset, len, state);
  const Mode mode = Mode(state.mode);
  if (mode == kNowaitThenBuffered || mode == kNowaitThenDirect) {
    const Mode after = mode == kNowaitThenBuffered ? kBuffered : kDirect;
    struct iovec iov {buf, len};
    ssize_t n = ::preadv2(fd_buffered_, &iov, 1, offset, RWF_NOWAIT);
    if (n < 0) n = -errno;
    if (n == -EOPNOTSUPP || n == -EINVAL) nowait_supported_.store(false);
    if (n == -EAGAIN || n == -EWOULDBLOCK || n == -EOPNOTSUPP || n == -EINVAL) {
      state.mode = after;
      if (n == -EAGAIN || n == -EWOULDBLOCK || after == kDirect) state.from_cache = false;
      return after == kDirect ? direct_attempt(buf, len, offset)
                              : pread_or_errno(fd_buffered_, buf, len, offset);
    }
    if (n > 0 && size_t(n) < len) {  // partly cached: the rest blocks
      state.mode = after;
      state.from_cache = false;
    }
    return n;
  }
  if (mode == kDirect) return direct_attempt(buf, len, offset);
  return pread_or_errno(fd_buffered_, buf, len, offset);
}

ssize_t FileReader::direct_attempt(uint8_t* buf, size_t len, int64_t offset) noexcept {
  const int64_t end = offset + int64_t(len);
  const int64_t a = round_up(offset, kDirectAlign);
  const int64_t b = round_down(end, kDirectAlign);
  const bool buffer_lines_up =
      ((reinterpret_cast<uintptr_t>(buf) + uintptr_t(a - offset)) % kDirectAlign) == 0;
  if (b <= a || !buffer_lines_up) return pread_or_errno(fd_buffered_, buf, len, offset);
  if (a > offset) return pread_or_errno(fd_buffered_, buf, size_t(a - offset), offset);
  // A short O_DIRECT read that stops off-alignment is resumed by the next
  // attempt: its head up to the next page goes buffered, then O_DIRECT again.
  return pread_or_errno(fd_direct_, buf, size_t(b - a), a);
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

}  // namespace tierstore::detail
