// Demand fill under a policy plus the prefetcher (prefetcher.hpp), replayed at layer
// granularity in one native loop: tierstore/sim/prefetching.py's replay_prefetching, step
// for step (its Python loop is the oracle; tests/test_prefetch_native.py compares the two).
// Per (tick, layer) group: hits counted (a prefetched key's first read is a prefetch hit),
// the accesses reach the policy, the prefetcher learns and proposes (victims answered by
// the tier's order), the proposal's fetch is placed over the policy's victims (no admission
// filter; the prefetcher's holds and the group pinned), then the group's misses are
// demand-filled with the policy's own filter (or counted unserved). Untimed lead time only.
#pragma once

#include <cstdint>

#include "tierstore/store/auto_core.hpp"
#include "tierstore/store/policy.hpp"
#include "tierstore/store/prefetcher.hpp"
#include "tierstore/store/replay.hpp"

namespace tierstore {

struct PrefetchReplayCounts {
  int64_t demand_reads = 0, evictions = 0, rejected = 0;
  int64_t prefetched = 0, prefetch_hits = 0, wasted = 0, unserved = 0;
};

// Over one policy (lru / heat / hybrid / phase / blend), its arrays updated in place.
// `filter`: the policy's admission filter on demand fills; `demand_fill` false: misses are
// not read (unserved). Throws std::invalid_argument unless the prefetcher covers the
// policy's keys with >= 2 layers, std::out_of_range on a key outside them.
PrefetchReplayCounts replay_prefetch(PolicyView& policy, Prefetcher& pf, const ReplayTrace& tr,
                                     int64_t slots, bool filter, bool demand_fill, bool* hit);

// Over auto's core, the real tier following its leader (auto_replay.hpp), the real resident
// mask and count updated in place.
PrefetchReplayCounts replay_prefetch_auto(AutoCore& core, bool* resident, int64_t& n_resident,
                                          Prefetcher& pf, const ReplayTrace& tr, int64_t slots,
                                          bool filter, bool demand_fill, bool* hit);

// sim/predict.py's `predict` model (demand fill under a plain policy plus prefetch of the
// next layer's experts predicted by `model` at or above `threshold`, at most `budget` rows a
// tick handed out as budget / n_layers per layer with carry-over), step for step. `top_k`:
// the routings per token the model scores with. `demand_fill` false: its `prefetch` model
// (misses unserved; at each tick end a lazy pass of up to kLazyPerTick of the hottest
// non-resident keys with the tick's unused budget, under the policy's own filter, never over
// a key the tick used). Its Python loop is the oracle (tests/test_prefetch_native.py).
struct PredictParams {
  int64_t budget = 8;
  double threshold = 0.2;
  bool cross = true, temporal = true;
  int64_t top_k = 1;
  bool demand_fill = true;
};
constexpr int64_t kLazyPerTick = 8;  // sim/predict.py LAZY_PER_TICK: the reference's promotions a pass
PrefetchReplayCounts replay_predict(PolicyView& policy, CoRouting& model, const ReplayTrace& tr,
                                    int64_t slots, bool filter, const PredictParams& params,
                                    bool* hit);

}  // namespace tierstore
