// See resident_order.hpp.
#include "tierstore/store/resident_order.hpp"

#include <algorithm>

namespace tierstore {

size_t ResidentOrder::bucket_index(int64_t k) {
  const size_t b = p_.phased() ? static_cast<size_t>(p_.pos[k]) : 0;
  while (sets_.size() <= b) sets_.emplace_back();
  return b;
}

void ResidentOrder::rebuild() {
  sets_.clear();
  if (scan_) return blend_->rebuild();
  for (int64_t k = 0; k < p_.n_keys; ++k) {
    if (members_[k]) insert(k);
  }
}

void ResidentOrder::victims(int64_t n, const uint8_t* pinned, std::vector<int64_t>& out) {
  out.clear();
  if (n <= 0) return;
  if (scan_) return blend_->victims(n, pinned, out);
  if (p_.phased()) {
    phase_victims(n, pinned, out);
    return;
  }
  if (sets_.empty()) return;
  for (auto it = sets_[0].begin(); it != sets_[0].end() && static_cast<int64_t>(out.size()) < n;
       ++it) {
    if (pinned == nullptr || !pinned[it->k]) out.push_back(it->k);
  }
}

void ResidentOrder::phase_victims(int64_t n, const uint8_t* pinned, std::vector<int64_t>& out) {
  const PolicyOrder order(p_);
  heads_.resize(sets_.size());
  size_t n_heads = 0;
  for (const Set& s : sets_) {
    if (s.empty()) continue;
    Head& h = heads_[n_heads++];
    h.it = s.begin();
    h.end = s.end();
  }
  const int64_t* last = p_.last;
  // Refill h.run from its bucket: the next keys sharing one exact primary, unpinned.
  const auto refill = [&](Head& h) {
    h.run.clear();
    h.next = 0;
    while (h.run.empty() && h.it != h.end) {
      h.primary = order.primary(h.it->k);
      do {
        if (pinned == nullptr || !pinned[h.it->k]) h.run.push_back(h.it->k);
        ++h.it;
      } while (h.it != h.end && order.primary(h.it->k) == h.primary);
    }
    if (h.run.size() > 1) {
      std::sort(h.run.begin(), h.run.end(), [last](int64_t x, int64_t y) {
        return last[x] != last[y] ? last[x] < last[y] : x < y;
      });
    }
  };
  for (size_t i = 0; i < n_heads; ++i) refill(heads_[i]);
  while (static_cast<int64_t>(out.size()) < n) {
    Head* best = nullptr;
    for (size_t i = 0; i < n_heads; ++i) {
      Head& h = heads_[i];
      if (h.next >= h.run.size()) continue;
      if (best == nullptr) {
        best = &h;
        continue;
      }
      const int64_t x = h.run[h.next], y = best->run[best->next];
      if (h.primary != best->primary ? h.primary < best->primary
                                     : (last[x] != last[y] ? last[x] < last[y] : x < y))
        best = &h;
    }
    if (best == nullptr) break;
    out.push_back(best->run[best->next++]);
    if (best->next >= best->run.size()) refill(*best);
  }
}

}  // namespace tierstore
