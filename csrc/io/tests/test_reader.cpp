// Reader unit tests on real files: pread and O_DIRECT byte-exactness, the
// tmpfs O_DIRECT fallback, end of file, and the read loop's recovery from the
// faults a FaultyReader wrapped around the real reader injects.
#include <sys/statfs.h>
#include <sys/vfs.h>

#include <atomic>
#include <cerrno>
#include <thread>

#include "check.hpp"
#include "tierstore/io/detail/file_reader.hpp"
#include "tierstore/io/error.hpp"
#include "tierstore/io/faulty_reader.hpp"
#include "tierstore/io/host_buffer.hpp"

using tierstore::FaultPlan;
using tierstore::FaultyReader;
using tierstore::HostBuffer;
using tierstore::IoError;
using tierstore::Reader;
using tierstore::detail::DirectMode;
using tierstore::detail::FileReader;

namespace {

constexpr size_t kPage = 4096;
constexpr size_t kFile = 1 << 20;

// (offset, length, buffer shift) cases: aligned, unaligned head/tail, buffer
// that does not line up with the file, sub-page, whole file.
struct Range { int64_t offset; size_t len; size_t shift; };
const Range kRanges[] = {
    {0, kFile, 0}, {0, kPage, 0}, {kPage, 64 * kPage, 0}, {17, 3 * kPage, 0},
    {5 * kPage + 100, 40 * kPage - 33, 0}, {8 * kPage, 16 * kPage, 3}, {kFile - 10, 10, 0},
    {123, 1, 0}, {2 * kPage, 7 * kPage + 1, 0},
};

void check_ranges(Reader& reader, const std::vector<uint8_t>& want) {
  HostBuffer buf(kFile + 2 * kPage, /*pin=*/false);
  for (const Range& r : kRanges) {
    uint8_t* dst = buf.data() + r.shift;
    std::memset(dst, 0, r.len);
    int64_t err_at = -2;
    bool cached = false;
    const int rc = reader.read_exact(dst, r.len, r.offset, &err_at, &cached);
    CHECK_EQ(rc, 0);
    CHECK(std::memcmp(dst, want.data() + r.offset, r.len) == 0);
  }
}

bool on_tmpfs(const std::string& dir) {
  struct statfs st {};
  return ::statfs(dir.c_str(), &st) == 0 && st.f_type == 0x01021994;  // TMPFS_MAGIC
}

}  // namespace

TEST(buffered_reads_are_byte_exact) {
  tstest::TempFile f(tstest::test_dir(), kFile, 1);
  FileReader reader(f.path, DirectMode::off);
  CHECK(!reader.direct_active() && reader.fallback_reason().empty());
  CHECK_EQ(reader.size_at_open(), kFile);
  check_ranges(reader, f.bytes);
}

TEST(direct_or_fallback_reads_are_byte_exact) {
  tstest::TempFile f(tstest::test_dir(), kFile, 2);
  for (bool probe : {true, false}) {
    FileReader reader(f.path, DirectMode::automatic, probe);
    // Either O_DIRECT is in use or the reader says why not.
    CHECK(reader.direct_active() != !reader.fallback_reason().empty());
    check_ranges(reader, f.bytes);
  }
}

TEST(tmpfs_refusing_o_direct_falls_back_or_fails_loudly) {
  const std::string dir = "/dev/shm";
  if (!on_tmpfs(dir)) {
    std::fprintf(stderr, "  (no tmpfs at /dev/shm: skipped)\n");
    return;
  }
  tstest::TempFile f(dir, 64 * kPage, 3);
  FileReader reader(f.path, DirectMode::automatic);
  if (reader.direct_active()) {  // Linux >= 6.6 tmpfs accepts O_DIRECT
    CHECK(reader.fallback_reason().empty());
  } else {
    CHECK(reader.fallback_reason().find("O_DIRECT refused") != std::string::npos);
    CHECK(reader.fallback_reason().find(f.path) != std::string::npos);
    CHECK_THROWS(FileReader(f.path, DirectMode::on), IoError, "O_DIRECT refused");
  }
  HostBuffer buf(64 * kPage, false);
  int64_t at = 0;
  bool cached = false;
  CHECK_EQ(reader.read_exact(buf.data(), 64 * kPage - 5, 5, &at, &cached), 0);
  CHECK(std::memcmp(buf.data(), f.bytes.data() + 5, 64 * kPage - 5) == 0);
}

TEST(missing_file_is_an_io_error_naming_it) {
  CHECK_THROWS(FileReader("/nonexistent/tierstore.pack", DirectMode::off), IoError,
               "/nonexistent/tierstore.pack: open");
}

TEST(end_of_file_inside_a_range_is_enodata_at_the_file_end) {
  tstest::TempFile f(tstest::test_dir(), 10 * kPage + 100, 4);
  for (DirectMode mode : {DirectMode::off, DirectMode::automatic}) {
    FileReader reader(f.path, mode);
    HostBuffer buf(16 * kPage, false);
    int64_t at = -1;
    bool cached = false;
    CHECK_EQ(reader.read_exact(buf.data(), 4 * kPage, 8 * kPage, &at, &cached), ENODATA);
    CHECK_EQ(at, 10 * kPage + 100);
    CHECK(std::memcmp(buf.data(), f.bytes.data() + 8 * kPage, 2 * kPage + 100) == 0);
  }
}

TEST(negative_or_overflowing_ranges_are_einval) {
  tstest::TempFile f(tstest::test_dir(), kPage, 5);
  FileReader reader(f.path, DirectMode::off);
  uint8_t b[8];
  int64_t at = 0;
  bool cached = false;
  CHECK_EQ(reader.read_exact(b, 8, -1, &at, &cached), EINVAL);
  CHECK_EQ(reader.read_exact(b, size_t(1) << 63, 1, &at, &cached), EINVAL);
  CHECK_EQ(reader.read_exact(b, 0, 0, &at, &cached), 0);
}

TEST(short_reads_are_resumed_byte_exact) {
  tstest::TempFile f(tstest::test_dir(), kFile, 6);
  for (DirectMode mode : {DirectMode::off, DirectMode::automatic}) {
    FileReader real(f.path, mode);
    FaultyReader faulty(real);
    FaultPlan plan;
    plan.short_reads = true;
    faulty.set_plan(plan);
    check_ranges(faulty, f.bytes);
    CHECK(faulty.attempts() > 40);  // the whole-file read alone takes ~20 halvings
  }
}

TEST(fault_at_an_offset_fails_with_its_errno_where_the_attempt_started) {
  tstest::TempFile f(tstest::test_dir(), kFile, 7);
  FileReader real(f.path, DirectMode::automatic);
  FaultyReader faulty(real);
  FaultPlan plan;
  plan.fail_offset = 300000;
  plan.err = EIO;
  faulty.set_plan(plan);
  HostBuffer buf(kFile, false);
  int64_t at = -1;
  bool cached = false;
  CHECK_EQ(faulty.read_exact(buf.data(), 64 * kPage, 256 * 1024, &at, &cached), EIO);
  CHECK(at >= 256 * 1024 && at <= 300000);
  // A range that does not cover it reads fine; a cleared plan reads everything.
  CHECK_EQ(faulty.read_exact(buf.data(), kPage, 0, &at, &cached), 0);
  faulty.set_plan(FaultPlan{});
  CHECK_EQ(faulty.read_exact(buf.data(), kFile, 0, &at, &cached), 0);
  CHECK(std::memcmp(buf.data(), f.bytes.data(), kFile) == 0);
}

TEST(every_nth_attempt_fails) {
  tstest::TempFile f(tstest::test_dir(), kFile, 8);
  FileReader real(f.path, DirectMode::off);
  FaultyReader faulty(real);
  FaultPlan plan;
  plan.every_nth = 3;
  plan.err = EIO;
  faulty.set_plan(plan);
  HostBuffer buf(kPage, false);
  int64_t at = -1;
  bool cached = false;
  CHECK_EQ(faulty.read_exact(buf.data(), kPage, 0, &at, &cached), 0);   // attempt 1
  CHECK_EQ(faulty.read_exact(buf.data(), kPage, 0, &at, &cached), 0);   // attempt 2
  CHECK_EQ(faulty.read_exact(buf.data(), kPage, kPage, &at, &cached), EIO);  // attempt 3
  CHECK_EQ(at, kPage);
  CHECK_EQ(faulty.attempts(), 3);
}

TEST(eintr_is_retried_but_not_forever) {
  tstest::TempFile f(tstest::test_dir(), kFile, 9);
  FileReader real(f.path, DirectMode::off);
  FaultyReader faulty(real);
  HostBuffer buf(kFile, false);
  int64_t at = -1;
  bool cached = false;
  // An occasional EINTR is retried transparently...
  FaultPlan plan;
  plan.every_nth = 2;
  plan.err = EINTR;
  plan.short_reads = true;
  faulty.set_plan(plan);
  CHECK_EQ(faulty.read_exact(buf.data(), kFile, 0, &at, &cached), 0);
  CHECK(std::memcmp(buf.data(), f.bytes.data(), kFile) == 0);
  // ...an EINTR that repeats on every attempt surfaces after the bounded retries
  // (the old fault hook retried it forever and hung the reader thread).
  plan = FaultPlan{};
  plan.fail_offset = 5000;
  plan.err = EINTR;
  faulty.set_plan(plan);
  CHECK_EQ(faulty.read_exact(buf.data(), 2 * kPage, 4096, &at, &cached), EINTR);
  CHECK_EQ(at, 4096);
  CHECK_EQ(faulty.attempts(), tierstore::kMaxInterruptedRetries + 1);
}

TEST(many_threads_share_one_reader) {
  tstest::TempFile f(tstest::test_dir(), kFile, 10);
  FileReader real(f.path, DirectMode::automatic);
  FaultyReader faulty(real);
  FaultPlan plan;
  plan.short_reads = true;
  faulty.set_plan(plan);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(100 + t);
      HostBuffer buf(128 * kPage, false);
      Reader& reader = t % 2 ? static_cast<Reader&>(faulty) : real;
      for (int i = 0; i < 200; ++i) {
        const size_t len = 1 + rng() % (128 * kPage);
        const int64_t off = int64_t(rng() % (kFile - len + 1));
        int64_t at = 0;
        bool cached = false;
        if (reader.read_exact(buf.data(), len, off, &at, &cached) != 0 ||
            std::memcmp(buf.data(), f.bytes.data() + off, len) != 0)
          bad.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK_EQ(bad.load(), 0);
}

TSTEST_MAIN()
