// Streaming verification of rows larger than one stage: the XXH3
// streaming state equals the one-shot hash for any cut of a buffer, and the
// engine hashes a row's segments in file order even when they land out of
// order (a reader that holds back the row's first segment forces that), with
// as few stages as one, for every way a row lands.
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "check.hpp"
#include "tierstore/io/checksum.hpp"
#include "tierstore/io/detail/file_reader.hpp"
#include "tierstore/io/engine.hpp"
#include "tierstore/io/host_buffer.hpp"

using namespace tierstore;

namespace {

constexpr size_t kPage = 4096;

// Reads below `slow_below` wait `delay_ms` first, so later segments land first;
// records the file offset of every attempt in the order the attempts finished.
class SlowPrefixReader final : public Reader {
 public:
  SlowPrefixReader(const std::string& path, int64_t slow_below, int delay_ms)
      : inner_(path, detail::DirectMode::off), slow_below_(slow_below), delay_ms_(delay_ms) {
    path_ = inner_.path();
  }
  std::vector<int64_t> finished() {
    std::lock_guard<std::mutex> lock(mutex_);
    return finished_;
  }

 protected:
  ssize_t read_some_impl(uint8_t* buf, size_t len, int64_t offset, ReadAttempt& state) noexcept override {
    if (offset < slow_below_) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
    const ssize_t got = inner_.read_some(buf, len, offset, state);
    std::lock_guard<std::mutex> lock(mutex_);
    finished_.push_back(offset);
    return got;
  }

 private:
  detail::FileReader inner_;
  int64_t slow_below_;
  int delay_ms_;
  std::mutex mutex_;
  std::vector<int64_t> finished_;
};

}  // namespace

TEST(streaming_hash_equals_one_shot_for_any_cut) {
  std::mt19937 rng(7);
  std::vector<uint8_t> data(3 * 1024 * 1024 + 17);
  for (auto& b : data) b = uint8_t(rng());
  for (int trial = 0; trial < 40; ++trial) {
    const size_t n = trial == 0 ? 0 : rng() % data.size();
    Xxh3Stream s;
    size_t at = 0;
    while (at < n) {
      const size_t piece = std::min<size_t>(n - at, 1 + rng() % (trial % 2 ? 300 : 700000));
      s.update(data.data() + at, piece);
      at += piece;
    }
    CHECK(s.digest() == xxh3_64(data.data(), n));
  }
}

TEST(segments_landing_out_of_order_are_hashed_in_order) {
  constexpr size_t kStage = 8 * kPage, kLen = 4 * kStage + 1000;  // 5 segments, ragged tail
  tstest::TempFile f(tstest::test_dir(), kLen + kPage, 3);
  const uint64_t good = xxh3_64(f.bytes.data(), kLen);
  for (int land = 0; land < 3; ++land) {      // host dst, caller src, staging ring
    for (int stages : {1, 2, 5}) {
      EngineOptions o;
      o.threads = 4;
      o.chunk_bytes = 4 * kPage;
      o.stage_bytes = kStage;
      o.stage_count = stages;
      o.chunk_ramp = false;  // segment 0 is two chunks: two readers wait, two go on
      auto reader = std::make_unique<SlowPrefixReader>(f.path, int64_t(kStage), 40);
      SlowPrefixReader* slow = reader.get();
      Engine eng(std::move(reader), o);
      HostBuffer buf(kLen + kPage, false);
      eng.buffers().add(reinterpret_cast<uint64_t>(buf.data()), buf.size(), false);
      for (uint64_t want : {good, good ^ 1}) {
        std::memset(buf.data(), 0, buf.size());
        const int64_t off = 0;
        const uint64_t len = kLen;
        const uint64_t p = reinterpret_cast<uint64_t>(buf.data());
        const uint64_t src = land == 1 ? p : 0, dst = land == 0 ? p : 0;
        auto b = eng.submit(&off, &len, &src, &dst, 1, false, &want);
        CHECK(b->wait(60));
        if (want == good) {
          CHECK_EQ(b->err(), 0);
          if (land < 2) CHECK(std::memcmp(buf.data(), f.bytes.data(), kLen) == 0);
        } else {
          CHECK_EQ(b->err(), EBADMSG);
          CHECK(b->failed_rows() == std::vector<int64_t>{0});
          CHECK_EQ(b->err_offset(), 0);
          CHECK(b->err_message().find("5 segments): xxh3_64 mismatch") != std::string::npos);
        }
      }
      // With more than one stage (or a caller buffer) the first segment really
      // finished after a later one: the in-order hashing above was exercised.
      const std::vector<int64_t> order = slow->finished();
      if (land < 2 || stages > 1) CHECK(order.front() >= int64_t(kStage));
      CHECK_EQ(eng.stats().verified_rows, 2);
      CHECK_EQ(eng.stats().checksum_failures, 1);
    }
  }
}

TEST(many_rows_of_many_segments_in_one_batch) {
  constexpr size_t kStage = 4 * kPage, kRows = 24;
  tstest::TempFile f(tstest::test_dir(), kRows * 5 * kStage, 9);
  EngineOptions o;
  o.threads = 6;
  o.chunk_bytes = kPage;
  o.stage_bytes = kStage;
  o.stage_count = 3;
  Engine eng(f.path, o);
  std::vector<int64_t> offs;
  std::vector<uint64_t> lens, zeros(kRows, 0), sums;
  for (size_t i = 0; i < kRows; ++i) {
    offs.push_back(int64_t(i * 5 * kStage + (i % 3) * 100));
    lens.push_back(kStage * (1 + i % 5) - (i % 4) * 333);
    sums.push_back(xxh3_64(f.bytes.data() + offs.back(), lens.back()));
  }
  sums[7] ^= 0x100;
  sums[19] ^= 0x100;
  auto b = eng.submit(offs.data(), lens.data(), zeros.data(), zeros.data(), kRows, false, sums.data());
  CHECK(b->wait(60));
  CHECK_EQ(b->err(), EBADMSG);
  CHECK((b->failed_rows() == std::vector<int64_t>{7, 19}));
  CHECK_EQ(eng.stats().verified_rows, kRows);
}

TSTEST_MAIN()
