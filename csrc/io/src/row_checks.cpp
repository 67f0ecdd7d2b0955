// Engine::submit's argument checks (submit once trusted raw lengths, and a 1 TiB
// length wrote past a 4 KiB buffer). First each row's own arguments, then
// every src/dst range against the registered buffers (BufferTable): nothing is
// submitted unless every row passes.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>

#include "tierstore/io/engine.hpp"
#include "tierstore/io/error.hpp"

namespace tierstore {

namespace {

[[noreturn]] void refuse(size_t i, int64_t off, uint64_t len, uint64_t src, uint64_t dst,
                         const char* why) {
  char msg[400];
  std::snprintf(msg, sizeof msg, "submit: row %zu (file_offset %lld, length %llu, src %#llx, "
                "dst %#llx): %s", i, (long long)off, (unsigned long long)len,
                (unsigned long long)src, (unsigned long long)dst, why);
  TS_EXPECT(false, msg);
  __builtin_unreachable();
}

[[noreturn]] void out_of_bounds(size_t i, int64_t off, uint64_t len, const char* name,
                                uint64_t ptr, const char* why) {
  char msg[400];
  std::snprintf(msg, sizeof msg, "submit: row %zu (file_offset %lld, length %llu): %s %#llx %s",
                i, (long long)off, (unsigned long long)len, name, (unsigned long long)ptr, why);
  throw BoundsError(msg);
}

}  // namespace

void Engine::check_rows(const int64_t* file_offsets, const uint64_t* lengths, const uint64_t* src,
                        const uint64_t* dst, size_t n, bool dst_device) const {
  for (size_t i = 0; i < n; ++i) {
    const int64_t off = file_offsets[i];
    const uint64_t len = lengths[i];
    const char* why = nullptr;
    if (off < -1) why = "file_offset must be >= 0, or -1 with a src";
    else if (len == 0 || len > kMaxRowBytes) why = "length must be in 1..2^36";
    else if (off == -1 && src[i] == 0) why = "file_offset -1 (no read) needs a src";
    else if (off >= 0 && len > uint64_t(INT64_MAX - off)) why = "file_offset + length overflows";
    else if (src[i] + len < src[i] || dst[i] + len < dst[i]) why = "src/dst + length overflows";
    if (why) refuse(i, off, len, src[i], dst[i], why);
  }
  // One shared lock for the whole batch; a row is one binary search per pointer.
  const BufferTable::Reader table(buffers_);
  std::string scratch;
  for (size_t i = 0; i < n; ++i) {
    if (src[i]) {
      if (const char* why = table.check(src[i], lengths[i], false, scratch))
        out_of_bounds(i, file_offsets[i], lengths[i], "src", src[i], why);
    }
    if (dst[i]) {
      if (const char* why = table.check(dst[i], lengths[i], dst_device, scratch))
        out_of_bounds(i, file_offsets[i], lengths[i], "dst", dst[i], why);
    }
  }
}

double Engine::time_row_checks(const int64_t* file_offsets, const uint64_t* lengths,
                               const uint64_t* src, const uint64_t* dst, size_t n, bool dst_device,
                               int reps) const {
  double best = 1e30;
  for (int r = 0; r < std::max(reps, 1); ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    check_rows(file_offsets, lengths, src, dst, n, dst_device);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace tierstore
