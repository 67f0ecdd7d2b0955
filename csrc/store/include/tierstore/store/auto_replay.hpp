// Demand-fill replay through the self-tuning policy, natively: every read group is one
// AutoCore::access (auto_core.hpp: the shadows, scores and leader, the same code the live
// store's AutoPolicy runs), then the real tier's fill decides by the leader:
// victims = the leader's coldest of the real resident keys, promotion order = its rank,
// admission = its filter (sim/demand.py Filler.demand + policies/fill.py plan_fill).
// Tick end: AutoCore::decay(1).
#pragma once

#include <cstdint>
#include <vector>

#include "tierstore/store/auto_core.hpp"
#include "tierstore/store/replay.hpp"

namespace tierstore {

// A read group's keys in ascending order with their counts (the live face's order: it breaks
// the shadows' ranking ties), as AutoCore::access takes them: `keys` / `counts` (null: all
// 1) are repointed at sorted copies unless already ascending. Both auto replays use it.
class AscendingGroup {
 public:
  void sort(const int64_t*& keys, const int64_t*& counts, int64_t n);

 private:
  std::vector<int64_t> idx_, keys_, counts_;
};

// Replays `trace` through `core` (its experts' state, scores and leader updated in place,
// as the live store's calls would leave them) into the real tier: `resident` (n_keys
// flags, updated) holding `n_resident` keys (updated) of `slots`; `filter`: auto's
// admission (the leader's filter, misses ranked by the leader) applies, false = every
// miss admitted. hit as replay_demand. Throws std::out_of_range on a key outside the core.
ReplayCounts replay_auto(AutoCore& core, bool* resident, int64_t& n_resident,
                         const ReplayTrace& trace, int64_t slots, bool filter, bool* hit);

}  // namespace tierstore
