// See resident_order.hpp.
#include "tierstore/store/resident_order.hpp"

namespace tierstore {

void ResidentOrder::rebuild() {
  if (scan_) return blend_->rebuild();
  set_.clear();
  for (int64_t k = 0; k < p_.n_keys; ++k) {
    if (members_[k]) insert(k);
  }
}

void ResidentOrder::victims(int64_t n, const uint8_t* pinned, std::vector<int64_t>& out) {
  out.clear();
  if (n <= 0) return;
  if (scan_) return blend_->victims(n, pinned, out);
  for (auto it = set_.begin(); it != set_.end() && static_cast<int64_t>(out.size()) < n; ++it) {
    if (pinned == nullptr || !pinned[it->k]) out.push_back(it->k);
  }
}

}  // namespace tierstore
