// Phase's and blend's resident keys kept so that victims are found without ordering the
// whole set (the replays' former scan was ~85% of auto's replay time: seven of its nine
// experts are phase or blend). Their order (policy.hpp) is by the expected next use: an
// offset of the key's group position that moves every group, and a rate (blend's mixes
// two heats decaying at different speeds, so it has no static order), but within one
// clock the order is fixed: a key's rate moves only with the clock (once a tick) or its own access (erased
// before, inserted after). So each phase bucket (keys last read at one group position)
// keeps its keys sorted by (rate, last, key) at the clock it was last ordered at, each
// entry with its rate and 1 / max(rate, 1e-12) (primary_of's reciprocal); when the clock
// has moved, the bucket's rates are recomputed and the (nearly sorted) entries re-sorted
// the first time a victim is asked of it. Within a bucket the phase primary
// -(off/L + 1/max(rate, 1e-12)) is non-decreasing along that order, so a bucket's coldest
// is the least (last, key) of its leading run of equal primaries (rounding may merge
// rates). victims() merges the buckets' coldest by the exact phase order, each bucket
// evaluated once per call and again only after it gave a victim.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "tierstore/store/policy.hpp"

namespace tierstore {

class BlendOrder {
 public:
  BlendOrder(const PolicyView& p, const bool* members)
      : p_(p), members_(members), taken_(p.n_keys, 0) {}
  void rebuild();
  // As ResidentOrder: erase a held key before its state changes, insert it after.
  void erase(int64_t k);
  void insert(int64_t k);
  // The n coldest members with pinned[k] == 0 (pinned may be null), coldest first.
  void victims(int64_t n, const uint8_t* pinned, std::vector<int64_t>& out);

  struct Entry {
    double rate;     // blend_rate(h1, h2) at the bucket's clock
    double inv;      // 1 / max(rate, 1e-12)
    double h1, h2;   // raw, raw2 (blend; else 0) when inserted (equal the arrays while held)
    int64_t last;    // last-use tick (likewise)
    int64_t k;
  };

 private:
  struct Bucket {
    std::vector<Entry> v;  // sorted by (rate, last, key) when `sorted` and t == the clock
    double t = std::numeric_limits<double>::quiet_NaN();  // the clock of the rates
    bool sorted = true;    // false: entries appended unordered since the last sort
  };
  struct Cand {
    int64_t k = -1, last = 0;
    double primary = 0.0;
  };
  bool fresh(const Bucket& b) const { return b.sorted && b.t == p_.t; }
  Entry entry_of(int64_t k) const {
    return Entry{0.0, 0.0, p_.raw[k], p_.blended() ? p_.raw2[k] : 0.0, p_.last[k], k};
  }
  void refresh(Bucket& b);  // rates at the current clock, entries in order
  // One bucket's candidate in the current call: its coldest unexcluded key and that key's
  // phase primary (k = -1: none).
  void candidate(size_t bi, const uint8_t* pinned, double off, Cand& c);
  bool excluded(int64_t k, const uint8_t* pinned) const {
    return (pinned && pinned[k]) || taken_[k];
  }

  const PolicyView& p_;
  const bool* members_;
  std::vector<Bucket> buckets_;
  std::vector<uint8_t> taken_;  // victims chosen in this call
  std::vector<Cand> cands_;     // victims(): each bucket's candidate in this call
};

}  // namespace tierstore
