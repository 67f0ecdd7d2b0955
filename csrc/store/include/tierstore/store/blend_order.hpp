// Blend's resident keys kept so that victims are found without ordering the whole set
// (the replays' former scan was ~85% of auto's replay time: five of its nine experts are
// blend). Blend's order (policy.hpp) is phase's over a rate that mixes two heats decaying
// at different speeds, so no static order of the keys exists. But within one phase bucket
// (keys last read at one group position) the order is by rate, and the rate is monotone
// in each raw heat, whose orders ARE static (uniform decay). So each bucket keeps its keys
// sorted by raw and by raw2, and finds its coldest key by the threshold algorithm
// (Fagin's TA: walk both lists; no unseen key has a rate below the rate of the two lists'
// next heats), cached until the clock moves or the head leaves (an inserted key is
// compared with the head; another key leaving keeps it). victims() merges the buckets'
// coldest by the exact phase order, each bucket evaluated once per call. Exactness: a bucket whose second-coldest rate
// could round to the same primary as its coldest's is ordered by a full scan instead.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "tierstore/store/policy.hpp"

namespace tierstore {

class BlendOrder {
 public:
  BlendOrder(const PolicyView& p, const bool* members)
      : p_(p), members_(members), bucket_of_(p.n_keys, 0), taken_(p.n_keys, 0) {}
  void rebuild();
  // As ResidentOrder: erase a held key before its state changes, insert it after.
  void erase(int64_t k);
  void insert(int64_t k);
  // The n coldest members with pinned[k] == 0 (pinned may be null), coldest first.
  void victims(int64_t n, const uint8_t* pinned, std::vector<int64_t>& out);

  struct Entry {
    double h;  // the heat the list is sorted by, and the other heat, when inserted (both
    double o;  // equal the policy's arrays while the key is held)
    int64_t k;
  };

 private:
  struct Bucket {
    std::vector<Entry> by1, by2;  // members, by (raw, key) and by (raw2, key) ascending
    bool valid = false;             // head/rate/next_rate hold for the clock of cached_t_
    int64_t head = -1;              // the coldest by (rate, last, key)
    double rate = 0.0;              // its rate
    double next_rate = 0.0;         // a lower bound of the rates above `rate`
    double inv_rate = 0.0, inv_next = 0.0;  // 1 / max(rate, 1e-12), same of next_rate
  };
  struct Cand {
    int64_t k = -1;
    double primary = 0.0;
  };
  // The bucket's head by TA, skipping excluded keys.
  void compute(Bucket& b, const uint8_t* pinned, const PolicyOrder& order);
  void candidate(size_t bi, const uint8_t* pinned, const PolicyOrder& order, Cand& c);
  bool excluded(int64_t k, const uint8_t* pinned) const {
    return (pinned && pinned[k]) || taken_[k];
  }

  const PolicyView& p_;
  const bool* members_;
  std::vector<Bucket> buckets_;
  std::vector<uint32_t> bucket_of_;
  std::vector<uint8_t> taken_;  // victims chosen in this call
  std::vector<Cand> cands_;     // victims(): each bucket's candidate in this call
  double cached_t_ = std::numeric_limits<double>::quiet_NaN();
};

}  // namespace tierstore
