// The resident keys of one policy kept in eviction order, so a replay finds victims in
// O(victims + pinned + buckets) instead of ordering the resident set per miss.
//
// A key's order changes only through its own arrays (an access, an admission stamp) or a
// renormalisation of every heat; callers erase a resident key before changing its state
// and insert it after, and rebuild() after a renormalisation. heat / hybrid keep one set
// in their static order, lru a linked list in it; phase and blend, whose order moves with the tick's
// progress and the clock (policy.hpp), keep a BlendOrder (blend_order.hpp).
#pragma once

#include <climits>
#include <cstdint>
#include <memory>
#include <set>
#include <stdexcept>
#include <vector>

#include "tierstore/store/blend_order.hpp"
#include "tierstore/store/policy.hpp"

namespace tierstore {

class ResidentOrder {
 public:
  // The keys with members[k] set (null: the policy's own resident mask), in p's order.
  explicit ResidentOrder(const PolicyView& p, const bool* members = nullptr)
      : p_(p), members_(members ? members : p.resident) {
    if (scan_) {
      blend_ = std::make_unique<BlendOrder>(p_, members_);
    } else if (lru_) {
      if (p.n_keys > INT32_MAX) throw std::length_error("ResidentOrder: lru list over 2^31 keys");
      prev_.assign(p.n_keys, -1);
      next_.assign(p.n_keys, -1);
      stamp_.assign(p.n_keys, 0);
    } else {
      where_.resize(p.n_keys);
    }
    rebuild();
  }
  ResidentOrder(const ResidentOrder&) = delete;
  ResidentOrder& operator=(const ResidentOrder&) = delete;

  void rebuild();
  // erase(k) only for a key held (inserted and not erased since): each key remembers its
  // node, so erasing costs no search.
  void erase(int64_t k) {
    if (scan_) return blend_->erase(k);
    if (lru_) return unlink(static_cast<int32_t>(k));
    set_.erase(where_[k]);
  }
  // erase(k) before an access changes k's state: insert(k) follows, with only other keys'
  // detach / insert between (phase / blend move an entry within its bucket then).
  void detach(int64_t k) {
    if (scan_) return blend_->detach(k);
    erase(k);
  }
  void insert(int64_t k) {
    if (scan_) return blend_->insert(k);
    if (lru_) return link(static_cast<int32_t>(k));
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

  // lru: the held keys in a doubly-linked list over flat arrays, ascending (last, key) as
  // the set would hold them. An access or an admission stamps the newest tick, so a key
  // re-enters at the tail, behind only the keys of its own call with a greater id
  // (link() walks back over those): O(1) per touch instead of a tree insert and erase.
  bool colder_than(int32_t x, int64_t stamp, int32_t k) const {
    return stamp_[x] != stamp ? stamp_[x] < stamp : x < k;
  }
  void link(int32_t k);
  void unlink(int32_t k) {
    const int32_t a = prev_[k], b = next_[k];
    (a >= 0 ? next_[a] : head_) = b;
    (b >= 0 ? prev_[b] : tail_) = a;
  }

  const PolicyView& p_;
  const bool* members_;
  const bool scan_ = p_.phased();  // phase / blend: no static order, a BlendOrder
  const bool lru_ = p_.kind == PolicyKind::kLru;
  std::unique_ptr<BlendOrder> blend_;
  Set set_;                           // heat / hybrid
  std::vector<Set::iterator> where_;  // per key held: its node
  std::vector<int32_t> prev_, next_;  // lru: the list's links (-1: none)
  std::vector<int64_t> stamp_;        // lru: a held key's last-use tick when linked
  int32_t head_ = -1, tail_ = -1;     // lru: coldest, hottest
};

}  // namespace tierstore
