// measure_read_bound: see tierstore/io/read_bound.hpp.
#include "tierstore/io/read_bound.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>
#include <vector>

#include "tierstore/io/error.hpp"
#include "tierstore/io/host_buffer.hpp"

namespace tierstore {

namespace {
constexpr uint64_t kAlign = 4096;
uint64_t round_up(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }
}  // namespace

ReadBoundResult measure_read_bound(const std::string& path, const int64_t* offsets, size_t n,
                                   uint64_t row_bytes, int threads, bool direct,
                                   uint64_t chunk_bytes, int passes) {
  TS_EXPECT(n > 0 && row_bytes > 0 && threads >= 1 && threads <= 512 && passes >= 1,
            "measure_read_bound: need rows, row_bytes > 0, 1..512 threads, passes >= 1");
  const uint64_t row = direct ? round_up(row_bytes) : row_bytes;
  const uint64_t chunk = std::max<uint64_t>(kAlign, direct ? round_up(chunk_bytes) : chunk_bytes);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
  if (fd < 0) detail::throw_io_error(errno, path, -1, direct ? "open (O_DIRECT)" : "open",
                                     __FILE__, __LINE__);
  const uint64_t stride = round_up(row);
  HostBuffer dest(stride * n, true);  // pinned, populated: no first-touch faults timed
  const uint64_t per_row = (row + chunk - 1) / chunk;
  const uint64_t pieces = per_row * n;
  std::vector<double> times;
  std::atomic<int> failed{0};
  std::atomic<int64_t> fail_at{-1};
  for (int p = 0; p < passes && !failed.load(); ++p) {
    std::atomic<uint64_t> next{0};
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&] {
        for (uint64_t k = next.fetch_add(1); k < pieces && !failed.load(); k = next.fetch_add(1)) {
          const uint64_t i = k / per_row, begin = (k % per_row) * chunk;
          uint64_t len = std::min(chunk, row - begin), got = 0;
          uint8_t* out = dest.data() + i * stride + begin;
          while (got < len) {
            const ssize_t r = ::pread(fd, out + got, len - got, offsets[i] + int64_t(begin + got));
            if (r <= 0) {
              if (r < 0 && errno == EINTR) continue;
              fail_at.store(offsets[i] + int64_t(begin + got));
              failed.store(r < 0 ? errno : ENODATA);
              break;
            }
            got += uint64_t(r);
          }
        }
      });
    }
    for (auto& th : pool) th.join();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  ::close(fd);
  if (failed.load()) detail::throw_io_error(failed.load(), path, fail_at.load(), "read bound pread",
                                            __FILE__, __LINE__);
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  ReadBoundResult out;
  out.best_s = sorted.front();
  out.median_s = sorted[sorted.size() / 2];
  out.bytes = row * n;
  out.pinned = dest.pinned();
  out.direct = direct;
  return out;
}

}  // namespace tierstore
