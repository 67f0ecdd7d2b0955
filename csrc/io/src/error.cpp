#include "tierstore/io/error.hpp"

#include <cstdio>
#include <cstring>

namespace tierstore::detail {

std::string errno_text(int err) {
  const char* name = strerrorname_np(err);
  std::string text = name ? name : std::to_string(err);
  text += " (";
  text += strerror(err);
  text += ")";
  return text;
}

void throw_io_error(int err, const std::string& path, int64_t offset, const char* what,
                    const char* file, int line) {
  char where[64] = "";
  if (offset >= 0) std::snprintf(where, sizeof where, " at offset %#llx", (unsigned long long)offset);
  std::string message = path + ": " + what + where + ": " + errno_text(err) + " [" +
                        file + ":" + std::to_string(line) + "]";
  throw IoError(path, offset, err, message);
}

void throw_invalid(const std::string& message, const char* file, int line) {
  throw std::invalid_argument(message + " [" + file + ":" + std::to_string(line) + "]");
}

}  // namespace tierstore::detail
