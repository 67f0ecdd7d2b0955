// Phase's and blend's resident keys kept so that victims are found without ordering the
// whole set (the replays' former scan was ~85% of auto's replay time: seven of its nine
// experts are phase or blend). Their order (policy.hpp) is by the expected next use: an
// offset of the key's group position that moves every group, and a rate (blend's mixes
// two heats decaying at different speeds, so it has no static order).
//
// Each phase bucket (keys last read at one group position) keeps its keys sorted by
// (rate, last, key) with the rate taken at the bucket's REFERENCE gains (the clock it was
// last sorted at). The current rate of a key is within [rho, rho2] times its reference
// rate (rho = min(G/g, G2/g2): both terms of blend's rate only shrink by those ratios
// as the clock moves; phase has one term), so a bucket's coldest is found by scanning from
// its front, the current rates computed exactly as PolicyOrder::rate_of does, until the
// bound proves that no later key can reach the best: the buckets are not re-sorted every
// clock step, only when such a scan grows long (the clock has moved too far).
//
// Within a bucket the phase primary -(off/L + 1/max(rate, 1e-12)) is non-decreasing in the
// rate for every offset, so a bucket's coldest is the greatest inverse rate, ties by
// (last, key), unless two distinct inverses lie within rounding of each other (then the
// offset decides which merge: computed for that offset, not remembered). Otherwise the
// coldest does not depend on the offset, and each bucket remembers it until its keys
// change or the clock moves: victims() merges the buckets' remembered coldest by the
// exact phase order, re-evaluating only the buckets that changed (the victim's, after
// each take).
#pragma once

#include <cstdint>
#include <vector>

#include "tierstore/store/policy.hpp"

namespace tierstore {

class BlendOrder {
 public:
  BlendOrder(const PolicyView& p, const bool* members)
      : p_(p), members_(members), det_b_(p.n_keys, -1), det_e_(p.n_keys), taken_(p.n_keys, 0) {}
  void rebuild();
  // As ResidentOrder: erase a held key before its state changes, insert it after.
  void erase(int64_t k);
  void insert(int64_t k);
  // erase(k) for a key whose insert(k) follows with nothing else in between but other
  // keys' detach / insert (an access): the entry stays in place, so a key read again at
  // its group position moves within its sorted bucket by one rotate instead of two
  // vector shifts. The buckets end as erase would leave them (sorted ones are unique;
  // a bucket whose every key is detached empties at once, as erase would empty it).
  void detach(int64_t k);
  // The n coldest members with pinned[k] == 0 (pinned may be null), coldest first.
  void victims(int64_t n, const uint8_t* pinned, std::vector<int64_t>& out);

  struct Entry {
    double rate;     // the rate at the bucket's reference gains
    int64_t last;    // last-use tick (equals the array while held)
    int64_t k;       // (its heats are read from the arrays: equal while held)
  };

 private:
  struct Bucket {
    std::vector<Entry> v;  // sorted by (rate, last, key) when `sorted`
    size_t detached = 0;   // entries of v left there by detach(), insert() pending
    double g1 = 1.0, g2 = 1.0;  // the reference gains of the entries' rates
    bool sorted = true;    // false: entries appended unordered since the last sort
    // The remembered coldest (valid while `memo_t` is the clock and nothing changed).
    bool memo = false;
    double memo_t = 0.0, memo_inv = 0.0;
    int64_t memo_k = -1, memo_last = 0;
  };
  struct Cand {
    int64_t k = -1, last = 0;
    double primary = 0.0;
  };
  // A key's rate at gains (g1, g2), spelled as PolicyOrder::rate_of (bit-equal at the
  // current gains).
  double rate_at(double h1, double h2, double g1, double g2) const {
    if (p_.blended()) return 0.5 * (h1 / g1 * keep1_ + h2 / g2 * keep2_);
    return h1 * (keep1_ / g1);
  }
  double key_rate(int64_t k, double g1, double g2) const {
    return rate_at(p_.raw[k], p_.blended() ? p_.raw2[k] : 0.0, g1, g2);
  }
  Entry entry_of(int64_t k) const { return Entry{0.0, p_.last[k], k}; }
  void keeps();                // keep1_, keep2_ for the view's half-lives
  void resort(Bucket& b);      // reference gains := the current ones, entries in order
  // One bucket's candidate in the current call: its coldest unexcluded key and that key's
  // phase primary at offset `off` (k = -1: none).
  void candidate(size_t bi, const uint8_t* pinned, double off, Cand& c);
  bool excluded(int64_t k, const uint8_t* pinned) const {
    return (pinned && pinned[k]) || taken_[k];
  }

  void erase_entry(Bucket& b, const Entry& e);  // erase's removal of e (held in b)

  const PolicyView& p_;
  const bool* members_;
  double keep1_ = 0.0, keep2_ = 0.0;
  // detach(): per key its entry left in bucket det_b_[k] (-1: none pending); per bucket
  // its entries not detached (live = size - detached).
  std::vector<int32_t> det_b_;  // int32: half the cache lines of the per-key arrays
  std::vector<Entry> det_e_;
  std::vector<Bucket> buckets_;
  std::vector<uint8_t> taken_;  // victims chosen in this call
  std::vector<Cand> cands_;     // victims(): each bucket's candidate in this call
  std::vector<double> off_l_;   // off / L for off in 0..L (L = per_tick when built)
};

}  // namespace tierstore
