// A dozen lines of test harness instead of a framework download: TEST(name)
// registers a case, CHECK / CHECK_EQ report file:line and the values, and
// main() runs every case (or those named on the command line) and exits 1 on
// the first failure. Helpers for real files live here too.
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace tstest {

struct Case { const char* name; std::function<void()> fn; };
inline std::vector<Case>& cases() { static std::vector<Case> all; return all; }
struct Register { Register(const char* n, std::function<void()> f) { cases().push_back({n, std::move(f)}); } };

[[noreturn]] inline void fail(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "%s:%d: FAILED: %s\n", file, line, what.c_str());
  std::exit(1);
}

// A file of `n` random non-zero bytes in `dir` (removed at exit by the caller's Tmp).
struct TempFile {
  std::string path;
  std::vector<uint8_t> bytes;
  TempFile(const std::string& dir, size_t n, uint32_t seed) {
    static int counter = 0;
    path = dir + "/tstest_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".bin";
    std::mt19937 rng(seed);
    bytes.resize(n);
    for (auto& b : bytes) b = uint8_t(1 + rng() % 255);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || ::write(fd, bytes.data(), n) != ssize_t(n) || ::fsync(fd) != 0)
      fail(__FILE__, __LINE__, "cannot write " + path + ": " + std::strerror(errno));
    ::close(fd);
  }
  ~TempFile() { ::unlink(path.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
};

// Where test files go: $TIERSTORE_TEST_DIR, else the working directory (the
// build dir: a disk filesystem, so O_DIRECT is really used when it can be).
inline std::string test_dir() {
  const char* d = std::getenv("TIERSTORE_TEST_DIR");
  return d && *d ? d : ".";
}

}  // namespace tstest

#define TS_CAT2(a, b) a##b
#define TS_CAT(a, b) TS_CAT2(a, b)
#define TEST(name)                                                              \
  static void name();                                                           \
  static ::tstest::Register TS_CAT(reg_, name)(#name, name);                    \
  static void name()

#define CHECK(cond)                                                             \
  do {                                                                          \
    if (!(cond)) ::tstest::fail(__FILE__, __LINE__, "CHECK(" #cond ")");         \
  } while (0)

#define CHECK_EQ(a, b)                                                          \
  do {                                                                          \
    const long long va_ = (long long)(a), vb_ = (long long)(b);                 \
    if (va_ != vb_)                                                             \
      ::tstest::fail(__FILE__, __LINE__, "CHECK_EQ(" #a ", " #b "): " +          \
                     std::to_string(va_) + " != " + std::to_string(vb_));       \
  } while (0)

// Expects `stmt` to throw `type`; `needle` must occur in what().
#define CHECK_THROWS(stmt, type, needle)                                        \
  do {                                                                          \
    bool thrown_ = false;                                                       \
    try { stmt; } catch (const type& e_) {                                      \
      thrown_ = true;                                                           \
      if (!std::strstr(e_.what(), needle))                                      \
        ::tstest::fail(__FILE__, __LINE__, std::string("message lacks '") +     \
                       needle + "': " + e_.what());                             \
    }                                                                           \
    if (!thrown_) ::tstest::fail(__FILE__, __LINE__, "no " #type " from " #stmt); \
  } while (0)

#define TSTEST_MAIN()                                                           \
  int main(int argc, char** argv) {                                             \
    int ran = 0;                                                                \
    for (auto& c : ::tstest::cases()) {                                         \
      bool pick = argc < 2;                                                     \
      for (int i = 1; i < argc; ++i) pick |= std::strcmp(argv[i], c.name) == 0; \
      if (!pick) continue;                                                      \
      std::fprintf(stderr, "[ RUN  ] %s\n", c.name);                            \
      c.fn();                                                                   \
      std::fprintf(stderr, "[  OK  ] %s\n", c.name);                            \
      ++ran;                                                                    \
    }                                                                           \
    std::fprintf(stderr, "%d case(s) passed\n", ran);                           \
    return ran > 0 ? 0 : 1;                                                     \
  }
