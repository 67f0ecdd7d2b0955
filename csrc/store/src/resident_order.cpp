// See resident_order.hpp.
#include "tierstore/store/resident_order.hpp"

#include <algorithm>

namespace tierstore {

void ResidentOrder::rebuild() {
  if (scan_) return blend_->rebuild();
  if (lru_) {
    // The members sorted by (last, key) once, then linked in that order.
    std::vector<int32_t> ks;
    for (int64_t k = 0; k < p_.n_keys; ++k) {
      if (members_[k]) ks.push_back(static_cast<int32_t>(k));
    }
    const int64_t* last = p_.last;
    std::sort(ks.begin(), ks.end(), [last](int32_t x, int32_t y) {
      return last[x] != last[y] ? last[x] < last[y] : x < y;
    });
    head_ = tail_ = -1;
    for (int32_t k : ks) {
      stamp_[k] = last[k];
      prev_[k] = tail_;
      next_[k] = -1;
      (tail_ >= 0 ? next_[tail_] : head_) = k;
      tail_ = k;
    }
    return;
  }
  set_.clear();
  for (int64_t k = 0; k < p_.n_keys; ++k) {
    if (members_[k]) insert(k);
  }
}

void ResidentOrder::link(int32_t k) {
  // From the tail back past the keys hotter than k: those of k's own call with a greater
  // id when k was just stamped (any position is found, only slower, for an older stamp).
  const int64_t s = p_.last[k];
  stamp_[k] = s;
  int32_t a = tail_;
  while (a >= 0 && !colder_than(a, s, k)) a = prev_[a];
  const int32_t b = a >= 0 ? next_[a] : head_;
  prev_[k] = a;
  next_[k] = b;
  (a >= 0 ? next_[a] : head_) = k;
  (b >= 0 ? prev_[b] : tail_) = k;
}

void ResidentOrder::victims(int64_t n, const uint8_t* pinned, std::vector<int64_t>& out) {
  out.clear();
  if (n <= 0) return;
  if (scan_) return blend_->victims(n, pinned, out);
  if (lru_) {
    for (int32_t k = head_; k >= 0 && static_cast<int64_t>(out.size()) < n; k = next_[k]) {
      if (pinned == nullptr || !pinned[k]) out.push_back(k);
    }
    return;
  }
  for (auto it = set_.begin(); it != set_.end() && static_cast<int64_t>(out.size()) < n; ++it) {
    if (pinned == nullptr || !pinned[it->k]) out.push_back(it->k);
  }
}

}  // namespace tierstore
