// Engine::submit's argument checks (issue 15: submit trusted raw lengths, and a
// 1 TiB length wrote past a 4 KiB buffer). The Python face also checks every
// length against the buffer it points into (tierstore/io/buffers.py); this is
// the native floor every caller gets.
#include <climits>
#include <cstdio>

#include "tierstore/io/engine.hpp"
#include "tierstore/io/error.hpp"

namespace tierstore {

void Engine::check_rows(const int64_t* file_offsets, const uint64_t* lengths, const uint64_t* src,
                        const uint64_t* dst, size_t n, bool dst_device,
                        const uint64_t* checksums) const {
  for (size_t i = 0; i < n; ++i) {
    const int64_t off = file_offsets[i];
    const uint64_t len = lengths[i];
    const bool staged = off >= 0 && src[i] == 0 && (dst_device || dst[i] == 0);
    const char* why = nullptr;
    if (off < -1) why = "file_offset must be >= 0, or -1 with a src";
    else if (len == 0 || len > kMaxRowBytes) why = "length must be in 1..2^36";
    else if (off == -1 && src[i] == 0) why = "file_offset -1 (no read) needs a src";
    else if (off >= 0 && len > uint64_t(INT64_MAX - off)) why = "file_offset + length overflows";
    else if (src[i] + len < src[i] || dst[i] + len < dst[i]) why = "src/dst + length overflows";
    else if (checksums && staged && len > options_.stage_bytes)
      why = "a checksummed row read through the staging ring must fit one stage "
            "(give it a src buffer or raise stage_bytes)";
    if (!why) continue;
    char msg[320];
    std::snprintf(msg, sizeof msg, "submit: row %zu (file_offset %lld, length %llu, src %#llx, "
                  "dst %#llx): %s", i, (long long)off, (unsigned long long)len,
                  (unsigned long long)src[i], (unsigned long long)dst[i], why);
    TS_EXPECT(false, msg);
  }
}

}  // namespace tierstore
