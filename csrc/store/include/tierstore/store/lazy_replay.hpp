// Lazy promotion replayed in one native loop: tierstore/sim/demand.py replay_lazy, step for
// step (its Python loop is the oracle; tests/test_native_lazy.py compares the two). Misses are
// not read (served elsewhere: unserved); once per tick a background pass promotes up to `cap`
// candidates, each over a victim only when hotter than it (admission.py HotterThanVictim):
//   seen     the tick's misses, after the tick's decay; the admitted take the coldest
//            victims, the tick's own keys included (the live store's step())
//   hottest  the hottest non-resident keys by the policy's scores, before the decay, never
//            over a key the tick used (vLLM-Moet's reference manager)
#pragma once

#include <cstdint>
#include <vector>

#include "tierstore/store/policy.hpp"
#include "tierstore/store/replay.hpp"

namespace tierstore {

// sim/demand.py hottest_nonresident: the n non-resident keys of highest policy_score > 0,
// ties to the lower key id, in ascending key order.
void hottest_nonresident(const PolicyView& p, int64_t n, std::vector<int64_t>& out);

struct LazyReplayCounts {
  int64_t demand_reads = 0, evictions = 0, rejected = 0, unserved = 0;
};

// Over one policy (any kind of policy.hpp), its arrays updated in place; `tr`'s groups are
// its ticks (every group ends one). hit[i] = keys[i] was resident when its tick read.
// Throws std::out_of_range on a key outside [0, n_keys), std::invalid_argument on a view
// missing an array its kind needs.
LazyReplayCounts replay_lazy(PolicyView& policy, const ReplayTrace& tr, int64_t slots,
                             int64_t cap, bool hottest, bool* hit);

}  // namespace tierstore
