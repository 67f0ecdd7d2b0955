// The resident keys of one policy kept in eviction order, so a replay finds victims in
// O(victims + pinned + buckets) instead of ordering the resident set per miss.
//
// A key's order changes only through its own arrays (an access, an admission stamp) or a
// renormalisation of every heat; callers erase a resident key before changing its state
// and insert it after, and rebuild() after a renormalisation. lru / heat / hybrid keep
// one set in their static order; phase and blend, whose order moves with the tick's
// progress and the clock (policy.hpp), keep a BlendOrder (blend_order.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <vector>

#include "tierstore/store/blend_order.hpp"
#include "tierstore/store/policy.hpp"

namespace tierstore {

class ResidentOrder {
 public:
  // The keys with members[k] set (null: the policy's own resident mask), in p's order.
  explicit ResidentOrder(const PolicyView& p, const bool* members = nullptr)
      : p_(p), members_(members ? members : p.resident), where_(p.n_keys) {
    if (scan_) blend_ = std::make_unique<BlendOrder>(p_, members_);
    rebuild();
  }
  ResidentOrder(const ResidentOrder&) = delete;
  ResidentOrder& operator=(const ResidentOrder&) = delete;

  void rebuild();
  // erase(k) only for a key held (inserted and not erased since): each key remembers its
  // node, so erasing costs no search.
  void erase(int64_t k) {
    if (scan_) return blend_->erase(k);
    set_.erase(where_[k]);
  }
  void insert(int64_t k) {
    if (scan_) return blend_->insert(k);
    where_[k] = set_.insert(node_of(k)).first;
  }
  bool holds(int64_t k) const { return members_[k]; }
  // The n coldest members with pinned[k] == 0 (pinned may be null), coldest first.
  void victims(int64_t n, const uint8_t* pinned, std::vector<int64_t>& out);

 private:
  // A held key with its static order's fields copied in (they equal the policy's arrays
  // while it is held: erase before a change, insert after), so a search compares nodes
  // without reading the arrays: ascending (a, b, k) is PolicyOrder::static_colder.
  struct Node {
    double a;   // raw heat (lru: 0)
    int64_t b;  // last-use tick (heat: 0)
    int64_t k;
    bool operator<(const Node& o) const {
      if (a != o.a) return a < o.a;
      return b != o.b ? b < o.b : k < o.k;
    }
  };
  Node node_of(int64_t k) const {
    return Node{p_.heats() ? p_.raw[k] : 0.0, p_.stamps() ? p_.last[k] : 0, k};
  }
  using Set = std::set<Node>;

  const PolicyView& p_;
  const bool* members_;
  const bool scan_ = p_.phased();  // phase / blend: no static order, a BlendOrder
  std::unique_ptr<BlendOrder> blend_;
  Set set_;                           // lru / heat / hybrid
  std::vector<Set::iterator> where_;  // per key held: its node
};

}  // namespace tierstore
