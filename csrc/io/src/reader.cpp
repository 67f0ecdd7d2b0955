// The read loop shared by every Reader backend (reader.hpp).
#include "tierstore/io/reader.hpp"

#include <cerrno>
#include <limits>

namespace tierstore {

int Reader::read_exact(uint8_t* buf, size_t len, int64_t offset, int64_t* err_offset,
                       bool* from_cache) noexcept {
  *from_cache = true;
  if (len == 0) return 0;
  if (offset < 0 || len > uint64_t(std::numeric_limits<int64_t>::max() - offset)) {
    *err_offset = offset;
    return EINVAL;
  }
  ReadAttempt state;
  size_t done = 0;
  int interrupted = 0;
  while (done < len) {
    const int64_t at = offset + int64_t(done);
    const ssize_t n = read_some_impl(buf + done, len - done, at, state);
    state.first = false;
    if (n == -EINTR && ++interrupted <= kMaxInterruptedRetries) continue;
    if (n < 0) { *err_offset = at; return int(-n); }
    if (n == 0) { *err_offset = at; return ENODATA; }
    if (size_t(n) > len - done) { *err_offset = at; return EIO; }  // a backend bug, not a read
    interrupted = 0;
    done += size_t(n);
  }
  *from_cache = state.from_cache;
  return 0;
}

}  // namespace tierstore
