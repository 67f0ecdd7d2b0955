// Demand-fill replay through the self-tuning policy (tierstore/policies/auto.py), natively:
// follow-the-leader over shadow experts. The expert list is data (a PolicyView per expert,
// any kinds and half-lives, in index order); the algorithm, as auto.py runs it:
//   per read group (one on_access each, never merged), for each expert in index order:
//     score += the group's hits in its shadow cache (token-weighted or distinct keys, as
//     score_tokens says); its on_access; its
//     misses filled into its shadow (capacity slots, the group's keys blocked, hottest
//     first and its own admission filter when it has one)
//   leader = the first expert of highest score
//   the real tier's fill decides by the leader: victims = the leader's coldest of the
//   real resident keys, promotion order = its rank, admission = its filter
//   tick end: every expert decays one step, scores *= score_decay
#pragma once

#include <cstdint>
#include <vector>

#include "tierstore/store/policy.hpp"
#include "tierstore/store/replay.hpp"

namespace tierstore {

struct AutoView {
  std::vector<PolicyView> experts;  // index order: 0 is the prior (ties go lower)
  int64_t n_keys = 0;
  int64_t capacity = 0;             // each shadow's slots
  bool* resident = nullptr;         // the real tier's resident mask
  int64_t n_resident = 0;
  double* scores = nullptr;         // one per expert
  int64_t leader = 0;
  double score_decay = 1.0;         // per step
  bool score_tokens = true;         // a hit scores its token count (false: 1 per key)
};

// Replays `trace` into `policy` (state updated in place, as the Python loop would leave
// it) with `slots` real slots; `filter`: auto's admission (the leader's filter, misses
// ranked by the leader) applies, false = every miss admitted. hit as replay_demand.
// Throws std::invalid_argument on an empty expert list or a view of the wrong size.
ReplayCounts replay_auto(AutoView& policy, const ReplayTrace& trace, int64_t slots,
                         bool filter, bool* hit);

}  // namespace tierstore
