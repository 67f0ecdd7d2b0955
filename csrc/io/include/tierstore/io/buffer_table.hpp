// The memory an Engine may write into or read from (submit once trusted raw pointers,
// and a 1 TiB length wrote 512 KiB past a 4 KiB buffer).
//
// Callers register every buffer (host or device) they hand to submit(); every
// row's [ptr, ptr + length) must then lie inside one registered buffer on the
// right side of the bus, or the whole submit is refused before anything runs.
// A lookup is one binary search in a sorted interval table per row, under a
// shared lock taken once per submit: well under a microsecond for a 64-row
// batch (tests/test_engine_buffers.py measures it).
#pragma once
#include <cstddef>
#include <cstdint>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace tierstore {

class BufferTable {
 public:
  // Registers [ptr, ptr + nbytes) (nbytes > 0, no overflow; std::invalid_argument
  // otherwise) and returns a token for remove(). The same memory may be
  // registered more than once (views, shared engines): each add needs its remove.
  uint64_t add(uint64_t ptr, uint64_t nbytes, bool device);
  // False when `token` is unknown (already removed).
  bool remove(uint64_t token);
  size_t size() const;

  // Read-side view taken once per submit; holds the shared lock while alive.
  class Reader {
   public:
    explicit Reader(const BufferTable& table) : table_(table), lock_(table.mutex_) {}
    // nullptr when [ptr, ptr + len) lies inside one buffer on `device`'s side,
    // else why not (a one-line reason naming the buffer it points into, if any).
    // `why` is scratch storage for the message.
    const char* check(uint64_t ptr, uint64_t len, bool device, std::string& why) const;

   private:
    const BufferTable& table_;
    std::shared_lock<std::shared_mutex> lock_;
  };

 private:
  struct Entry {
    uint64_t start = 0, end = 0;
    bool device = false;
  };
  // One side (host or device) of the table, sorted by start. max_end[i] is the
  // largest end among entries 0..i and max_at[i] the entry holding it: a row
  // [p, q) fits inside some buffer iff max_end[last start <= p] >= q, also when
  // buffers overlap or nest.
  struct Side {
    std::vector<uint64_t> starts, max_end;
    std::vector<uint32_t> max_at;
    std::vector<Entry> entries;
    // Index of the entry with the largest end among those starting at or before
    // p (-1: none).
    int64_t cover(uint64_t p) const;
  };
  void rebuild();  // under the exclusive lock

  mutable std::shared_mutex mutex_;
  std::unordered_map<uint64_t, Entry> by_token_;
  uint64_t next_token_ = 1;
  Side host_, device_;
};

}  // namespace tierstore
