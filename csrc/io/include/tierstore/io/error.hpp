// Errors raised by the native core.
//
// IoError carries what a caller needs to act on a failed read: the file, the
// byte offset and errno. The check macros add the source location and build
// the message only on failure (the fast path is one branch).
#pragma once
#include <cerrno>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace tierstore {

// A read, open or copy failed. `offset` is the file offset the failing
// operation started at (-1 when there is none, e.g. an open). `err` is an
// errno value (ENODATA for an unexpected end of file, ECANCELED for a read
// cancelled by close(), EIO for a failed CUDA copy).
class IoError : public std::runtime_error {
 public:
  IoError(std::string path, int64_t offset, int err, const std::string& message)
      : std::runtime_error(message), path_(std::move(path)), offset_(offset), err_(err) {}
  const std::string& path() const noexcept { return path_; }
  int64_t offset() const noexcept { return offset_; }
  int err() const noexcept { return err_; }

 private:
  std::string path_;
  int64_t offset_;
  int err_;
};

// A submitted row points outside the memory registered with the engine
// (BufferTable): a caller bug, refused before anything is read or copied.
class BoundsError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

namespace detail {

// Cold paths: build the message ("<path>: <what> at offset 0x..: ENAME (text) [file:line]")
// and throw. Never inlined so the checks stay cheap.
[[noreturn]] void throw_io_error(int err, const std::string& path, int64_t offset,
                                 const char* what, const char* file, int line);
[[noreturn]] void throw_invalid(const std::string& message, const char* file, int line);

// "EIO (Input/output error)"; the errno name is spelled out for the log.
std::string errno_text(int err);

}  // namespace detail
}  // namespace tierstore

// cond false -> IoError with the current errno.
#define TS_CHECK_ERRNO(cond, path, offset, what)                                         \
  do {                                                                                   \
    if (__builtin_expect(!(cond), 0))                                                    \
      ::tierstore::detail::throw_io_error(errno, (path), (offset), (what), __FILE__, __LINE__); \
  } while (0)

// cond false -> std::invalid_argument (ValueError in Python) with the given message.
#define TS_EXPECT(cond, message)                                                         \
  do {                                                                                   \
    if (__builtin_expect(!(cond), 0))                                                    \
      ::tierstore::detail::throw_invalid((message), __FILE__, __LINE__);                \
  } while (0)
