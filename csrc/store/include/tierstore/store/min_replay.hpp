// Belady's MIN replayed natively (the simulator's ceilings `belady` and `belady_skip`:
// tierstore/sim/belady.py's policies through sim/demand.py's demand loop ran ~0.2 M
// accesses/s, the slowest model of a default `tierstore bench hits`). The same decisions,
// bit for bit (tests/test_native_min.py compares hits, reads, evictions, rejections and
// the final state with the Python loop on many traces):
//   order     coldest first by (next use descending, key ascending): BeladyPolicy's
//             primary -next with DensePolicy's key tie-break
//   fill      free slots first, then the coldest unpinned resident keys paired in order
//             (policies/fill.py plan_fill); a group that hit protects its own keys
//   skip      (`belady_skip`) more misses than free slots rank soonest next use first,
//             stable (BeladyPolicy.rank), and a candidate displaces its victim only
//             when it is used again strictly sooner (BeladySkipPolicy.admit)
// The oracle is per access: next_use[i] is when key keys[i] is read again
// (sim/counting.py Prepared.next_use), set as each group reads.
#pragma once

#include <cstdint>

#include "tierstore/store/replay.hpp"

namespace tierstore {

// Replays `trace` with `slots` slots under MIN. `next` (n_keys, the policy's next-use
// array) and `resident` (n_keys) are the caller's, updated in place as the Python policy
// would leave them; both start as the fresh policy's (every next `never`, nothing
// resident). hit[i] = keys[i] was resident when its group read. Throws
// std::out_of_range on a key outside [0, n_keys).
ReplayCounts replay_min(const ReplayTrace& trace, const int64_t* next_use, int64_t n_keys,
                        int64_t slots, bool skip, int64_t* next, bool* resident, bool* hit);

}  // namespace tierstore
