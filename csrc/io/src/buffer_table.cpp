// BufferTable: see tierstore/io/buffer_table.hpp.
#include "tierstore/io/buffer_table.hpp"

#include <algorithm>
#include <cstdio>
#include <mutex>

#include "tierstore/io/error.hpp"

namespace tierstore {

uint64_t BufferTable::add(uint64_t ptr, uint64_t nbytes, bool device) {
  TS_EXPECT(ptr != 0 && nbytes > 0 && ptr + nbytes > ptr,
            "register_buffer: need a non-null address and 0 < nbytes without overflow");
  std::unique_lock<std::shared_mutex> lock(mutex_);
  const uint64_t token = next_token_++;
  by_token_[token] = Entry{ptr, ptr + nbytes, device};
  rebuild();
  return token;
}

bool BufferTable::remove(uint64_t token) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (by_token_.erase(token) == 0) return false;
  rebuild();
  return true;
}

size_t BufferTable::size() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return by_token_.size();
}

void BufferTable::rebuild() {
  for (Side* side : {&host_, &device_}) {
    side->entries.clear();
    side->starts.clear();
    side->max_end.clear();
    side->max_at.clear();
  }
  for (const auto& kv : by_token_) (kv.second.device ? device_ : host_).entries.push_back(kv.second);
  for (Side* side : {&host_, &device_}) {
    auto& e = side->entries;
    std::sort(e.begin(), e.end(), [](const Entry& a, const Entry& b) {
      return a.start != b.start ? a.start < b.start : a.end > b.end;
    });
    uint64_t best = 0;
    uint32_t at = 0;
    for (uint32_t i = 0; i < e.size(); ++i) {
      if (e[i].end > best) best = e[i].end, at = i;
      side->starts.push_back(e[i].start);
      side->max_end.push_back(best);
      side->max_at.push_back(at);
    }
  }
}

int64_t BufferTable::Side::cover(uint64_t p) const {
  const auto it = std::upper_bound(starts.begin(), starts.end(), p);
  if (it == starts.begin()) return -1;
  return max_at[size_t(it - starts.begin()) - 1];
}

const char* BufferTable::Reader::check(uint64_t ptr, uint64_t len, bool device,
                                       std::string& why) const {
  const Side& side = device ? table_.device_ : table_.host_;
  const int64_t k = side.cover(ptr);
  // The common case: one search, two compares (ptr + len cannot wrap: submit checked).
  if (k >= 0 && side.entries[size_t(k)].end >= ptr + len) return nullptr;
  char text[200];
  const char* kind = device ? "device" : "host";
  if (k >= 0 && side.entries[size_t(k)].end > ptr) {
    const Entry& e = side.entries[size_t(k)];
    std::snprintf(text, sizeof text,
                  "ends at %#llx, past the registered %s buffer it points into "
                  "(%llu B at %#llx)", (unsigned long long)(ptr + len), kind,
                  (unsigned long long)(e.end - e.start), (unsigned long long)e.start);
  } else {
    const Side& other = device ? table_.host_ : table_.device_;
    const int64_t j = other.cover(ptr);
    if (j >= 0 && other.entries[size_t(j)].end > ptr) {
      const Entry& e = other.entries[size_t(j)];
      std::snprintf(text, sizeof text, "is %s memory (a registered %llu B buffer at %#llx), "
                    "the row needs %s memory", device ? "host" : "device",
                    (unsigned long long)(e.end - e.start), (unsigned long long)e.start, kind);
    } else {
      std::snprintf(text, sizeof text, "is in no registered %s buffer "
                    "(Engine.alloc_host or Engine.register_buffer)", kind);
    }
  }
  why = text;
  return why.c_str();
}

}  // namespace tierstore
